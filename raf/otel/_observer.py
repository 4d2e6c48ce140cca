"""The observer of a traced agent: its hooks open the run, stage, model-call, tool-call and
guardrail spans."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import partial
from typing import Any

import attrs
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Tracer

from raf._agent.tool_loop import ToolRequest
from raf._observers.ledger import ContextLedger
from raf._observers.otel_details import Details, Metrics, ledger_attributes
from raf._onion.observe import Observer, ProviderStage, RunCheck, RunStage
from raf._values.context import ChatRequest, ContextResult, Invocation
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.verdict import GuardrailCheck, Verdict
from raf.errors import StreamClosedError
from raf.otel._content import messages_json, record_input
from raf.otel._guardrails import guardrail_span
from raf.otel._spans import (
    RECORDING,
    attach,
    error_type,
    failed,
    first_chunk,
    record_details,
    record_response,
    record_result,
)

__all__ = ["AttemptObserver", "ChatCall", "SpanObserver"]

_INTERNAL = SpanKind.INTERNAL
_CLIENT = SpanKind.CLIENT

# The observer -------------------------------------------------------------------------------


class SpanObserver(Observer):
    """The spans of one traced agent: its runs, provider stages, model calls and tool calls."""

    __slots__ = (
        "_agent_name",
        "_run_name",
        "capture",
        "default_model",
        "ledger",
        "metrics",
        "provider",
        "server",
        "tracer",
    )

    def __init__(
        self,
        tracer: Tracer,
        capture: bool,
        provider: str,
        default_model: str | None,
        agent_name: str | None,
        metrics: Metrics,
        server: dict[str, Any],
        ledger: ContextLedger | None = None,
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.server = server
        self.tracer = tracer
        self.capture = capture
        self.provider = provider
        self.default_model = default_model
        self._agent_name = agent_name
        self._run_name = f"invoke_agent {agent_name}" if agent_name else "invoke_agent"

    async def run(
        self, invocation: Invocation, call_next: Callable[[Invocation], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """``invoke_agent {agent}`` around the whole run."""
        model = invocation.options.model or self.default_model
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": self.provider,
            "gen_ai.conversation.id": invocation.session.id,
        }
        if self._agent_name:
            attributes["gen_ai.agent.name"] = self._agent_name
        if model:
            attributes["gen_ai.request.model"] = model
        span = self.tracer.start_span(self._run_name, kind=_INTERNAL, attributes=attributes)
        # Made current whenever it carries a trace, even unrecorded: a run that a sampler
        # dropped must keep its model and tool calls (and their HTTP calls) dropped too.
        token = (
            otel_context.attach(trace.set_span_in_context(span))
            if span.get_span_context().is_valid
            else None
        )
        recording = span.is_recording()
        # Set when it changes anything: a run inside a recorded run (an agent as a tool)
        # that is not recorded itself must say so to its own stages.
        flag = RECORDING.set(recording) if recording or RECORDING.get() else None
        try:
            if self.capture and span.is_recording():
                span.set_attribute(
                    "gen_ai.input.messages", messages_json(invocation.request_messages)
                )
            response = await call_next(invocation)
            if span.is_recording():
                record_response(span, response, self.capture)
            return response
        except BaseException as error:
            failed(span, error)
            raise
        finally:
            if flag is not None:
                RECORDING.reset(flag)
            if token is not None:
                otel_context.detach(token)
            span.end()

    async def provider_stage(self, stage: ProviderStage, call_next: RunStage) -> Any:
        """``on_invoking {provider}`` / ``on_invoked {provider}`` around one provider stage."""
        if not RECORDING.get():
            return await call_next()
        attributes = {
            "raf.provider.name": stage.name,
            "raf.provider.kind": stage.kind,
            "raf.provider.stage": stage.stage,
        }
        span = self.tracer.start_span(
            f"{stage.stage} {stage.name}", kind=_INTERNAL, attributes=attributes
        )
        token = attach(span)
        try:
            if token is not None and stage.error is not None:
                span.set_attribute("raf.run.error.type", error_type(stage.error))
            result = await call_next()
            if token is not None and isinstance(result, ContextResult):
                record_result(span, result)
            return result
        except BaseException as error:
            failed(span, error)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
            span.end()

    async def model_call(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """``chat {model}`` around each model call, retries included; its metrics."""
        model = request.options.model or self.default_model
        details = Details()
        if self.ledger is not None:
            call_next = partial(self.ledger.model_call, call_next=call_next)
        started = time.perf_counter()
        response: AgentResponse | None = None
        failure: str | None = None
        try:
            if RECORDING.get():
                response = await self._traced_call(request, call_next, model, details)
            else:
                response = await call_next(request)
            return response
        except BaseException as error:
            if not isinstance(error, StreamClosedError):
                failure = error_type(error)
            raise
        finally:
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self.provider,
                **self.server,
            }
            if model:
                attributes["gen_ai.request.model"] = model
            if response is not None and details.model is None:
                details.read(response)
            if details.model:
                attributes["gen_ai.response.model"] = details.model
            if failure is not None:
                attributes["error.type"] = failure
            self.metrics.record(time.perf_counter() - started, attributes, response)

    async def _traced_call(
        self,
        request: ChatRequest,
        call_next: Callable[[ChatRequest], Awaitable[AgentResponse]],
        model: str | None,
        details: Details,
    ) -> AgentResponse:
        options = request.options
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": self.provider,
            **self.server,
        }
        if model:
            attributes["gen_ai.request.model"] = model
        if options.temperature is not None:
            attributes["gen_ai.request.temperature"] = options.temperature
        if options.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = options.max_tokens
        if options.output_schema is not None:  # structured output asked for
            attributes["gen_ai.output.type"] = "json"
        span = self.tracer.start_span(
            f"chat {model}" if model else "chat", kind=_CLIENT, attributes=attributes
        )
        token = attach(span)
        if token is None:  # not recorded: nothing to measure
            try:
                return await call_next(request)
            finally:
                span.end()
        call = ChatCall(span, self)
        marker = CURRENT_CALL.set(call)
        try:
            if self.capture:
                record_input(span, request.messages, options.tools)
            if request.on_update is not None:
                request = attrs.evolve(
                    request, on_update=first_chunk(span, request.on_update, details)
                )
            response = await call_next(request)
            details.read(response)
            record_response(span, response, self.capture, details)
            if self.ledger is not None:  # recorded just now, with no await in between
                span.set_attributes(ledger_attributes(self.ledger.calls[-1]))
            if call.attempts > 1:
                span.set_attribute("raf.chat.attempts", call.attempts)
            return response
        except BaseException as error:
            if call.attempts > 1:
                span.set_attribute("raf.chat.attempts", call.attempts)
            record_details(span, details)
            # The last attempt's failure is this one: its exception event is recorded.
            failed(span, error, event=call.recorded is not error)
            raise
        finally:
            CURRENT_CALL.reset(marker)
            otel_context.detach(token)
            span.end()

    async def tool_call(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """``execute_tool {tool}`` around each tool call."""
        if not RECORDING.get():
            return await call_next(request)
        tool_name = str(request.tool.name)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool_name,
            "gen_ai.tool.call.id": request.call.id,
            "gen_ai.tool.type": "function",
        }
        span = self.tracer.start_span(
            f"execute_tool {tool_name}", kind=_INTERNAL, attributes=attributes
        )
        token = attach(span)
        try:
            if token is not None:
                description = getattr(request.tool, "description", None)
                if isinstance(description, str) and description:
                    span.set_attribute("gen_ai.tool.description", description)
                if self.capture:
                    span.set_attribute("gen_ai.tool.call.arguments", request.call.arguments)
            message = await call_next(request)
            if token is not None and self.capture and message.content is not None:
                span.set_attribute("gen_ai.tool.call.result", message.content)
            return message
        except BaseException as error:
            failed(span, error)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
            span.end()

    async def guardrail(self, check: GuardrailCheck, call_next: RunCheck) -> Verdict:
        """``guardrail {name}`` around each check of a guardrail, with its verdict."""
        if not RECORDING.get():
            return await call_next()
        return await guardrail_span(self.tracer, check, call_next, capture=self.capture)


class AttemptObserver(SpanObserver):
    """The observer of an agent with chat middleware, which may retry: it records attempts."""

    __slots__ = ()

    async def model_attempt(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Counts the attempts of a model call, records each failure.

        A failed attempt that a retry middleware retries is an ``exception``
        event on the chat span (with ``raf.chat.attempt``); the span's status
        stays the outcome of the whole call.
        """
        call = CURRENT_CALL.get()
        if call is None or call.owner is not self:
            # Not recorded, or the call of another agent (this one runs inside it).
            return await call_next(request)
        call.attempts += 1
        try:
            return await call_next(request)
        except Exception as error:
            call.span.record_exception(error, attributes={"raf.chat.attempt": call.attempts})
            call.recorded = error
            raise


class ChatCall:
    """The span of one model call, for the attempts inside it."""

    __slots__ = ("attempts", "owner", "recorded", "span")

    def __init__(self, span: Span, owner: SpanObserver) -> None:
        self.span = span
        self.owner = owner  # the observer (of one traced agent) that opened the span
        self.attempts = 0
        self.recorded: BaseException | None = None  # the last attempt's recorded failure


#: The model call whose span the attempts inside it report to.
CURRENT_CALL: ContextVar[ChatCall | None] = ContextVar("raf_otel_chat_call", default=None)
