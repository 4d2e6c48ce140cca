"""OpenTelemetry spans of raf runs, in the GenAI semantic conventions (extra ``raf-agents[otel]``).

``instrument(agent)`` returns a traced copy of an agent: the same client,
instructions, tools and stacks, with an observer (:class:`raf.observe.Observer`)
added whose hooks open the spans —

- ``run``: ``invoke_agent {agent}`` around the run;
- ``provider_stage``: ``on_invoking {provider}`` / ``on_invoked {provider}``
  around each stage of a provider (and of each member of a parallel group);
- ``model_call``: ``chat {model}`` around each model call (covering its
  retries, as the conventions ask); ``model_attempt`` records the attempts
  of an agent with chat middleware;
- ``tool_call``: ``execute_tool {tool}`` around each tool call;
- ``guardrail``: ``guardrail {name}`` around each check of a guardrail, with
  its verdict (``raf.guardrail.*``).

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

import os
from typing import Final

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from raf._agent.agent import Agent
from raf._clients.registry import client_kind
from raf._observers.ledger import ContextLedger
from raf._observers.otel_details import Metrics, server_of
from raf.otel._observer import AttemptObserver, SpanObserver

__all__ = ["CAPTURE_CONTENT_ENV", "instrument"]

#: The environment variable that turns message content capture on (``true``).
CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

_INSTRUMENTATION = "raf"


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
    is ``true``. With a :class:`raf.observe.ContextLedger` as ``ledger``, each
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
    if any(isinstance(observer, SpanObserver) for observer in agent.observers):
        raise ValueError(
            f"{agent!r} is already instrumented (it has raf.otel's observer): "
            "instrument the agent it was made from"
        )
    capture = capture_content or os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    tracer = trace.get_tracer(_INSTRUMENTATION, tracer_provider=tracer_provider)
    client = agent.chat_client
    default_model = getattr(client, "model", None)
    # Attempts can differ from calls only with chat middleware in between (a retry).
    observer = (AttemptObserver if agent.chat_stack else SpanObserver)(
        tracer,
        capture,
        gen_ai_provider_name(client),
        default_model if isinstance(default_model, str) and default_model else None,
        agent.name,
        Metrics(otel_metrics.get_meter(_INSTRUMENTATION, meter_provider=meter_provider)),
        server_of(client),
        ledger,
    )
    # Outermost: the other observers' work nests under raf's spans.
    return agent.replace(observers=[observer, *agent.observers])


def gen_ai_provider_name(client: object) -> str:
    """``gen_ai.provider.name`` for a chat client.

    A client of a class in the registry of chat clients is named as the
    registry says (``"openai"``, ``"anthropic"``, ``"echo"``); any other by
    its own ``provider_name`` (a ``str``; ``GeminiChatClient``, which the
    registry builds through its extra's import, says ``"gcp.gemini"``), or
    else its ``gen_ai_provider_name``; else by its class name without the
    ``ChatClient`` / ``Client`` suffix, lower-cased (``ScriptedChatClient``
    -> ``"scripted"``).
    """
    kind = client_kind(client)
    if kind is not None:
        return kind.provider_name
    for attribute in ("provider_name", "gen_ai_provider_name"):
        declared = getattr(client, attribute, None)
        if isinstance(declared, str) and declared:
            return declared
    name = type(client).__name__
    for suffix in ("ChatClient", "Client"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return name.lower()
