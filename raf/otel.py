"""OpenTelemetry spans of raf runs, in the GenAI semantic conventions (extra ``raf-agents[otel]``).

``instrument(agent)`` returns a traced copy of an agent: the same client,
instructions, tools and stacks, with an observer (:class:`raf.Observer`)
added whose hooks open the spans —

- ``run``: ``invoke_agent {agent}`` around the run;
- ``provider_stage``: ``on_invoking {provider}`` / ``on_invoked {provider}``
  around each stage of a provider (and of each member of a parallel group);
- ``model_call``: ``chat {model}`` around each model call (covering its
  retries, as the conventions ask); ``model_attempt`` records the attempts
  of an agent with chat middleware;
- ``tool_call``: ``execute_tool {tool}`` around each tool call (guardrails: ``GuardrailSpans``).

Spans are made current with OpenTelemetry's contextvars-based context, so
they nest under the span that was current when the run started, and
whatever the providers, the model client and the tools trace nests under
them. raf only uses ``opentelemetry-api``: it never configures a tracer
provider (``tracer_provider=None`` means the global one, whatever the
application sets, now or later). With a ``meter_provider`` (or the global
one), each model call is also measured: the ``gen_ai.client.operation.duration``
and ``gen_ai.client.token.usage`` histograms of the conventions.

A consumer that leaves a stream early (a reader pressing Stop) is not an
error: the ``invoke_agent`` and ``chat`` spans get ``raf.stream.closed`` and
keep an unset status.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar, Token
from functools import partial
from typing import Any, Final

import attrs
from opentelemetry import context as otel_context
from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from raf._agent.agent import Agent
from raf._agent.tool_loop import ToolRequest
from raf._errors import StreamClosedError
from raf._observers.ledger import ContextLedger
from raf._observers.otel_details import Details, Metrics, ledger_attributes, server_of
from raf._observers.otel_guardrail import GuardrailSpans
from raf._onion.observe import Observer, ProviderStage, RunStage
from raf._values.context import ChatRequest, ContextResult, Invocation
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate, Update

__all__ = ["CAPTURE_CONTENT_ENV", "instrument"]

#: The environment variable that turns message content capture on (``true``).
CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

_INSTRUMENTATION = "raf"
_INTERNAL = SpanKind.INTERNAL
_CLIENT = SpanKind.CLIENT


def instrument(
    agent: Agent,
    *,
    tracer_provider: TracerProvider | None = None,
    capture_content: bool = False,
    meter_provider: MeterProvider | None = None,
    ledger: ContextLedger | None = None,
) -> Agent:
    """A traced copy of ``agent``: OpenTelemetry spans for its runs, stages, model and tool calls.

    ``tracer_provider=None`` uses the global tracer provider (the one the
    application sets with ``opentelemetry.trace.set_tracer_provider``), and
    ``meter_provider=None`` the global meter provider, for the metrics of
    each model call (``gen_ai.client.operation.duration``,
    ``gen_ai.client.token.usage``).
    Message content (the messages, the system instructions, tool arguments
    and results) is recorded only when ``capture_content`` is true or the
    environment variable ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
    is ``true``. With a :class:`raf.ContextLedger` as ``ledger``, each
    ``chat`` span also carries the call's figures (``raf.context.*``: the
    prompt's tokens, per layer, shared with the previous call, cached, the
    layer that broke the cache), and the ledger records the calls as if it
    were one of the agent's observers (do not add it there too). The agent
    itself is not changed (an agent is read-only).

    >>> from raf import Agent, EchoChatClient
    >>> from opentelemetry.trace import NoOpTracerProvider
    >>> traced = instrument(Agent(EchoChatClient(), name="helper"),
    ...                     tracer_provider=NoOpTracerProvider())
    >>> traced.run_sync("hi").text
    'hi'
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"raf.otel.instrument() takes a raf.Agent, got {type(agent).__name__}")
    if any(isinstance(observer, _Observer) for observer in agent.observers):
        raise ValueError(
            f"{agent!r} is already instrumented (it has raf.otel's observer): "
            "instrument the agent it was made from"
        )
    capture = capture_content or os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    tracer = trace.get_tracer(_INSTRUMENTATION, tracer_provider=tracer_provider)
    client = agent.chat_client
    default_model = getattr(client, "model", None)
    # Attempts can differ from calls only with chat middleware in between (a retry).
    observer = (_ObserverOfAttempts if agent.chat_stack else _Observer)(
        tracer,
        capture,
        gen_ai_provider_name(client),
        default_model if isinstance(default_model, str) and default_model else None,
        agent.name,
        Metrics(otel_metrics.get_meter(_INSTRUMENTATION, meter_provider=meter_provider)),
        server_of(client),
        ledger,
    )
    return Agent(
        client,
        name=agent.name,
        instructions=agent.instructions,
        tools=agent.tools,
        stack=agent.stack,
        chat_stack=agent.chat_stack,
        tool_stack=agent.tool_stack,
        post_timeout=agent.post_timeout,
        # Outermost: the other observers' work nests under raf's spans.
        observers=[observer, GuardrailSpans(tracer, capture), *agent.observers],
    )


def gen_ai_provider_name(client: object) -> str:
    """``gen_ai.provider.name`` for a chat client.

    A client's own ``gen_ai_provider_name`` attribute (a ``str``) wins;
    raf's OpenAI clients are ``"openai"``; any other client is its class
    name without the ``ChatClient`` / ``Client`` suffix, lower-cased
    (``EchoChatClient`` -> ``"echo"``).
    """
    declared = getattr(client, "gen_ai_provider_name", None)
    if isinstance(declared, str) and declared:
        return declared
    cls = type(client)
    if cls.__module__.startswith("raf._clients.openai") or cls.__name__.startswith("OpenAI"):
        return "openai"
    name = cls.__name__
    for suffix in ("ChatClient", "Client"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return name.lower()


# Starting and ending spans ------------------------------------------------------------------

#: Whether the run the current task works for has a recorded invoke_agent span. The spans
#: inside a run are started only then: a run that is not recorded (a no-op tracer provider,
#: or sampled out, which every standard sampler decides for the whole trace) costs its
#: stages, model and tool calls a context-variable lookup each, no span.
_RECORDING: ContextVar[bool] = ContextVar("raf_otel_recording", default=False)


def _attach(span: Span) -> Token[Context] | None:
    # Only a recording span is made current: a no-op tracer's spans cost no context switch,
    # and what runs inside them nests under the nearest recorded span.
    if span.is_recording():
        return otel_context.attach(trace.set_span_in_context(span))
    return None


def _failed(span: Span, error: BaseException, *, event: bool = True) -> None:
    """Status ERROR, ``error.type`` and an ``exception`` event (unless one was recorded
    already): the error passed through here. A consumer that left a stream early is
    no error: ``raf.stream.closed``, the status left unset."""
    if not span.is_recording():
        return
    if isinstance(error, StreamClosedError):
        span.set_attribute("raf.stream.closed", True)
        return
    kind = _error_type(error)
    span.set_attribute("error.type", kind)
    if event:
        span.record_exception(error, escaped=True)
    span.set_status(Status(StatusCode.ERROR, f"{kind}: {_text_of(error)}"))


def _error_type(error: BaseException) -> str:
    cls = type(error)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def _text_of(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # a broken __str__ must not break the span
        return "(its message cannot be shown)"


# The observer -------------------------------------------------------------------------------


class _Observer(Observer):
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
        flag = _RECORDING.set(recording) if recording or _RECORDING.get() else None
        try:
            if self.capture and span.is_recording():
                span.set_attribute(
                    "gen_ai.input.messages", _messages_json(invocation.request_messages)
                )
            response = await call_next(invocation)
            if span.is_recording():
                _record_response(span, response, self.capture)
            return response
        except BaseException as error:
            _failed(span, error)
            raise
        finally:
            if flag is not None:
                _RECORDING.reset(flag)
            if token is not None:
                otel_context.detach(token)
            span.end()

    async def provider_stage(self, stage: ProviderStage, call_next: RunStage) -> Any:
        """``on_invoking {provider}`` / ``on_invoked {provider}`` around one provider stage."""
        if not _RECORDING.get():
            return await call_next()
        attributes = {
            "raf.provider.name": stage.name,
            "raf.provider.kind": stage.kind,
            "raf.provider.stage": stage.stage,
        }
        span = self.tracer.start_span(
            f"{stage.stage} {stage.name}", kind=_INTERNAL, attributes=attributes
        )
        token = _attach(span)
        try:
            if token is not None and stage.error is not None:
                span.set_attribute("raf.run.error.type", _error_type(stage.error))
            result = await call_next()
            if token is not None and isinstance(result, ContextResult):
                _record_result(span, result)
            return result
        except BaseException as error:
            _failed(span, error)
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
        error_type: str | None = None
        try:
            if _RECORDING.get():
                response = await self._traced_call(request, call_next, model, details)
            else:
                response = await call_next(request)
            return response
        except BaseException as error:
            if not isinstance(error, StreamClosedError):
                error_type = _error_type(error)
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
            if error_type is not None:
                attributes["error.type"] = error_type
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
        token = _attach(span)
        if token is None:  # not recorded: nothing to measure
            try:
                return await call_next(request)
            finally:
                span.end()
        call = _ChatCall(span, self)
        marker = _CURRENT_CALL.set(call)
        try:
            if self.capture:
                _record_input(span, request.messages, options.tools)
            if request.on_update is not None:
                request = attrs.evolve(
                    request, on_update=_first_chunk(span, request.on_update, details)
                )
            response = await call_next(request)
            details.read(response)
            _record_response(span, response, self.capture, details)
            if self.ledger is not None:  # recorded just now, with no await in between
                span.set_attributes(ledger_attributes(self.ledger.calls[-1]))
            if call.attempts > 1:
                span.set_attribute("raf.chat.attempts", call.attempts)
            return response
        except BaseException as error:
            if call.attempts > 1:
                span.set_attribute("raf.chat.attempts", call.attempts)
            _record_details(span, details)
            # The last attempt's failure is this one: its exception event is recorded.
            _failed(span, error, event=call.recorded is not error)
            raise
        finally:
            _CURRENT_CALL.reset(marker)
            otel_context.detach(token)
            span.end()

    async def tool_call(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """``execute_tool {tool}`` around each tool call."""
        if not _RECORDING.get():
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
        token = _attach(span)
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
            _failed(span, error)
            raise
        finally:
            if token is not None:
                otel_context.detach(token)
            span.end()


class _ObserverOfAttempts(_Observer):
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
        call = _CURRENT_CALL.get()
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


def _record_response(
    span: Span, response: AgentResponse, capture: bool, details: Details | None = None
) -> None:
    usage = response.usage
    if usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
        if usage.cached_input_tokens:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens)
        if usage.reasoning_tokens:
            span.set_attribute("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens)
    if details is None:
        details = Details()
        details.read(response)
    _record_details(span, details)
    if capture:
        span.set_attribute("gen_ai.output.messages", _messages_json(response.messages))


def _record_details(span: Span, details: Details) -> None:
    """The response's id, model and finish reasons, as far as they are known."""
    if details.model:
        span.set_attribute("gen_ai.response.model", details.model)
    if details.id:
        span.set_attribute("gen_ai.response.id", details.id)
    if details.finish_reasons:
        span.set_attribute("gen_ai.response.finish_reasons", details.finish_reasons)


def _record_result(span: Span, result: ContextResult) -> None:
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


class _ChatCall:
    """The span of one model call, for the attempts inside it."""

    __slots__ = ("attempts", "owner", "recorded", "span")

    def __init__(self, span: Span, owner: _Observer) -> None:
        self.span = span
        self.owner = owner  # the observer (of one traced agent) that opened the span
        self.attempts = 0
        self.recorded: BaseException | None = None  # the last attempt's recorded failure


#: The model call whose span the attempts inside it report to.
_CURRENT_CALL: ContextVar[_ChatCall | None] = ContextVar("raf_otel_chat_call", default=None)


def _first_chunk(span: Span, on_update: OnUpdate, details: Details) -> OnUpdate:
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


# Content, when asked for --------------------------------------------------------------------


def _record_input(span: Span, messages: Sequence[ChatMessage], tools: Sequence[Any]) -> None:
    system = [message.content or "" for message in messages if message.role == "system"]
    if system:
        span.set_attribute(
            "gen_ai.system_instructions",
            json.dumps([{"type": "text", "content": text} for text in system], ensure_ascii=False),
        )
    others = [message for message in messages if message.role != "system"]
    span.set_attribute("gen_ai.input.messages", _messages_json(others))
    if tools:
        span.set_attribute(
            "gen_ai.tool.definitions",
            json.dumps(
                [
                    {
                        "type": "function",
                        "name": str(tool.name),
                        "description": str(getattr(tool, "description", "")),
                        "parameters": dict(getattr(tool, "parameters", {})),
                    }
                    for tool in tools
                ],
                ensure_ascii=False,
                default=str,
            ),
        )


def _messages_json(messages: Sequence[ChatMessage]) -> str:
    """Messages in the GenAI conventions' JSON shape: a role and a list of parts."""
    return json.dumps([_message_parts(message) for message in messages], ensure_ascii=False)


def _message_parts(message: ChatMessage) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        )
    elif message.content is not None:
        parts.append({"type": "text", "content": message.content})
    for call in message.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return {"role": message.role, "parts": parts}
