"""Decisions for a durable run: found by the pending call's ``run_id``, sent with ``DBOS.send``.

The decider claims the calls in the session (the store's atomic claim: of
two deciders of one call, one gets it, the other an ApprovalError), sends
them to the run and follows the run's stream to the answer of that pass.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
from dbos import DBOS

from raf._agent.approvals import Decision, claim_decided, not_pending
from raf._errors import DurableError
from raf._sessions.base import Session
from raf._values.messages import AgentResponse
from raf.durable._workflow import STREAM_POLL, TOPIC, UPDATES, Answer, Delivery, Taken, live

__all__: list[str] = []


async def waiting_run(session: Session, decisions: tuple[Decision, ...]) -> str | None:
    """The id of the live run that waits for these decisions' calls, if one does.

    Raises :class:`raf.ApprovalError` for a token that matches no pending call.
    """
    pending = {call.token: call for call in await session.list_pending()}
    tokens = [decision.token for decision in decisions]
    if not set(tokens) <= pending.keys():
        raise not_pending(session, tokens, tuple(pending.values()))
    run_id = pending[tokens[0]].run_id
    return run_id if run_id is not None and await live(run_id) else None


async def deliver(
    run_id: str, session: Session, decisions: tuple[Decision, ...]
) -> tuple[AgentResponse | None, Delivery]:
    """Claim the decided calls, send them to the run, and wait for what its pass returns.

    ``None`` (with the delivery) when the run ended without taking them (it
    timed out or its caller left just then): the decider runs them itself.
    """
    # Shielded: calls claimed and not sent would wait, taken, until the run times out.
    with anyio.CancelScope(shield=True):
        claimed = await claim_decided(session, decisions)
        delivery = Delivery(uuid.uuid4().hex, decisions, claimed)
        await DBOS.send_async(run_id, delivery, TOPIC)
    return await outcome(run_id, delivery.message_id), delivery


async def outcome(run_id: str, message_id: str) -> AgentResponse | None:
    """What the run's pass of the delivery ``message_id`` returned, read from its stream;
    ``None`` when the run ended without taking the delivery."""
    taken = False
    async for item in DBOS.read_stream_async(run_id, UPDATES, polling_interval_sec=STREAM_POLL):
        if isinstance(item, Answer) and item.message_id == message_id:
            return item.response
        taken = taken or (isinstance(item, Taken) and item.message_id == message_id)
    status = await DBOS.get_workflow_status_async(run_id)
    if status is not None and status.status == "ERROR":
        handle: Any = await DBOS.retrieve_workflow_async(run_id)
        await handle.get_result()  # raises the error that ended the run
    if taken:
        # It took them, then was cancelled in the middle of that pass: running them
        # here would run an approved call a second time.
        raise DurableError(
            f"the run {run_id!r} was cancelled while it applied these decisions: their "
            "calls are answered in the session (with their result if it came, else as "
            "interrupted) and are not run again; send a message to go on"
        )
    return None
