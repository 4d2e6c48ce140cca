"""Decisions for a durable run: sent to the workflow that waits for them, from any process.

A decision's token leads to the wait that holds its call through the
pointer workflow ``raf.approval.{token}.{wait id}`` (the newest one, for a
token used again). The deciding process claims the calls in the session
(the store's atomic claim: of two processes deciding one call, one gets
it, the other an :class:`raf.ApprovalError`), sends the decisions and the
claimed calls with ``DBOS.send``, and waits for the event under which the
wait publishes what that pass returned.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import anyio
from dbos import DBOS

from raf._agent.approvals import Decision, claim_decided
from raf._errors import DurableError
from raf._sessions.base import Session
from raf._values.messages import AgentResponse
from raf.durable._workflow import TOPIC, Delivery, outcome_key, pointer_prefix

__all__: list[str] = []

#: The statuses of a workflow that has not ended.
_LIVE: Final = ("PENDING", "ENQUEUED")
#: How often a waiting decider looks whether the wait ended without taking its decisions.
_POLL: Final = 1.0


async def waiting_in(token: str) -> str | None:
    """The id of the wait that holds the call of ``token``, if one is waiting (not ended)."""
    prefix = pointer_prefix(token)
    while True:
        found = await DBOS.list_workflows_async(
            workflow_id_prefix=prefix, sort_desc=True, limit=1, load_input=False, load_output=False
        )
        if not found:
            return None
        wait_id = found[0].workflow_id[len(prefix) :]
        # The pointer is made before the call is recorded, the wait before the run's pass
        # returns: the run is read first, so a run that has ended shows its wait, if any.
        run = await DBOS.get_workflow_status_async(wait_id.removesuffix(".wait"))
        status = await DBOS.get_workflow_status_async(wait_id)
        if status is not None:
            return wait_id if status.status in _LIVE else None
        if run is None or run.status not in _LIVE:
            return None
        await anyio.sleep(0.02)  # the run goes on: its wait is on its way


async def wake(tokens: tuple[str, ...]) -> None:
    """End the waits that hold the calls of ``tokens`` (a new message denied those calls).

    Each gets the empty message a wait that timed out receives: it ends now, its caller
    gets its response (with the calls pending as when it paused), nothing of it runs.
    A wait that has not started yet is not waited for: it times out.
    """
    woken: set[str] = set()
    for token in dict.fromkeys(tokens):
        prefix = pointer_prefix(token)
        found = await DBOS.list_workflows_async(
            workflow_id_prefix=prefix, sort_desc=True, limit=1, load_input=False, load_output=False
        )
        wait_id = found[0].workflow_id[len(prefix) :] if found else None
        if wait_id is None or wait_id in woken:
            continue
        status = await DBOS.get_workflow_status_async(wait_id)
        if status is not None and status.status in _LIVE:
            woken.add(wait_id)
            await DBOS.send_async(wait_id, None, TOPIC)


async def deliver(
    wait_id: str, session: Session, decisions: tuple[Decision, ...]
) -> tuple[AgentResponse | None, Delivery]:
    """Claim the decided calls, send them to the wait, and wait for what its pass returns.

    ``None`` (with the delivery) when the wait ended without taking them (it
    timed out or was cancelled just then): the caller runs them itself.
    Raises :class:`raf.ApprovalError` (nothing claimed, nothing sent) for a
    token that matches no pending call, and the run's error when the wait
    failed.
    """
    # Shielded: calls claimed and not sent would wait, taken, until the wait times out.
    with anyio.CancelScope(shield=True):
        claimed = await claim_decided(session, decisions)
        delivery = Delivery(uuid.uuid4().hex, decisions, claimed)
        await DBOS.send_async(wait_id, delivery, TOPIC)
    return await _outcome(wait_id, delivery.message_id), delivery


async def _outcome(wait_id: str, message_id: str) -> AgentResponse | None:
    key = outcome_key(message_id)
    while True:
        value = await DBOS.get_event_async(wait_id, key, timeout_seconds=_POLL)
        if value is not None:
            return value  # type: ignore[no-any-return]
        status = await DBOS.get_workflow_status_async(wait_id)
        if status is not None and status.status in _LIVE:
            continue
        value = await DBOS.get_event_async(wait_id, key, timeout_seconds=0)
        if value is not None:  # published just before the wait ended
            return value  # type: ignore[no-any-return]
        if status is not None and status.status == "ERROR":
            handle: Any = await DBOS.retrieve_workflow_async(wait_id)
            await handle.get_result()  # raises the error that ended the run
        if await _received(wait_id, message_id):
            # It took them, then was cancelled in the middle of that pass: running them
            # here would run an approved call a second time.
            raise DurableError(
                f"the run waiting in {wait_id!r} was cancelled while it applied these "
                "decisions: their calls are answered in the session (with their result if it "
                "came, else as interrupted) and are not run again; send a message to go on"
            )
        return None


async def _received(wait_id: str, message_id: str) -> bool:
    """Whether the wait took the delivery ``message_id`` (its recv recorded it)."""
    for step in await DBOS.list_workflow_steps_async(wait_id):
        output = step["output"]
        if isinstance(output, Delivery) and output.message_id == message_id:
            return True
    return False
