"""Tracing: report each provider stage and model call as it happens, with its duration."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import attrs

from raf.context import ContextResult
from raf.errors import Stage
from raf.messages import AgentResponse, ChatMessage
from raf.options import AgentRunOptions
from raf.parallel import ProviderGroup, provider_name
from raf.pipeline import ChatRequest, Complete
from raf.providers import is_provider
from raf.sessions.base import Session

__all__ = ["StageEvent", "TracedProvider", "trace_model", "traced_stack"]


@attrs.frozen(slots=True)
class StageEvent:
    """One finished stage: which provider (or ``"model"``), which stage, how long, how it ended."""

    provider: str
    kind: str
    stage: Stage | Literal["complete"]
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


class TracedProvider:
    """Wraps a provider and emits a :class:`StageEvent` after each of its stages.

    ``name`` and ``kind`` are the wrapped provider's, so errors still name it.
    """

    def __init__(self, provider: Any, emit: Emit) -> None:
        self.provider = provider
        self.name = provider_name(provider)
        self.kind = str(getattr(provider, "kind", "unknown"))
        self._emit = emit
        self._on_invoked = getattr(provider, "on_invoked", None)

    async def on_invoking(
        self,
        agent: Any,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> Any:
        """The wrapped pre stage, timed."""
        started = time.perf_counter()
        error: BaseException | None = None
        result: Any = None
        try:
            result = await self.provider.on_invoking(agent, session, messages, options)
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._report("on_invoking", started, error, _describe_result(result))

    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        """The wrapped post stage, timed (nothing if the provider has none)."""
        if self._on_invoked is None:
            return
        started = time.perf_counter()
        failure: BaseException | None = None
        try:
            await self._on_invoked(agent, session, request_messages, response, error)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self._report("on_invoked", started, failure)

    def _report(
        self, stage: Stage, started: float, error: BaseException | None, detail: str = ""
    ) -> None:
        elapsed = (time.perf_counter() - started) * 1000
        self._emit(StageEvent(self.name, self.kind, stage, elapsed, _outcome(error), detail))


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


def traced_stack(stack: Sequence[Any], emit: Emit) -> list[Any]:
    """The same stack with each provider and group member in a :class:`TracedProvider`."""
    traced: list[Any] = []
    for item in stack:
        if isinstance(item, ProviderGroup):
            members = tuple(TracedProvider(member, emit) for member in item.members)
            traced.append(attrs.evolve(item, members=members))
        elif is_provider(item):
            traced.append(TracedProvider(item, emit))
        else:
            traced.append(item)
    return traced


def trace_model(emit: Emit) -> Callable[[ChatRequest, Complete[ChatRequest]], Any]:
    """Chat-stack middleware that emits one event per model call."""

    async def middleware(request: ChatRequest, call_next: Complete[ChatRequest]) -> AgentResponse:
        started = time.perf_counter()
        error: BaseException | None = None
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
            emit(StageEvent("model", "chat", "complete", elapsed, _outcome(error), detail))

    return middleware
