"""dbos_agent: an agent whose run is a DBOS workflow and whose model and tool calls are steps.

Its callers start the workflow and follow its stream; a caller of decisions
sends them to the run that waits for them (found by the pending call's
``run_id``) and follows the stream to that pass's answer.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import anyio
from dbos import DBOS
from dbos import error as dbos_errors

from raf._agent.agent import Agent, run_of
from raf._agent.deferred import Decision, claim_decided, not_pending
from raf._agent.streaming import AgentStream
from raf._onion.compose import CallNext
from raf._sessions.base import Claimed, Session
from raf._values.context import Invocation
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate, Update
from raf._values.options import AgentRunOptions
from raf._values.run import KEY_SCOPE, Run
from raf.durable._sessions import SessionRef
from raf.durable._workflow import (
    AGENTS,
    STREAM_POLL,
    TOPIC,
    UPDATES,
    WAITING,
    Answer,
    Delivery,
    Taken,
    durable_run,
    live,
    model_step,
    tool_step,
)
from raf.errors import DurableError

__all__ = ["DurableAgent", "dbos_agent"]

#: How long a durable run waits for approvals by default, in seconds.
APPROVAL_TIMEOUT = 600.0
#: What DBOS says when it is not set up in this process.
_NOT_SET_UP = ("before DBOS initialized", "before DBOS was launched", "No DBOS was created")


class DurableAgent:
    """An agent whose run is a DBOS workflow (build it with :func:`dbos_agent`).

    It wraps :attr:`agent`, a copy of the agent it was built from whose chat
    stack ends with the step ``raf.model`` and whose tool stack ends with the
    step ``raf.tool.NAME``; every other attribute is that agent's. A run
    whose calls wait for approval waits for the decisions inside DBOS, up
    to ``approval_timeout`` seconds (see ``docs/durable.md``).
    """

    __slots__ = ("agent", "approval_timeout", "durable_name")

    def __init__(self, agent: Agent, name: str, approval_timeout: float = APPROVAL_TIMEOUT) -> None:
        #: The agent whose pipeline each pass runs (its model and tool calls are steps).
        self.agent = agent.replace(
            chat_stack=(*agent.chat_stack, model_step), tool_stack=(*agent.tool_stack, tool_step)
        )
        #: The name this agent is registered under: a recovering worker finds it by it.
        self.durable_name = name
        #: How long a run waits inside DBOS for each decision, in seconds (0: it does not).
        self.approval_timeout = approval_timeout

    def __getattr__(self, name: str) -> Any:
        return getattr(self.agent, name)

    async def run(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage] | Decision | Sequence[Decision],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
        on_update: OnUpdate | Run | None = None,
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> AgentResponse:
        """:meth:`raf.Agent.run` as a DBOS workflow (on asyncio; trio is a DurableError).

        Run it inside DBOS's ``SetWorkflowID(id)`` to choose the workflow id.
        A :class:`raf.Decision` (or a sequence of them) goes to the run that
        waits for it, in whichever process, and returns what that run did
        with it; when no run waits for it, it resumes the calls here.
        """
        _require_asyncio()
        go = self._prepared(messages, session, options, output_type, output_retries)
        return await go(run_of(on_update))

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
        go = self._prepared(messages, session, options, output_type, output_retries)

        async def start(run: Run) -> Any:
            _require_asyncio()
            return run.start()

        return AgentStream(start, cast("CallNext[Invocation]", go))

    def _prepared(
        self, messages: Any, session: Session | None, options: Any, output_type: Any, retries: Any
    ) -> Callable[[Run], Awaitable[AgentResponse]]:
        """The run of these arguments (checked now), to start with the caller's :class:`Run`."""
        request, checked, run_options, decisions = self.agent._arguments(
            messages, session, options, output_type, retries
        )

        async def go(run: Run) -> AgentResponse:
            try:
                if decisions:
                    return await self._decide(decisions, checked, run_options, run)
                given = None if session is None else checked
                return await self._run(request, given, run_options, run)
            except dbos_errors.DBOSException as exc:
                if any(text in str(exc) for text in _NOT_SET_UP):
                    raise DurableError(
                        "DBOS is not set up in this process: call DBOS(config=...) and "
                        "DBOS.launch() after building the durable agents (raf never does)"
                    ) from exc
                raise

        return go

    async def _decide(
        self,
        decisions: tuple[Decision, ...],
        session: Session,
        options: AgentRunOptions,
        run: Run,
    ) -> AgentResponse:
        """Decisions: to the run that waits for their calls, or (none waits) a new run.

        The run is the pending calls' ``run_id``. The decider claims the calls
        (the store's atomic claim: of two deciders of one call, one gets it,
        the other an ApprovalError), sends them with ``DBOS.send`` and follows
        the run's stream to what its pass did with them.
        """
        pending = {call.token: call for call in await session.list_pending()}
        tokens = [decision.token for decision in decisions]
        if not set(tokens) <= pending.keys():
            raise not_pending(session, tokens, tuple(pending.values()))
        run_id, claimed = pending[tokens[0]].run_id, None
        if run_id is not None and await live(run_id):
            # Shielded: calls claimed and not sent would wait, taken, until the run times out.
            with anyio.CancelScope(shield=True):
                claimed = await claim_decided(session, decisions)
                delivery = Delivery(uuid.uuid4().hex, decisions, claimed)
                await DBOS.send_async(run_id, delivery, TOPIC)
            answer = await answer_of(run_id, delivery.message_id)
            if answer is not None:
                return answer
            # The run ended (timed out, its caller left) as they came: the calls are
            # claimed by this process, which runs them.
        return await self._run((), session, options, run, decisions, claimed)

    async def _run(
        self,
        request: tuple[ChatMessage, ...],
        session: Session | None,
        options: AgentRunOptions,
        run: Run,
        decisions: tuple[Decision, ...] = (),
        claimed: Claimed | None = None,
    ) -> AgentResponse:
        """Start the run's workflow and follow its stream; leaving it early leaves the run.

        A run started by decisions returns once it pauses (its wait goes on in
        the background); one started by messages follows it to its end.
        """
        ref = None if session is None else SessionRef.of(session)
        streams = run.sink is not None
        # The served caller's key scope crosses into the workflow (its passes run in a Run of
        # their own): a key's memories and budgets stay its own in a durable run too.
        scope = run.state.get(KEY_SCOPE, "")
        args = (request, ref, options, self.approval_timeout, streams, decisions, claimed, scope)
        handle = await DBOS.start_workflow_async(durable_run, self.durable_name, *args)
        run_id = handle.get_workflow_id()
        try:
            # Followed in the caller's run's core: its early close leaves the durable run.
            if streams or decisions:
                on_update = run.send if streams else None
                paused = await run.core(_follow, run_id, on_update, bool(decisions))
                if paused is not None:
                    return paused
            return await run.core(handle.get_result)
        except BaseException:  # the caller leaves (a run that has ended is left as it is)
            with anyio.CancelScope(shield=True):
                await _leave(run_id)
            raise

    def __repr__(self) -> str:
        return f"<DurableAgent {self.durable_name!r} {self.agent!r}>"


async def _follow(run_id: str, on_update: OnUpdate | None, to_pause: bool) -> AgentResponse | None:
    """Read the run's updates into ``on_update`` until its stream ends, or (``to_pause``) until
    the run waits: then the answer of its first pass."""
    async for item in DBOS.read_stream_async(run_id, UPDATES, polling_interval_sec=STREAM_POLL):
        if isinstance(item, Answer):
            if to_pause:
                return item.response
        elif on_update is not None and isinstance(item, Update):
            await on_update(item)
    return None


async def answer_of(run_id: str, message_id: str) -> AgentResponse | None:
    """What the run's pass of the delivery ``message_id`` returned, read from its stream;
    ``None`` when the run ended without taking the delivery."""
    taken = False
    async for item in DBOS.read_stream_async(run_id, UPDATES, polling_interval_sec=STREAM_POLL):
        if isinstance(item, Answer) and item.message_id == message_id:
            return item.response
        taken = taken or (isinstance(item, Taken) and item.message_id == message_id)
    status = await DBOS.get_workflow_status_async(run_id)
    if status is not None and status.status == "ERROR":
        await DBOS.get_result_async(run_id)  # raises the error that ended the run
    if taken:
        # It took them, then was cancelled in the middle of that pass: running them
        # here would run an approved call a second time.
        raise DurableError(
            f"the run {run_id!r} was cancelled while it applied these decisions: their "
            "calls are answered in the session (with their result if it came, else as "
            "interrupted) and are not run again; send a message to go on"
        )
    return None


async def _leave(run_id: str) -> None:
    """The caller leaves: a run not waiting yet is cancelled (not resumed at the next launch),
    a waiting one gets the empty message after any decision sent before it; an ended one neither."""
    if await DBOS.get_event_async(run_id, WAITING, timeout_seconds=0):
        await DBOS.send_async(run_id, None, TOPIC)
    else:
        await DBOS.cancel_workflow_async(run_id)


def dbos_agent(
    agent: Agent, *, name: str | None = None, approval_timeout: float = APPROVAL_TIMEOUT
) -> DurableAgent:
    """A wrapper of ``agent`` whose run is a DBOS workflow, registered under ``name``.

    ``name`` defaults to ``agent.name``; it must be unique in the process
    and the same in every worker, because a recovered run finds its agent
    by it. Build durable agents before ``DBOS.launch()``: the launch
    recovers the runs a dead worker left.

    ``approval_timeout`` is how long, in seconds, a run whose calls wait for
    approval waits for each decision inside DBOS (default 600; the deadline
    holds across a recovery). ``0`` does not wait: the run ends with
    ``pending``, as a plain agent's does, and a decision resumes it in a
    new durable run.
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"dbos_agent() takes a plain raf.Agent, got {agent!r}")
    name = agent.name if name is None else name
    if not isinstance(name, str) or not name:
        raise ValueError(
            "a durable agent needs a name (a recovering worker finds it by it): "
            "dbos_agent(agent, name='...') or Agent(..., name='...')"
        )
    if (
        isinstance(approval_timeout, bool)
        or not isinstance(approval_timeout, (int, float))
        or not 0 <= approval_timeout < math.inf
    ):
        raise ValueError(
            f"approval_timeout must be a finite number of seconds >= 0, got {approval_timeout!r}"
        )
    if name in AGENTS:
        raise DurableError(
            f"a durable agent named {name!r} exists in this process already: "
            "each durable agent needs its own name"
        )
    durable = DurableAgent(agent, name, float(approval_timeout))
    AGENTS[name] = durable.agent
    return durable


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise DurableError(
            "a durable agent runs only on asyncio (DBOS is asyncio-only): "
            "run it with anyio.run(..., backend='asyncio') or asyncio.run()"
        ) from None
