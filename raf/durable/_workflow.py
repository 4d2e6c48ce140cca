"""The workflow of a durable run, ``raf.durable.run``: the pipeline, then a ``DBOS.recv`` loop.

Its model calls and tool calls are the steps ``raf.model`` and
``raf.tool.NAME``. Its DBOS stream ``raf.updates`` carries the updates its
caller follows and, while it waits for decisions, each delivery it took
(:class:`Taken`) and each pass's :class:`Answer`, which the decider follows.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Final, cast

import attrs
from dbos import DBOS

from raf._agent.agent import Agent
from raf._agent.deferred import Decision
from raf._agent.tool_loop import ToolRequest
from raf._onion.compose import CallNext
from raf._sessions.base import Claimed, Session
from raf._sessions.memory import InMemorySession
from raf._values.context import ChatRequest, Invocation
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import AgentRunOptions
from raf._values.run import KEY_SCOPE, Run
from raf.durable._sessions import SessionRef, WrittenOnce
from raf.errors import DurableError

__all__: list[str] = []


#: The agents of this process's durable agents, by name: what a recovered workflow runs.
AGENTS: dict[str, Agent] = {}

#: The topic a decision (or the empty message that ends a wait) is sent on.
TOPIC: Final = "raf.approval"
#: The stream of the run's updates, and of its answers while it waits.
UPDATES: Final = "raf.updates"
#: The event set once the run waits for decisions (a caller who leaves then does not cancel).
WAITING: Final = "raf.waiting"
#: How often a reader of the stream looks for more (on SQLite, which notifies no reader).
STREAM_POLL: Final = 0.02


@attrs.frozen
class Delivery:
    """Decisions sent to the run that waits for them: the calls they claimed (in the deciding
    process) with those still pending, and an id for the answer."""

    message_id: str
    decisions: tuple[Decision, ...]
    claimed: Claimed


@attrs.frozen
class Taken:
    """In the stream: the run took the delivery ``message_id`` and applies it now."""

    message_id: str


@attrs.frozen
class Answer:
    """In the stream: what a pass of the waiting run returned; ``message_id`` is the delivery's
    (``None``: the first pass, which left calls pending)."""

    response: AgentResponse
    message_id: str | None = None


@attrs.define
class _Batch:
    """The step ids of the tool calls the last model call asked for, by call id.

    The calls of a batch run concurrently and may enter the tool stack in
    any order: their step ids are drawn (``DBOS.reserve_step``) as the model
    call returns, in the order of its answer, so a replay gives each call
    the same step. (A call that is not run, one that waits for approval,
    leaves a gap in the step ids: DBOS allows it.)
    """

    steps: dict[str, Any] = attrs.Factory(dict)
    #: How many model calls the pass made (0: it stalled, or it only waits).
    model_calls: int = 0


#: Where a pass keeps its batch: the run's own state (``Run.state``), read by the steps.
BATCH: Final = "raf.durable.batch"


def _batch(invocation: Invocation | None) -> _Batch | None:
    """The batch of the pass ``invocation`` belongs to (``None`` outside a durable pass)."""
    if invocation is None:
        return None
    batch = invocation.run.state.get(BATCH)
    return batch if isinstance(batch, _Batch) else None


async def live(run_id: str) -> bool:
    """Whether the workflow ``run_id`` exists and has not ended."""
    status = await DBOS.get_workflow_status_async(run_id)
    return status is not None and status.status in ("PENDING", "ENQUEUED")


def _agent(name: str) -> Agent:
    agent = AGENTS.get(name)
    if agent is None:
        raise DurableError(
            f"no durable agent named {name!r} in this process: build it with "
            "raf.durable.dbos_agent(agent, name=...) before DBOS.launch()"
        )
    return agent


@DBOS.workflow(name="raf.durable.run")
async def durable_run(
    agent_name: str,
    request: tuple[ChatMessage, ...],
    ref: SessionRef | None,
    options: AgentRunOptions,
    approval_timeout: float,
    streams: bool,
    decisions: tuple[Decision, ...] = (),
    claimed: Claimed | None = None,
    key_scope: str = "",
) -> AgentResponse:
    """The workflow of one durable run: a pass of the pipeline, then the wait for decisions.

    It waits up to ``approval_timeout`` seconds for each decision (0, or
    no session: it does not wait). ``decisions`` resume calls that wait
    (``claimed``: the calls they claimed already). ``streams``: its caller
    follows the updates (a caller of decisions follows the stream, to its
    first answer, in any case). ``key_scope``: the served caller's key scope, put
    on each pass's run (last, with a default: a workflow recorded before it recovers).
    """
    run_id = DBOS.workflow_id
    assert run_id is not None  # inside a workflow
    # Always reopened from the reference: the caller may leave (and close its store)
    # while the run goes on.
    async with ref.reopened() if ref else nullcontext(InMemorySession()) as opened:
        session = WrittenOnce(opened, run_id, claimed)
        run = _Run(
            _agent(agent_name),
            session,
            options,
            streams,
            approval_timeout if ref else 0,
            key_scope=key_scope,
        )
        response, _ = await run.once(decisions or request)
        parts = [response]
        if response.pending and run.approval_timeout:
            await DBOS.write_stream_async(UPDATES, Answer(response))
            parts += await run.wait()
    if streams or decisions:  # its caller reads the stream: it ends now, not at a status poll
        await DBOS.close_stream_async(UPDATES)
    return merged(parts)


@attrs.frozen
class _Run:
    """A durable run as its passes see it: ``streams``, its caller follows the updates;
    ``approval_timeout`` 0, it does not wait."""

    agent: Agent
    session: WrittenOnce
    options: AgentRunOptions
    streams: bool
    approval_timeout: float
    #: The served caller's key scope (``""``: none), on each pass's run.
    key_scope: str = attrs.field(default="", kw_only=True)
    #: The pass's "approval" updates, held until it has stored its pending calls (so a
    #: decision sent on seeing one finds its call).
    held: list[Update] = attrs.Factory(list)

    async def publish(self, update: Update) -> None:
        """A pass's ``on_update``: each update into the stream, the ``"approval"`` ones held."""
        if update.kind == "approval":
            self.held.append(update)
        else:
            await DBOS.write_stream_async(UPDATES, update)

    async def wait(self) -> list[AgentResponse]:
        """A pass with each delivery received, until the run stops waiting: their answers."""
        parts: list[AgentResponse] = []
        while True:
            delivery = await DBOS.recv_async(TOPIC, timeout_seconds=self.approval_timeout)
            if not isinstance(delivery, Delivery):
                return parts  # none came in time, or its caller left, or its calls were denied
            await DBOS.write_stream_async(UPDATES, Taken(delivery.message_id))
            self.session.claimed = delivery.claimed
            response, model_calls = await self.once(delivery.decisions)
            await DBOS.write_stream_async(UPDATES, Answer(response, delivery.message_id))
            parts.append(response)
            # A pass that neither left calls pending nor called the model stalled: another
            # call of the turn was claimed by another decider, whose decision is on its way.
            if not response.pending and model_calls:
                return parts

    async def once(
        self, turn: tuple[ChatMessage, ...] | tuple[Decision, ...]
    ) -> tuple[AgentResponse, int]:
        """The agent's pipeline once, its updates published: its response and its model calls."""
        session = self.session
        batch = _Batch()
        # The run's own object carries the batch to the steps: no context variable does.
        run = Run(self.publish if self.streams else None)
        run.state[BATCH] = batch
        if self.key_scope:
            run.state[KEY_SCOPE] = self.key_scope
        try:
            # The pre stages are not steps: they run again on recovery, where the request hash
            # was recorded already (Invocation.repeated is true).
            response = await self.agent.run(
                turn, session=cast("Session", session), options=self.options, on_update=run
            )
        finally:
            # The runs whose calls this pass denied (a new message) stop waiting for them.
            for superseded in sorted(session.superseded):
                if await live(superseded):
                    await DBOS.send_async(superseded, None, TOPIC)
            session.superseded.clear()
        if response.pending and self.approval_timeout:
            # Set before the "approval" updates go out: a caller that saw one and leaves does
            # not cancel the run, whose recv may hold a decision sent meanwhile.
            await DBOS.set_event_async(WAITING, True)
        for update in self.held:
            await DBOS.write_stream_async(UPDATES, update)
        self.held.clear()
        return response, batch.model_calls


def merged(parts: list[AgentResponse]) -> AgentResponse:
    """The responses of a run's passes as one: every message, the summed usage, the last rest."""
    if len(parts) == 1:
        return parts[0]
    usage = None
    for part in parts:
        if part.usage is not None:
            usage = part.usage if usage is None else usage + part.usage
    messages = tuple(message for part in parts for message in part.messages)
    return attrs.evolve(parts[-1], messages=messages, usage=usage)


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

    response = await DBOS.run_step_async({"name": "raf.model", "preemptible": True}, model)
    batch = _batch(request.invocation)
    if batch is not None:
        batch.steps = {call.id: DBOS.reserve_step() for call in response.tool_calls}
        batch.model_calls += 1
    return response


async def tool_step(request: ToolRequest, call_next: Any) -> ChatMessage:
    """The innermost tool middleware: the tool call is the step ``raf.tool.NAME``."""

    async def tool() -> ChatMessage:
        return cast("ChatMessage", await call_next(request))

    # Preemptible: a run its caller cancelled stops its tools, not only at the next step.
    options: Any = {"name": f"raf.tool.{request.tool.name}", "preemptible": True}
    batch = _batch(request.invocation)
    reserved = None if batch is None else batch.steps.pop(request.call.id, None)
    if reserved is None:
        # Not from the last answer (a middleware made it up), or called on twice (a retry).
        return await DBOS.run_step_async(options, tool)
    return cast("ChatMessage", await reserved.run_async(options, tool))
