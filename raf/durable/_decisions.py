"""Decisions for a durable run: found by the pending call's ``run_id``, sent with ``DBOS.send``.

The decider claims the calls in the session (the store's atomic claim: of
two deciders of one call, one gets it, the other an ApprovalError), sends
them to the run and waits for the event of that pass's answer.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import anyio
from dbos import DBOS

from raf._agent.approvals import Decision, claim_decided, not_pending
from raf._errors import DurableError
from raf._sessions.base import Session
from raf._values.messages import AgentResponse
from raf.durable._workflow import TOPIC, Delivery, outcome_key

__all__: list[str] = []

#: The statuses of a workflow that has not ended.
LIVE: Final = ("PENDING", "ENQUEUED")
#: How often a waiting decider looks whether the run ended without taking its decisions.
_POLL: Final = 1.0


async def waiting_run(session: Session, decisions: tuple[Decision, ...]) -> str | None:
    """The id of the live run that waits for these decisions' calls, if one does.

    Raises :class:`raf.ApprovalError` for a token that matches no pending call.
    """
    pending = {call.token: call for call in await session.list_pending()}
    tokens = [decision.token for decision in decisions]
    if not set(tokens) <= pending.keys():
        raise not_pending(session, tokens, tuple(pending.values()))
    run_id = pending[tokens[0]].run_id
    if run_id is None:
        return None
    status = await DBOS.get_workflow_status_async(run_id)
    return run_id if status is not None and status.status in LIVE else None


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
    return await _outcome(run_id, delivery.message_id), delivery


async def _outcome(run_id: str, message_id: str) -> AgentResponse | None:
    key = outcome_key(message_id)
    while True:
        value = await DBOS.get_event_async(run_id, key, timeout_seconds=_POLL)
        if value is not None:
            return value  # type: ignore[no-any-return]
        status = await DBOS.get_workflow_status_async(run_id)
        if status is not None and status.status in LIVE:
            continue
        value = await DBOS.get_event_async(run_id, key, timeout_seconds=0)
        if value is not None:  # published just before the run ended
            return value  # type: ignore[no-any-return]
        if status is not None and status.status == "ERROR":
            handle: Any = await DBOS.retrieve_workflow_async(run_id)
            await handle.get_result()  # raises the error that ended the run
        if await _received(run_id, message_id):
            # It took them, then was cancelled in the middle of that pass: running them
            # here would run an approved call a second time.
            raise DurableError(
                f"the run {run_id!r} was cancelled while it applied these decisions: their "
                "calls are answered in the session (with their result if it came, else as "
                "interrupted) and are not run again; send a message to go on"
            )
        return None


async def _received(run_id: str, message_id: str) -> bool:
    """Whether the run took the delivery ``message_id`` (its recv recorded it)."""
    for step in await DBOS.list_workflow_steps_async(run_id):
        output = step["output"]
        if isinstance(output, Delivery) and output.message_id == message_id:
            return True
    return False
