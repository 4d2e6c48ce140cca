"""Tracing: an observer that reports each provider stage, model call, tool call and guardrail
check, timed."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import attrs

from raf._agent.tool_loop import ToolRequest
from raf._onion.observe import Observer, ProviderStage, RunCheck, RunStage
from raf._values.context import ChatRequest, ContextResult
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.verdict import GuardrailCheck, Verdict
from raf.errors import Stage

__all__ = ["StageEvent", "TraceObserver"]


@attrs.frozen(slots=True)
class StageEvent:
    """One finished stage: which provider (or ``"model"``, or a tool), which stage, how long,
    how it ended.

    A tool call is ``provider`` the tool's name, ``kind`` ``"tool"``, ``stage``
    ``"call"``, and ``detail`` its arguments and the size of its result. A
    guardrail's check is ``provider`` the guardrail's name, ``kind``
    ``"guardrail"``, ``stage`` ``"check"``, and ``detail`` what it checked
    (for a streamed answer, the text held) and what became of it (released,
    rewritten, blocked).
    """

    provider: str
    kind: str
    stage: Stage | Literal["complete", "call", "check"]
    duration_ms: float
    outcome: str
    detail: str = ""

    def __str__(self) -> str:
        text = (
            f"{self.provider} [{self.kind}] {self.stage} {self.duration_ms:.2f} ms {self.outcome}"
        )
        return f"{text} ({self.detail})" if self.detail else text


Emit = Callable[[StageEvent], None]


def _outcome(error: BaseException | None) -> str:
    return "ok" if error is None else f"raised {type(error).__name__}"


class TraceObserver(Observer):
    """An observer that emits one timed :class:`StageEvent` per provider stage, model call
    and tool call, as each ends (what ``raf run --trace`` prints).

    Model calls are reported one per call that reaches the model (each attempt of a
    retried call); a streamed one counts its updates and times the first.

    >>> import anyio
    >>> from raf import Agent, EchoChatClient
    >>> agent = Agent(EchoChatClient(), observers=[TraceObserver(print)])
    >>> anyio.run(agent.run, "hi").text  # doctest: +ELLIPSIS
    model [chat] complete ... ms ok (1 message, 0 tools)
    'hi'
    """

    #: Every stage a provider has is reported, the ``on_invoked`` it inherits included.
    inherited_post_stages = True

    def __init__(self, emit: Emit) -> None:
        self._emit = emit

    async def provider_stage(self, stage: ProviderStage, call_next: RunStage) -> Any:
        """The stage, timed; a pre stage's event says what it added."""
        started = time.perf_counter()
        error: BaseException | None = None
        result: Any = None
        try:
            result = await call_next()
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            detail = _describe_result(result) if stage.stage == "on_invoking" else ""
            self._emit(
                StageEvent(stage.name, stage.kind, stage.stage, elapsed, _outcome(error), detail)
            )

    async def model_attempt(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """The call to the model, timed; a streamed one with its updates counted."""
        started = time.perf_counter()
        error: BaseException | None = None
        send = request.on_update
        count = 0
        first: float | None = None
        if send is not None:
            # A streamed call: one line for it all, with its update count and the time to
            # its first update, not a line per update.
            async def on_update(update: Update) -> None:
                nonlocal count, first
                if first is None:
                    first = (time.perf_counter() - started) * 1000
                count += 1
                await send(update)

            request = attrs.evolve(request, on_update=on_update)
        try:
            return await call_next(request)
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            detail = (
                f"{_count(len(request.messages), 'message')}, "
                f"{_count(len(request.options.tools), 'tool')}"
            )
            if send is not None:
                detail += f"; streamed {_count(count, 'update')}"
                if first is not None:
                    detail += f", first after {first:.2f} ms"
            self._emit(StageEvent("model", "chat", "complete", elapsed, _outcome(error), detail))

    async def tool_call(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """The tool call, timed: its arguments and the size of its result (in characters,
        as the model gets it)."""
        started = time.perf_counter()
        error: BaseException | None = None
        size: int | None = None
        try:
            message = await call_next(request)
            size = len(message.content or "")
            return message
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            detail = f"arguments {_describe_arguments(request.arguments)}"
            if size is not None:
                detail += f"; result {_count(size, 'char')}"
            name = str(request.tool.name)
            self._emit(StageEvent(name, "tool", "call", elapsed, _outcome(error), detail))

    async def guardrail(self, check: GuardrailCheck, call_next: RunCheck) -> Verdict:
        """The check, timed: the text it judged (held, for a streamed answer) and its verdict."""
        started = time.perf_counter()
        error: BaseException | None = None
        verdict: Verdict | None = None
        try:
            verdict = await call_next()
            return verdict
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            context = check.context
            held = "held" if context.where == "output" else context.where.replace("_", " ")
            detail = f"{held} {_shown(check.text)}"
            if verdict is not None:
                detail += f" -> {_verdict(verdict, context.where)}"
            name, outcome = context.guardrail, _outcome(error)
            self._emit(StageEvent(name, "guardrail", "check", elapsed, outcome, detail))


def _verdict(verdict: Verdict, where: str) -> str:
    if verdict.action == "block":
        return f"blocked: {verdict.reason}"
    if verdict.action == "rewrite":
        return f"rewritten {_shown(verdict.text or '')}"
    return "released" if where == "output" else "allowed"


#: How much of a checked text a trace line shows.
TEXT_SHOWN = 80


def _shown(text: str) -> str:
    if len(text) <= TEXT_SHOWN:
        return repr(text)
    return f"{text[:TEXT_SHOWN]!r}... ({len(text)} chars)"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _describe_result(result: Any) -> str:
    if not isinstance(result, ContextResult):
        return ""
    parts = []
    if result.instructions:
        parts.append("+" + _count(len(result.instructions.splitlines()), "instruction line"))
    if result.replace_messages:
        parts.append(f"replaced messages with {len(result.messages)}")
    elif result.messages:
        parts.append("+" + _count(len(result.messages), "message"))
    if result.tools:
        parts.append("+tools " + ", ".join(getattr(t, "name", "?") for t in result.tools))
    return "; ".join(parts) or "nothing added"


#: How much of a tool call's arguments a trace line shows.
ARGUMENTS_SHOWN = 200


def _describe_arguments(arguments: Mapping[str, Any]) -> str:
    try:
        text = json.dumps(dict(arguments), ensure_ascii=False, default=str)
    except ValueError:  # circular structures
        text = repr(arguments)
    if len(text) > ARGUMENTS_SHOWN:
        text = text[:ARGUMENTS_SHOWN] + f"... ({len(text)} chars)"
    return text
