"""dbos_agent: an agent whose run is a DBOS workflow and whose model and tool calls are steps."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, cast

import anyio
import attrs
from dbos import DBOS
from dbos import error as dbos_errors

from raf._agent import Agent, _arguments
from raf._approvals import Decision
from raf._context import Invocation, start_invocation
from raf._errors import DurableError
from raf._messages import AgentResponse, ChatMessage, OnUpdate
from raf._options import AgentRunOptions
from raf._pipeline import CallNext, ChatRequest
from raf._sessions.base import Session
from raf._sessions.memory import InMemorySession
from raf._streaming import AgentStream
from raf._tool_loop import ToolRequest
from raf.durable._sessions import SessionRef, WrittenOnce

__all__ = ["DurableAgent", "dbos_agent", "idempotency_key"]

#: The durable agents of this process, by name: what a recovered workflow runs.
_AGENTS: dict[str, DurableAgent] = {}


@attrs.define
class _Caller:
    """What a run started in this process hands its workflow: nothing of it is pickled."""

    on_update: OnUpdate | None
    session: Session | None
    workflow_id: str | None = None


_CALLER: ContextVar[_Caller | None] = ContextVar("raf_durable_caller", default=None)


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


_BATCH: ContextVar[_Batch | None] = ContextVar("raf_durable_batch", default=None)


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


class DurableAgent(Agent):
    """An agent whose run is a DBOS workflow (build it with :func:`dbos_agent`).

    Its chat stack ends with the step ``raf.model`` and its tool stack with
    the step ``raf.tool.NAME``; everything else is the agent it copies.
    """

    __slots__ = ("_durable_name",)

    _durable_name: str

    def __init__(self, agent: Agent, name: str) -> None:
        super().__init__(
            agent.chat_client,
            name=agent.name,
            instructions=agent.instructions,
            tools=agent.tools,
            stack=agent.stack,
            chat_stack=(*agent.chat_stack, _model_step),
            tool_stack=(*agent.tool_stack, _tool_step),
            post_timeout=agent.post_timeout,
            observers=agent.observers,
        )
        object.__setattr__(self, "_durable_name", name)

    @property
    def durable_name(self) -> str:
        """The name this agent is registered under: a recovering worker finds it by it."""
        return self._durable_name

    async def run(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage] | Decision | Sequence[Decision],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
        on_update: OnUpdate | None = None,
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> AgentResponse:
        """:meth:`raf.Agent.run` as a DBOS workflow (on asyncio; trio is a DurableError).

        Run it inside DBOS's ``SetWorkflowID(id)`` to choose the workflow id.
        """
        _require_asyncio()
        _refuse_decisions(messages)
        request, checked, run_options = _arguments(
            cast("Any", messages), session, options, output_type, output_retries
        )
        if on_update is not None and not callable(on_update):
            raise TypeError(f"on_update must be an async function of an Update, got {on_update!r}")
        given = None if session is None else checked
        return await self._workflow(request, given, run_options, on_update)

    def stream(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage] | Decision | Sequence[Decision],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> AgentStream:
        """:meth:`raf.Agent.stream` as a DBOS workflow (on asyncio; trio is a DurableError)."""
        _refuse_decisions(messages)
        request, checked, run_options = _arguments(
            cast("Any", messages), session, options, output_type, output_retries
        )
        given = None if session is None else checked

        async def start(on_update: OnUpdate) -> Any:
            _require_asyncio()
            return on_update

        async def run(on_update: Any) -> AgentResponse:
            return await self._workflow(request, given, run_options, on_update)

        return AgentStream(start, cast("CallNext[Invocation]", run))

    async def _workflow(
        self,
        request: tuple[ChatMessage, ...],
        session: Session | None,
        options: AgentRunOptions,
        on_update: OnUpdate | None,
    ) -> AgentResponse:
        ref = None if session is None else SessionRef.of(session)
        caller = _Caller(on_update, session)
        token = _CALLER.set(caller)
        try:
            return await _durable_run(self._durable_name, request, ref, options)
        except dbos_errors.DBOSException as exc:
            unset = ("before DBOS initialized", "before DBOS was launched")
            if caller.workflow_id is None and any(text in str(exc) for text in unset):
                raise DurableError(
                    "DBOS is not set up in this process: call DBOS(config=...) and "
                    "DBOS.launch() after building the durable agents (raf never does)"
                ) from exc
            raise
        except anyio.get_cancelled_exc_class():
            # Cancelled by its caller: cancelled in DBOS too, not resumed at the next launch.
            if caller.workflow_id is not None:
                with anyio.CancelScope(shield=True):
                    await DBOS.cancel_workflow_async(caller.workflow_id)
            raise
        finally:
            _CALLER.reset(token)

    def __repr__(self) -> str:
        return f"<DurableAgent {self._durable_name!r} {super().__repr__()}>"


def dbos_agent(agent: Agent, *, name: str | None = None) -> DurableAgent:
    """A copy of ``agent`` whose run is a DBOS workflow, registered under ``name``.

    ``name`` defaults to ``agent.name``; it must be unique in the process
    and the same in every worker, because a recovered run finds its agent
    by it. Build durable agents before ``DBOS.launch()``: the launch
    recovers the runs a dead worker left.
    """
    if not isinstance(agent, Agent) or isinstance(agent, DurableAgent):
        raise TypeError(f"dbos_agent() takes a plain raf.Agent, got {agent!r}")
    name = agent.name if name is None else name
    if not isinstance(name, str) or not name:
        raise ValueError(
            "a durable agent needs a name (a recovering worker finds it by it): "
            "dbos_agent(agent, name='...') or Agent(..., name='...')"
        )
    if name in _AGENTS:
        raise DurableError(
            f"a durable agent named {name!r} exists in this process already: "
            "each durable agent needs its own name"
        )
    durable = DurableAgent(agent, name)
    _AGENTS[name] = durable
    return durable


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise DurableError(
            "a durable agent runs only on asyncio (DBOS is asyncio-only): "
            "run it with anyio.run(..., backend='asyncio') or asyncio.run()"
        ) from None


@DBOS.workflow(name="raf.durable.run")
async def _durable_run(
    agent_name: str,
    request: tuple[ChatMessage, ...],
    ref: SessionRef | None,
    options: AgentRunOptions,
) -> AgentResponse:
    """The workflow: a durable agent's run, from the request to the post stages."""
    agent = _AGENTS.get(agent_name)
    if agent is None:
        raise DurableError(
            f"no durable agent named {agent_name!r} in this process: build it with "
            "raf.durable.dbos_agent(agent, name=...) before DBOS.launch()"
        )
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None  # inside a workflow
    caller = _CALLER.get()
    if caller is not None and caller.workflow_id is None:
        caller.workflow_id = workflow_id
        on_update, session = caller.on_update, caller.session
    else:  # recovered (or started by DBOS): no caller to stream to, the session reopened
        on_update, session = None, None
    if session is not None:
        return await _run(agent, workflow_id, request, session, options, on_update)
    if ref is None:
        return await _run(agent, workflow_id, request, InMemorySession(), options, on_update)
    async with ref.reopened() as reopened:
        return await _run(agent, workflow_id, request, reopened, options, on_update)


async def _run(
    agent: DurableAgent,
    workflow_id: str,
    request: tuple[ChatMessage, ...],
    session: Session,
    options: AgentRunOptions,
    on_update: OnUpdate | None,
) -> AgentResponse:
    # The pre stages are not steps: they run again on recovery, where the request hash
    # was recorded already (Invocation.repeated is true).
    if hasattr(session, "add_messages_once"):
        session = WrittenOnce(session, workflow_id)
    touched = await session.touch_request_hash(request)
    invocation = start_invocation(
        agent, session, request, options, touched.digest, touched.repeated, on_update
    )
    token = _BATCH.set(_Batch())
    try:
        return await agent._run(invocation)
    finally:
        _BATCH.reset(token)


async def _model_step(request: ChatRequest, call_next: CallNext[ChatRequest]) -> AgentResponse:
    """The innermost chat middleware: the model call is the step ``raf.model``."""

    async def model() -> AgentResponse:
        return await call_next(request)

    response = await DBOS.run_step_async({"name": "raf.model"}, model)
    batch = _BATCH.get()
    if batch is not None:
        batch.calls, batch.steps = tuple(call.id for call in response.tool_calls), None
    return response


async def _tool_step(request: ToolRequest, call_next: Any) -> ChatMessage:
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


def _refuse_decisions(messages: object) -> None:
    """Approvals do not wait inside a durable workflow yet: a Decision is refused, clearly."""
    items = messages if isinstance(messages, Sequence) and not isinstance(messages, str) else ()
    if isinstance(messages, Decision) or any(isinstance(item, Decision) for item in items):
        raise DurableError(
            "a durable run cannot resume approvals yet: resume the paused calls with the plain "
            "agent (agent.run(decision, session=s)), outside DBOS"
        )
