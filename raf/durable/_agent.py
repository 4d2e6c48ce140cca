"""dbos_agent: an agent whose run is a DBOS workflow and whose model and tool calls are steps."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, cast

import anyio
from dbos import DBOS
from dbos import error as dbos_errors

from raf._agent.agent import Agent
from raf._agent.approvals import Decision, not_pending
from raf._agent.streamed import streamed_core
from raf._agent.streaming import AgentStream
from raf._errors import DurableError
from raf._onion.compose import CallNext
from raf._sessions.base import Claimed, Session
from raf._values.context import Invocation
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate
from raf._values.options import AgentRunOptions
from raf.durable._decisions import deliver, waiting_in, wake
from raf.durable._sessions import SessionRef
from raf.durable._workflow import (
    AGENTS,
    CALLER,
    TOPIC,
    Caller,
    Delivery,
    durable_run,
    merged,
    model_step,
    tool_step,
)

__all__ = ["DurableAgent", "dbos_agent"]

#: How long a durable run waits for approvals by default, in seconds.
APPROVAL_TIMEOUT = 600.0


class DurableAgent(Agent):
    """An agent whose run is a DBOS workflow (build it with :func:`dbos_agent`).

    Its chat stack ends with the step ``raf.model`` and its tool stack with
    the step ``raf.tool.NAME``; everything else is the agent it copies. A
    run whose calls wait for approval waits for the decisions inside DBOS,
    up to ``approval_timeout`` seconds (see ``docs/durable.md``).
    """

    __slots__ = ("_approval_timeout", "_durable_name")

    _approval_timeout: float
    _durable_name: str

    def __init__(self, agent: Agent, name: str, approval_timeout: float = APPROVAL_TIMEOUT) -> None:
        super().__init__(
            agent.chat_client,
            name=agent.name,
            instructions=agent.instructions,
            tools=agent.tools,
            stack=agent.stack,
            chat_stack=(*agent.chat_stack, model_step),
            tool_stack=(*agent.tool_stack, tool_step),
            post_timeout=agent.post_timeout,
            observers=agent.observers,
        )
        object.__setattr__(self, "_durable_name", name)
        object.__setattr__(self, "_approval_timeout", approval_timeout)

    @property
    def durable_name(self) -> str:
        """The name this agent is registered under: a recovering worker finds it by it."""
        return self._durable_name

    @property
    def approval_timeout(self) -> float:
        """How long a run waits inside DBOS for approvals, in seconds (0: it does not wait)."""
        return self._approval_timeout

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
        A :class:`raf.Decision` (or a sequence of them) goes to the run that
        waits for it, in whichever process, and returns what that run did
        with it; when no run waits for it, it resumes the calls here.
        """
        _require_asyncio()
        request, checked, run_options, decisions = self._arguments(
            messages, session, options, output_type, output_retries
        )
        if on_update is not None and not callable(on_update):
            raise TypeError(f"on_update must be an async function of an Update, got {on_update!r}")
        given = None if session is None else checked
        if decisions:
            return await self._decide(decisions, checked, run_options, on_update)
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
        request, checked, run_options, decisions = self._arguments(
            messages, session, options, output_type, output_retries
        )
        given = None if session is None else checked

        async def start(on_update: OnUpdate) -> Any:
            _require_asyncio()
            return on_update

        async def run(on_update: Any) -> AgentResponse:
            if decisions:
                return await self._decide(decisions, checked, run_options, on_update)
            return await self._workflow(request, given, run_options, on_update)

        return AgentStream(start, cast("CallNext[Invocation]", run))

    async def _decide(
        self,
        decisions: tuple[Decision, ...],
        session: Session,
        options: AgentRunOptions,
        on_update: OnUpdate | None,
    ) -> AgentResponse:
        """Decisions: to the wait that holds their calls, or (none waits) a run to resume them."""
        try:
            # Only a pending call is looked for: its pointer was made before it was recorded,
            # so a call that is pending and has none waits in no workflow.
            pending = await session.list_pending()
            tokens = [decision.token for decision in decisions]
            if not set(tokens) <= {call.token for call in pending}:
                raise not_pending(session, tokens, pending)
            wait_id = await waiting_in(decisions[0].token)
            if wait_id is not None:
                outcome, delivery = await deliver(wait_id, session, decisions)
                if outcome is not None:
                    return outcome
                # The wait ended (timed out, cancelled) as they came: the calls are claimed
                # by this process, which runs them.
                return await self._workflow((), session, options, on_update, delivery)
        except dbos_errors.DBOSException as exc:
            problem = _not_set_up(exc)
            if problem is None:
                raise
            raise problem from exc
        return await self._workflow((), session, options, on_update, decisions=decisions)

    async def _workflow(
        self,
        request: tuple[ChatMessage, ...],
        session: Session | None,
        options: AgentRunOptions,
        on_update: OnUpdate | None,
        delivery: Delivery | None = None,
        *,
        decisions: tuple[Decision, ...] = (),
    ) -> AgentResponse:
        ref = None if session is None else SessionRef.of(session)
        claimed: Claimed | None = None
        if delivery is not None:
            decisions, claimed = delivery.decisions, delivery.claimed
        caller = Caller(on_update, session, waits=not decisions)
        token = CALLER.set(caller)
        passed = False  # whether the run's pass (its workflow) has returned
        try:
            response = await durable_run(
                self._durable_name, request, ref, options, decisions, claimed
            )
            passed = True
            superseded, caller.superseded = caller.superseded, ()
            await wake(superseded)
            if caller.held is not None:
                await caller.held.release()
            if caller.wait_id is None:
                return response
            # Calls wait for approval: the wait (another workflow) goes on in this process,
            # streaming to this caller, until it is decided or times out. A stream closed
            # early meanwhile ends this wait for it (as a StreamClosedError).
            waited: AgentResponse | None = await streamed_core(
                caller.wait.get_result, polling_interval_sec=0.1
            )
            return response if waited is None else merged([response, waited])
        except dbos_errors.DBOSException as exc:
            if caller.superseded:
                await _wake_after(caller.superseded, exc)
            problem = _not_set_up(exc) if caller.workflow_id is None else None
            if problem is None:
                raise
            raise problem from exc
        except BaseException as exc:
            if caller.superseded:  # the pass failed after its new message denied them
                await _wake_after(caller.superseded, exc)
            if not passed and not isinstance(exc, anyio.get_cancelled_exc_class()):
                raise  # the pass failed (or its stream closed): its workflow ended with it
            # The caller leaves (cancelled, its stream closed, its on_update raised): a pass
            # still running is cancelled in DBOS too, not resumed at the next launch.
            caller.left = True
            with anyio.CancelScope(shield=True):
                if not passed and caller.workflow_id is not None:
                    await DBOS.cancel_workflow_async(caller.workflow_id)
                if caller.wait_id is not None:
                    # The wait is not cancelled: a decision sent before this empty message
                    # (its decider was told it was accepted) is applied first, then the wait
                    # ends, as one that timed out does. Cancelling it could lose that call.
                    await DBOS.send_async(caller.wait_id, None, TOPIC)
            raise
        finally:
            CALLER.reset(token)

    def __repr__(self) -> str:
        return f"<DurableAgent {self._durable_name!r} {super().__repr__()}>"


def dbos_agent(
    agent: Agent, *, name: str | None = None, approval_timeout: float = APPROVAL_TIMEOUT
) -> DurableAgent:
    """A copy of ``agent`` whose run is a DBOS workflow, registered under ``name``.

    ``name`` defaults to ``agent.name``; it must be unique in the process
    and the same in every worker, because a recovered run finds its agent
    by it. Build durable agents before ``DBOS.launch()``: the launch
    recovers the runs a dead worker left.

    ``approval_timeout`` is how long, in seconds, a run whose calls wait for
    approval waits for the decisions inside DBOS (default 600; the deadline
    holds across a recovery). ``0`` does not wait: the run ends with
    ``pending``, as a plain agent's does, and a decision resumes it in a
    new durable run.
    """
    if not isinstance(agent, Agent) or isinstance(agent, DurableAgent):
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
    AGENTS[name] = durable
    return durable


async def _wake_after(tokens: tuple[str, ...], error: BaseException) -> None:
    """Wake the waits of ``tokens`` on the way out of a failed run (a failure is a note)."""
    try:
        with anyio.CancelScope(shield=True):
            await wake(tokens)
    except Exception as exc:
        error.add_note(f"raf: the waits of the denied calls were not woken: {exc!r}")


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise DurableError(
            "a durable agent runs only on asyncio (DBOS is asyncio-only): "
            "run it with anyio.run(..., backend='asyncio') or asyncio.run()"
        ) from None


def _not_set_up(exc: dbos_errors.DBOSException) -> DurableError | None:
    """The DurableError to raise when ``exc`` says DBOS is not set up in this process."""
    unset = ("before DBOS initialized", "before DBOS was launched")
    if not any(text in str(exc) for text in unset):
        return None
    return DurableError(
        "DBOS is not set up in this process: call DBOS(config=...) and "
        "DBOS.launch() after building the durable agents (raf never does)"
    )
