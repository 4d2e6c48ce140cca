"""raf.otel: each guardrail check is a span under the span it belongs to, with its verdict."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, StatusCode

import raf.otel
from raf import (
    Agent,
    GuardrailContext,
    GuardrailError,
    InputGuardrail,
    OutputGuardrail,
    ScriptedChatClient,
    Update,
    Verdict,
    pii_redactor,
)

pytestmark = pytest.mark.anyio


async def no_secrets(text: str, context: GuardrailContext) -> Verdict:
    return Verdict.block("a secret") if "secret" in text else Verdict.allow()


def traced(agent: Agent, *, capture: bool = False) -> tuple[Agent, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return raf.otel.instrument(agent, tracer_provider=provider, capture_content=capture), exporter


async def test_each_check_is_a_span_with_its_verdict() -> None:
    client = ScriptedChatClient([["Fine. ", "The secret is out."]])
    agent, exporter = traced(
        Agent(
            client,
            name="helper",
            stack=[InputGuardrail(pii_redactor())],
            chat_stack=[OutputGuardrail(no_secrets)],
        )
    )
    with pytest.raises(GuardrailError):
        await agent.run("I am ann@example.org", on_update=ignore)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    run = spans["invoke_agent helper"]
    redact = next(s for s in exporter.get_finished_spans() if s.name == "guardrail pii_redactor")
    assert redact.parent is not None
    assert redact.parent.span_id == run.context.span_id
    assert dict(redact.attributes or {}) == {
        "raf.guardrail.name": "pii_redactor",
        "raf.guardrail.where": "input",
        "raf.guardrail.text.length": 20,
        "raf.guardrail.verdict": "rewrite",
    }
    windows = [s for s in exporter.get_finished_spans() if s.name == "guardrail no_secrets"]
    assert [(s.attributes or {})["raf.guardrail.verdict"] for s in windows] == ["allow", "block"]
    assert (windows[1].attributes or {})["raf.guardrail.reason"] == "a secret"
    assert windows[1].status.status_code is StatusCode.UNSET
    chat = next(s for s in exporter.get_finished_spans() if s.name.startswith("chat"))
    assert all(s.parent is not None and s.parent.span_id == chat.context.span_id for s in windows)
    assert run.status.status_code is StatusCode.ERROR


async def test_the_text_is_recorded_only_when_content_is_captured() -> None:
    agent, exporter = traced(
        Agent(ScriptedChatClient(["hi"]), stack=[InputGuardrail(pii_redactor())]), capture=True
    )
    await agent.run("mail ann@example.org")
    [span] = [s for s in exporter.get_finished_spans() if s.name.startswith("guardrail")]
    assert (span.attributes or {})["raf.guardrail.text"] == "mail ann@example.org"
    assert (span.attributes or {})["raf.guardrail.rewrite"] == "mail [email]"


async def test_an_unrecorded_run_opens_no_guardrail_span() -> None:
    agent = raf.otel.instrument(
        Agent(ScriptedChatClient(["hi"]), stack=[InputGuardrail(no_secrets)]),
        tracer_provider=NoOpTracerProvider(),
    )
    assert (await agent.run("hello")).text == "hi"


async def ignore(update: Update) -> None:
    """A consumer that reads the stream and keeps nothing."""
