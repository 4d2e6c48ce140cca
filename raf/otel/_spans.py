"""Starting and ending raf's spans, and what a response, a provider's result and a stream
put on them (ids, usage, finish reasons; counts, never content)."""

from __future__ import annotations

import time
from contextvars import ContextVar, Token

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from raf._observers.otel_details import Details
from raf._values.context import ContextResult
from raf._values.messages import AgentResponse, OnUpdate, Update
from raf.errors import StreamClosedError
from raf.otel._content import messages_json

__all__ = [
    "RECORDING",
    "attach",
    "error_type",
    "failed",
    "first_chunk",
    "record_details",
    "record_response",
    "record_result",
]

# Starting and ending spans ------------------------------------------------------------------

#: Whether the run the current task works for has a recorded invoke_agent span. The spans
#: inside a run are started only then: a run that is not recorded (a no-op tracer provider,
#: or sampled out, which every standard sampler decides for the whole trace) costs its
#: stages, model and tool calls a context-variable lookup each, no span.
RECORDING: ContextVar[bool] = ContextVar("raf_otel_recording", default=False)


def attach(span: Span) -> Token[Context] | None:
    # Only a recording span is made current: a no-op tracer's spans cost no context switch,
    # and what runs inside them nests under the nearest recorded span.
    if span.is_recording():
        return otel_context.attach(trace.set_span_in_context(span))
    return None


def failed(span: Span, error: BaseException, *, event: bool = True) -> None:
    """Status ERROR, ``error.type`` and an ``exception`` event (unless one was recorded
    already): the error passed through here. A consumer that left a stream early is
    no error: ``raf.stream.closed``, the status left unset."""
    if not span.is_recording():
        return
    if isinstance(error, StreamClosedError):
        span.set_attribute("raf.stream.closed", True)
        return
    kind = error_type(error)
    span.set_attribute("error.type", kind)
    if event:
        span.record_exception(error, escaped=True)
    span.set_status(Status(StatusCode.ERROR, f"{kind}: {_text_of(error)}"))


def error_type(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _text_of(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a broken __str__ must not break the span
        return "(its message cannot be shown)"


def record_response(
    span: Span, response: AgentResponse, capture: bool, details: Details | None = None
) -> None:
    usage = response.usage
    if usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        # The conventions' cache figures, both part of gen_ai.usage.input_tokens.
        if usage.cached_input_tokens:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens)
        if usage.cache_write_tokens:
            span.set_attribute("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens)
        if usage.reasoning_tokens:
            span.set_attribute("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens)
    if details is None:
        details = Details()
        details.read(response)
    record_details(span, details)
    if capture:
        span.set_attribute("gen_ai.output.messages", messages_json(response.messages))


def record_details(span: Span, details: Details) -> None:
    """The response's id, model and finish reasons, as far as they are known."""
    if details.model:
        span.set_attribute("gen_ai.response.model", details.model)
    if details.id:
        span.set_attribute("gen_ai.response.id", details.id)
    if details.finish_reasons:
        span.set_attribute("gen_ai.response.finish_reasons", details.finish_reasons)


def record_result(span: Span, result: ContextResult) -> None:
    """What the provider added, in counts (never the content)."""
    if result.instructions:
        span.set_attribute("raf._context.instructions", len(result.instructions.splitlines()))
    if result.messages or result.replace_messages:
        span.set_attribute("raf._context.messages", len(result.messages))
    if result.replace_messages:
        span.set_attribute("raf._context.replace_messages", True)
    if result.tools:
        span.set_attribute(
            "raf._context.tools", [str(getattr(tool, "name", "?")) for tool in result.tools]
        )


def first_chunk(span: Span, on_update: OnUpdate, details: Details) -> OnUpdate:
    """``on_update`` that records ``gen_ai.response.time_to_first_chunk`` (seconds) once,
    and reads the response's id, model and finish reason off the stream's chunks."""
    started = time.perf_counter()
    first = True

    async def timed(update: Update) -> None:
        nonlocal first
        details.see(update)
        if first:
            first = False
            span.set_attribute("gen_ai.response.time_to_first_chunk", time.perf_counter() - started)
        await on_update(update)

    return timed
