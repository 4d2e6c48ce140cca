"""LoggingMiddleware: a structlog start and end event, with timings, for each call."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import attrs

from raf._values.context import ChatRequest, Invocation
from raf._values.messages import AgentResponse, OnUpdate, Update

__all__ = ["LoggingMiddleware"]


class LoggingMiddleware:
    """Log each run (in ``stack``) or each model call (in ``chat_stack``) with structlog.

    Around a run it binds a ``run_id`` to structlog's context variables
    (``structlog.contextvars``), so every event logged inside the run, by raf
    or by your providers and tools, carries it; a model call inside a run
    reuses the run's id, and binds a fresh one when there is none. It emits
    ``run.start`` / ``run.end`` (or ``model.start`` / ``model.end``); the end
    event carries ``duration_ms``, ``outcome`` (``"ok"``, ``"error"`` or
    ``"cancelled"``), the error type on failure, the message and tool call
    counts of the response, its token usage and ``model``, the model that
    answered: the one the server reports (an OpenAI reply, or a streamed
    call's first chunk, names the exact version), else the one the run asked
    for (a :class:`raf.FallbackMiddleware` inside it names the fallback model
    that answered). On ``model.start`` and ``run.start``, ``model`` is the one the
    call will use: the run's, else the client's default (an agent hands
    the chat stack its client's ``model`` when the run names none).
    The end event of a streamed run or call also carries ``updates``, the
    count of updates it sent, and ``ttfu_ms``, the time from the start to
    the first update (``None`` when there was none).

    raf never configures structlog: the events go wherever your application
    sends them (see ``docs/middleware.md``). ``logger`` replaces the default
    ``structlog.get_logger("raf")``.

    >>> from raf import Agent, EchoChatClient
    >>> agent = Agent(EchoChatClient(), stack=[LoggingMiddleware()])
    """

    __slots__ = ("_logger",)

    def __init__(self, *, logger: Any = None) -> None:
        self._logger = logger

    async def __call__(
        self, request: Any, call_next: Callable[[Any], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Run the rest of the stack between a start and an end event."""
        import structlog  # here: `import raf` does not import it (later, a dict lookup)

        log = self._logger if self._logger is not None else structlog.get_logger("raf")
        if isinstance(request, ChatRequest):
            level = "model"
            requested = request.options.model
            fields: dict[str, Any] = {
                "model": requested,
                "messages": len(request.messages),
                "tools": len(request.options.tools),
            }
        elif isinstance(request, Invocation):
            level = "run"
            agent = request.agent
            requested = request.options.model
            if requested is None:
                default = getattr(getattr(agent, "chat_client", None), "model", None)
                requested = default if isinstance(default, str) else None
            fields = {
                "agent": agent.name if agent is not None else None,
                "model": requested,
                "session_id": request.session.id,
                "request_messages": len(request.request_messages),
                "tools": len(request.tools) + (len(agent.tools) if agent is not None else 0),
            }
        else:
            level = "call"
            requested = None
            fields = {"request_type": type(request).__name__}
        run_id = structlog.contextvars.get_contextvars().get("run_id") or _new_run_id()
        send = getattr(request, "on_update", None)
        stream: _Counted | None = None
        if send is not None:
            # A streamed call: count its updates on their way out, as ASGI middleware
            # wraps send.
            stream = _Counted(send)
            request = attrs.evolve(request, on_update=stream.on_update)
        with structlog.contextvars.bound_contextvars(run_id=run_id):
            log.info(f"{level}.start", **fields)
            started = time.perf_counter()
            if stream is not None:
                stream.started = started
            try:
                response = await call_next(request)
            except anyio.get_cancelled_exc_class():
                log.warning(
                    f"{level}.end",
                    duration_ms=_since(started),
                    outcome="cancelled",
                    **_streamed(stream),
                )
                raise
            except BaseException as error:
                log.error(
                    f"{level}.end",
                    duration_ms=_since(started),
                    outcome="error",
                    error_type=type(error).__name__,
                    error=str(error),
                    **_streamed(stream),
                )
                raise
            usage = response.usage
            # A streamed response has no raw reply of its own: its first chunk names the model.
            raw = response.raw if response.raw is not None or stream is None else stream.raw
            # A fallback (FallbackMiddleware) names the model that answered on the response.
            model = response.model or _answered_by(raw, requested)
            answered = {} if level == "call" else {"model": model}
            log.info(
                f"{level}.end",
                duration_ms=_since(started),
                outcome="ok",
                **answered,
                messages=len(response.messages),
                tool_calls=len(response.tool_calls),
                input_tokens=usage.input_tokens if usage is not None else None,
                output_tokens=usage.output_tokens if usage is not None else None,
                **_streamed(stream),
            )
            return response

    def __repr__(self) -> str:
        return "LoggingMiddleware()"


class _Counted:
    """The ``on_update`` of a streamed call, wrapped: counts updates, times the first."""

    __slots__ = ("count", "first", "raw", "send", "started")

    def __init__(self, send: OnUpdate) -> None:
        self.send = send
        self.count = 0
        self.started = 0.0
        self.first: float | None = None
        self.raw: Any = None  # the first update's chunk: it names the model that answers

    async def on_update(self, update: Update) -> None:
        if self.first is None:
            self.first = _since(self.started)
            self.raw = update.raw
        self.count += 1
        await self.send(update)


def _streamed(stream: _Counted | None) -> dict[str, Any]:
    """The end event's fields of a streamed call: none for a call that is not streamed."""
    if stream is None:
        return {}
    return {"updates": stream.count, "ttfu_ms": stream.first}


def _answered_by(raw: Any, requested: str | None) -> str | None:
    """The model the raw response names (an SDK object or a mapping), else ``requested``."""
    named = raw.get("model") if isinstance(raw, Mapping) else getattr(raw, "model", None)
    return named if isinstance(named, str) and named else requested


def _since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _new_run_id() -> str:
    import uuid  # here: `import raf` does not import it

    return uuid.uuid4().hex[:16]
