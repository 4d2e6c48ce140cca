"""Tracing: report each provider stage, model call and tool call as it happens, timed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs

from raf.context import ContextResult
from raf.errors import Stage
from raf.messages import AgentResponse, ChatMessage, Update
from raf.options import AgentRunOptions
from raf.parallel import ProviderGroup, is_provider
from raf.pipeline import CallNext, ChatRequest
from raf.providers import provider_name
from raf.sessions.base import Session

__all__ = [
    "StageEvent",
    "TracedProvider",
    "TracedTool",
    "trace_model",
    "traced_stack",
    "traced_tools",
]


@attrs.frozen(slots=True)
class StageEvent:
    """One finished stage: which provider (or ``"model"``, or a tool), which stage, how long,
    how it ended.

    A tool call is ``provider`` the tool's name, ``kind`` ``"tool"``, ``stage``
    ``"call"``, and ``detail`` its arguments and the size of its result.
    """

    provider: str
    kind: str
    stage: Stage | Literal["complete", "call"]
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
            if isinstance(result, ContextResult) and result.tools:
                # The provider's tools are traced too; anything else is left for
                # the provider layer to refuse as it would untraced.
                return attrs.evolve(result, tools=traced_tools(result.tools, self._emit))
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


def trace_model(emit: Emit) -> Callable[[ChatRequest, CallNext[ChatRequest]], Any]:
    """Chat-stack middleware that emits one event per model call; a streamed call's
    event also counts its updates and times the first."""

    async def middleware(request: ChatRequest, call_next: CallNext[ChatRequest]) -> AgentResponse:
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
            emit(StageEvent("model", "chat", "complete", elapsed, _outcome(error), detail))

    return middleware


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


def _result_size(result: Any) -> int:
    """The length of the text the model gets for ``result`` (as the tool loop sends it)."""
    if isinstance(result, str):
        return len(result)
    try:
        return len(json.dumps(result, ensure_ascii=False, default=str))
    except ValueError:
        return len(repr(result))


class TracedTool:
    """Wraps a tool and emits a :class:`StageEvent` after each call: its arguments, the
    size of its result (in characters, as the model gets it), how long it took.

    ``name``, ``description`` and ``parameters`` are the wrapped tool's.
    """

    def __init__(self, tool: Any, emit: Emit) -> None:
        self.tool = tool
        self._emit = emit

    @property
    def name(self) -> str:
        """The wrapped tool's name."""
        return str(self.tool.name)

    @property
    def description(self) -> str:
        """The wrapped tool's description."""
        return str(self.tool.description)

    @property
    def parameters(self) -> Mapping[str, Any]:
        """The wrapped tool's JSON Schema."""
        parameters: Mapping[str, Any] = self.tool.parameters
        return parameters

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """The wrapped call, timed."""
        started = time.perf_counter()
        error: BaseException | None = None
        size: int | None = None
        try:
            result = await self.tool.invoke(arguments)
            size = _result_size(result)
            return result
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = (time.perf_counter() - started) * 1000
            detail = f"arguments {_describe_arguments(arguments)}"
            if size is not None:
                detail += f"; result {_count(size, 'char')}"
            self._emit(StageEvent(self.name, "tool", "call", elapsed, _outcome(error), detail))

    def __repr__(self) -> str:
        return f"TracedTool({self.tool!r})"


def traced_tools(tools: Sequence[Any], emit: Emit) -> tuple[Any, ...]:
    """The same tools, each in a :class:`TracedTool` (once: a traced tool stays as it is)."""
    return tuple(t if isinstance(t, TracedTool) else TracedTool(t, emit) for t in tools)
