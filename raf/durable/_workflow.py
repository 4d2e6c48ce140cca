"""The workflows of a durable run: one pass of the pipeline, and the wait for approvals.

``raf.durable.run`` runs the agent's pipeline once, its model calls and tool
calls as the steps ``raf.model`` and ``raf.tool.NAME``. When that pass ends
with calls waiting for approval, it starts ``raf.durable.wait`` (id
``"{run id}.wait"``), which waits for the decisions with ``DBOS.recv`` and
runs the pipeline again with each (the loop goes on), until nothing waits
or the wait times out. Decisions find the wait through one tiny workflow per
waiting call, ``raf.approval.{token}.{wait id}`` (see ``_decisions.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Final, cast

import attrs
from dbos import DBOS, SetWorkflowID

from raf._agent.approvals import Decision
from raf._agent.streamed import STREAMED_RUN
from raf._agent.tool_loop import ToolRequest
from raf._errors import DurableError, StreamClosedError
from raf._onion.compose import CallNext
from raf._sessions.base import Claimed, Session
from raf._sessions.memory import InMemorySession
from raf._values.context import ChatRequest, start_invocation
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate, PendingCall, Update
from raf._values.options import AgentRunOptions
from raf.durable._sessions import SessionRef, WrittenOnce

if TYPE_CHECKING:
    from raf.durable._agent import DurableAgent

__all__: list[str] = []

#: The durable agents of this process, by name: what a recovered workflow runs.
AGENTS: dict[str, DurableAgent] = {}

#: The topic a decision is sent on to the workflow that waits for it.
TOPIC: Final = "raf.approval"


@attrs.define
class Caller:
    """What a run started in this process hands its workflows: nothing of it is pickled."""

    on_update: OnUpdate | None
    session: Session | None
    #: Whether the caller waits for the decisions when its run's calls wait (a run started
    #: with messages does; one started by decisions returns at once, as a plain one does).
    waits: bool = True
    workflow_id: str | None = None
    #: The id of the wait this caller's run started (its pass ended with calls pending).
    wait_id: str | None = None
    #: Its DBOS handle, once started.
    wait: Any = None
    #: The ``"approval"`` updates of the run's pass, held for the caller to send once the
    #: pass returned (outside the workflow: a stream closed then is the caller's to handle).
    held: _HeldApprovals | None = None
    #: The tokens of the calls another run left waiting that this run's new message denied:
    #: their waits are woken, so their callers do not wait for decisions that cannot come.
    superseded: tuple[str, ...] = ()
    #: Whether the caller has left: its wait sends it nothing more.
    left: bool = False


CALLER: ContextVar[Caller | None] = ContextVar("raf_durable_caller", default=None)


@attrs.frozen
class Delivery:
    """Decisions on their way to the workflow that waits for them: the calls they claimed
    (in the deciding process) and those still pending, and an id for the answer."""

    message_id: str
    decisions: tuple[Decision, ...]
    claimed: Claimed


def outcome_key(message_id: str) -> str:
    """The DBOS event under which the wait publishes what a delivery's pass returned."""
    return f"raf.outcome.{message_id}"


def pointer_prefix(token: str) -> str:
    """The id prefix of the workflows that say which wait a pending call's token waits in."""
    return f"raf.approval.{token}."


@attrs.define
class _Batch:
    """The tool calls the run's last model call asked for, and their step ids once drawn.

    The calls of a batch run concurrently, and may enter the tool stack in
    any order (a middleware may await first): their step ids are drawn all
    at once, when the first one enters, and given out by position in the
    model's answer, so a replay gives each call the same step.
    """

    calls: tuple[str, ...] = ()
    steps: dict[str, Any] | None = None
    #: How many model calls the pass made (0: it stalled, or it only waits).
    model_calls: int = 0


_BATCH: ContextVar[_Batch | None] = ContextVar("raf_durable_batch", default=None)


class _HeldApprovals:
    """The caller's ``on_update``, its ``"approval"`` updates held until the pass has stored
    its pending calls (and made their pointers): a decision sent on seeing one finds its call.

    A plain run sends them as the calls are asked for, and its caller decides after the
    run returned; a durable run's caller decides while the run waits.
    """

    def __init__(self, on_update: OnUpdate) -> None:
        self.on_update = on_update
        self.held: list[Update] = []

    async def __call__(self, update: Update) -> None:
        if update.kind == "approval":
            self.held.append(update)
        else:
            await self.on_update(update)

    async def release(self) -> None:
        held, self.held = self.held, []
        for update in held:
            await self.on_update(update)


class _Forward:
    """The caller's ``on_update`` as its wait calls it: nothing once the caller has left."""

    def __init__(self, on_update: OnUpdate, caller: Caller) -> None:
        self.on_update = on_update
        self.caller = caller

    async def __call__(self, update: Update) -> None:
        if self.caller.left:
            return
        try:
            await self.on_update(update)
        except StreamClosedError:  # its stream closed: it is leaving
            self.caller.left = True


def _agent(name: str) -> DurableAgent:
    agent = AGENTS.get(name)
    if agent is None:
        raise DurableError(
            f"no durable agent named {name!r} in this process: build it with "
            "raf.durable.dbos_agent(agent, name=...) before DBOS.launch()"
        )
    return agent


def _attached(workflow_id: str, caller: Caller | None) -> tuple[OnUpdate | None, Session | None]:
    """The caller's ``on_update`` and session, when the caller started this workflow; a
    recovered workflow (or one DBOS started) has none, and reopens the session."""
    if caller is None:
        return None, None
    if caller.workflow_id is None:
        caller.workflow_id = workflow_id
        return caller.on_update, caller.session
    return None, None


@asynccontextmanager
async def _opened(session: Session | None, ref: SessionRef | None) -> AsyncIterator[Session]:
    if session is not None:
        yield session
    elif ref is None:
        yield InMemorySession()
    else:
        async with ref.reopened() as reopened:
            yield reopened


@DBOS.workflow(name="raf.durable.approval")
async def _pointer(wait_id: str) -> str:
    """Says which wait a pending call waits in: its id holds the call's token and the wait's."""
    return wait_id


class _Pointers:
    """Makes the pointer of each call that is to wait in ``wait_id``, once, before it waits."""

    def __init__(self, wait_id: str) -> None:
        self.wait_id = wait_id
        self.made: set[str] = set()

    async def __call__(self, pending: tuple[PendingCall, ...]) -> None:
        for call in pending:
            if call.token not in self.made:
                self.made.add(call.token)
                with SetWorkflowID(pointer_prefix(call.token) + self.wait_id):
                    await _pointer(self.wait_id)


@DBOS.workflow(name="raf.durable.run")
async def durable_run(
    agent_name: str,
    request: tuple[ChatMessage, ...],
    ref: SessionRef | None,
    options: AgentRunOptions,
    decisions: tuple[Decision, ...] = (),
    claimed: Claimed | None = None,
) -> AgentResponse:
    """The workflow: one pass of a durable agent's pipeline, from the request to the post stages.

    ``decisions`` resume calls that wait (``claimed``: the calls they
    claimed already). A pass that ends with calls pending starts the wait
    for them (when the session can be reopened and the agent waits at all).
    """
    agent = _agent(agent_name)
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None  # inside a workflow
    caller = CALLER.get()
    on_update, session = _attached(workflow_id, caller)
    waits = ref is not None and agent.approval_timeout > 0
    wait_id = f"{workflow_id}.wait"
    pointers = _Pointers(wait_id) if waits else None
    held = _HeldApprovals(on_update) if on_update is not None and waits else None
    async with _opened(session, ref) as opened:
        written = WrittenOnce(opened, workflow_id, pointers)
        if claimed is not None:
            written.hand_over(claimed)
        try:
            response = await run_pass(
                agent, written, request, options, held or on_update, decisions
            )
        finally:  # their waits are woken even when this pass fails
            if caller is not None and caller.workflow_id == workflow_id:
                caller.superseded = written.superseded
    if response.pending and pointers is not None and ref is not None:
        await pointers(response.pending)  # the calls still waiting from before wait there too
        if caller is not None and caller.workflow_id == workflow_id and caller.waits:
            caller.wait_id = wait_id  # before the wait starts: it streams to this caller
        with SetWorkflowID(wait_id):
            handle = await DBOS.start_workflow_async(
                wait_for_decisions, agent_name, ref, options, agent.approval_timeout
            )
        if caller is not None and caller.wait_id == wait_id:
            caller.wait = handle
    if held is not None and caller is not None:
        caller.held = held  # sent by the caller once this returned
    return response


@DBOS.workflow(name="raf.durable.wait")
async def wait_for_decisions(
    agent_name: str, ref: SessionRef, options: AgentRunOptions, seconds: float
) -> AgentResponse | None:
    """The workflow that waits for decisions (``DBOS.recv``) and runs a pass with each.

    Each pass's response is published as the event ``raf.outcome.{id}`` for
    the process that sent the decisions. Returns the passes' responses as
    one (``None`` if none came): when nothing waits any more, or when no
    decision came within ``seconds`` (DBOS keeps that deadline
    across a recovery), with the calls still pending then.
    """
    agent = _agent(agent_name)
    wait_id = DBOS.workflow_id
    assert wait_id is not None  # inside a workflow
    # The caller that waits for this wait, when it runs in this process (not recovered).
    caller = CALLER.get()
    mine = caller if caller is not None and caller.wait_id == wait_id else None
    # The wait's passes are its own, not part of its caller's stream: a caller that leaves
    # while a decision is applied lets the pass finish (for the decider), and hears no more.
    STREAMED_RUN.set(None)  # this workflow's own task: nothing to reset
    held = None
    if mine is not None and mine.on_update is not None:
        held = _HeldApprovals(_Forward(mine.on_update, mine))
    parts: list[AgentResponse] = []
    # Its session is reopened from the reference, never the caller's object: the caller
    # may leave (and close its store) while the wait applies a decision.
    async with ref.reopened() as opened:
        written = WrittenOnce(opened, wait_id, _Pointers(wait_id))
        while True:
            delivery = await DBOS.recv_async(TOPIC, timeout_seconds=seconds)
            if not isinstance(delivery, Delivery):
                break  # None: no decision came in time
            written.hand_over(delivery.claimed)
            batch = _Batch()
            response = await run_pass(agent, written, (), options, held, delivery.decisions, batch)
            if held is not None:
                await held.release()
            await DBOS.set_event_async(outcome_key(delivery.message_id), response)
            parts.append(response)
            # A pass that neither left calls pending nor called the model stalled: another
            # call of the turn was claimed by another decider, whose decision is on its way.
            if not response.pending and batch.model_calls:
                break
    return merged(parts) if parts else None


def merged(parts: list[AgentResponse]) -> AgentResponse:
    """The responses of a run's passes as one: every message, the summed usage, the last rest."""
    if len(parts) == 1:
        return parts[0]
    usages = [part.usage for part in parts if part.usage is not None]
    usage = None
    for part_usage in usages:
        usage = part_usage if usage is None else usage + part_usage
    messages = tuple(message for part in parts for message in part.messages)
    return attrs.evolve(parts[-1], messages=messages, usage=usage)


async def run_pass(
    agent: DurableAgent,
    session: WrittenOnce,
    request: tuple[ChatMessage, ...],
    options: AgentRunOptions,
    on_update: OnUpdate | None,
    decisions: tuple[Decision, ...],
    batch: _Batch | None = None,
) -> AgentResponse:
    """The agent's pipeline once, on ``session``, with the steps' batch bookkeeping (in
    ``batch`` when given: the caller reads it after)."""
    # The pre stages are not steps: they run again on recovery, where the request hash
    # was recorded already (Invocation.repeated is true).
    touched = await session.touch_request_hash(request)
    invocation = start_invocation(
        agent,
        cast("Session", session),
        request,
        options,
        touched.digest,
        touched.repeated,
        on_update,
        decisions,
    )
    token = _BATCH.set(_Batch() if batch is None else batch)
    try:
        return await agent._run(invocation)
    finally:
        _BATCH.reset(token)


def idempotency_key() -> str | None:
    """The id of the DBOS step running now, ``"{workflow_id}:{step_id}"``; ``None`` outside one.

    A tool of a durable agent reads it to make its effect happen once: a
    tool call that was running when its worker died runs again on recovery,
    with the same key (send it as an ``Idempotency-Key`` header, or store it
    with what the tool wrote and skip a write whose key is there).
    """
    workflow_id, step_id = DBOS.workflow_id, DBOS.step_id
    if workflow_id is None or step_id is None:
        return None
    return f"{workflow_id}:{step_id}"


async def model_step(request: ChatRequest, call_next: CallNext[ChatRequest]) -> AgentResponse:
    """The innermost chat middleware: the model call is the step ``raf.model``."""

    async def model() -> AgentResponse:
        return await call_next(request)

    response = await DBOS.run_step_async({"name": "raf.model"}, model)
    batch = _BATCH.get()
    if batch is not None:
        batch.calls, batch.steps = tuple(call.id for call in response.tool_calls), None
        batch.model_calls += 1
    return response


async def tool_step(request: ToolRequest, call_next: Any) -> ChatMessage:
    """The innermost tool middleware: the tool call is the step ``raf.tool.NAME``."""

    async def tool() -> ChatMessage:
        return cast("ChatMessage", await call_next(request))

    options: Any = {"name": f"raf.tool.{request.tool.name}"}
    batch = _BATCH.get()
    reserved = None
    if batch is not None and request.call.id in batch.calls:
        if batch.steps is None:  # the batch's first call to get here: draw them all, in order
            batch.steps = {call: DBOS.reserve_step() for call in dict.fromkeys(batch.calls)}
        reserved = batch.steps.pop(request.call.id, None)
    if reserved is None:
        # Not from the last answer (a middleware made it up), or called on twice (a retry):
        # the next step id.
        return await DBOS.run_step_async(options, tool)
    return cast("ChatMessage", await reserved.run_async(options, tool))
