"""raf.otel against the GenAI semantic conventions (opentelemetry-instrumentation-openai-v2 as
the reference): response attributes of streamed calls, finish reasons, the server, metrics,
an early close that is not an error, one exception event per failure."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import raf.otel
from raf import (
    Agent,
    AgentResponse,
    AnthropicChatClient,
    ChatMessage,
    OpenAIChatClient,
    OpenAIResponsesClient,
    RetryMiddleware,
    ScriptedChatClient,
    Usage,
)
from raf.errors import RateLimitError
from tests._harness.anthropic_server import AnthropicServer
from tests._harness.openai_server import OpenAIServer, Reply, completion, text_stream
from tests._harness.responses_server import ResponsesServer, response_body

pytestmark = pytest.mark.anyio


class Telemetry:
    """A local tracer provider and meter provider, with in-memory exporter and reader."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        found: list[Any] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for each in scope.metrics:
                    if each.name == metric:
                        found += list(each.data.data_points)
        return found

    def instrument(self, agent: Agent) -> Agent:
        return raf.otel.instrument(
            agent, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    made = Telemetry()
    yield made
    made.tracer_provider.shutdown()
    made.meter_provider.shutdown()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = OpenAIServer()
    yield running
    running.close()


def port_of(server: OpenAIServer) -> int:
    return int(server.base_url.split(":")[2].split("/")[0])


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_the_chat_span_has_the_response_the_finish_and_the_server(
    telemetry: Telemetry, server: OpenAIServer, streamed: bool
) -> None:
    if streamed:
        server.reply(Reply(events=text_stream("Hel", "lo")))
    else:
        server.answer(completion("Hello"))
    async with OpenAIChatClient(
        "test-model", base_url=server.base_url, api_key="k", max_retries=0
    ) as model:
        agent = telemetry.instrument(Agent(model))
        if streamed:
            async with agent.stream("hi") as stream:
                async for _ in stream:
                    pass
        else:
            await agent.run("hi")
    (chat,) = telemetry.named("chat test-model")
    found = attrs_of(chat)
    assert found["gen_ai.response.id"] == "chatcmpl-test"
    assert found["gen_ai.response.model"] == "test-model"
    assert tuple(found["gen_ai.response.finish_reasons"]) == ("stop",)
    assert found["server.address"] == "127.0.0.1"
    assert found["server.port"] == port_of(server)


async def test_metrics_of_a_model_call(telemetry: Telemetry, server: OpenAIServer) -> None:
    server.answer(completion("Hello", usage=(5, 2)))
    async with OpenAIChatClient(
        "test-model", base_url=server.base_url, api_key="k", max_retries=0
    ) as model:
        await telemetry.instrument(Agent(model)).run("hi")
    [duration] = telemetry.points("gen_ai.client.operation.duration")
    assert duration.count == 1
    assert duration.sum > 0
    assert dict(duration.attributes).items() >= {
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "openai"),
        ("gen_ai.request.model", "test-model"),
        ("gen_ai.response.model", "test-model"),
        ("server.address", "127.0.0.1"),
        ("server.port", port_of(server)),
    }
    tokens = {
        p.attributes["gen_ai.token.type"]: p for p in telemetry.points("gen_ai.client.token.usage")
    }
    assert {kind: (p.count, p.sum) for kind, p in tokens.items()} == {
        "input": (1, 5),
        "output": (1, 2),
    }


async def test_a_failed_call_is_measured_with_its_error_type(telemetry: Telemetry) -> None:
    model = ScriptedChatClient([RateLimitError("slow down")])
    with pytest.raises(RateLimitError):
        await telemetry.instrument(Agent(model)).run("hi")
    [duration] = telemetry.points("gen_ai.client.operation.duration")
    assert duration.attributes["error.type"] == "raf.errors.RateLimitError"
    assert telemetry.points("gen_ai.client.token.usage") == []


async def test_cache_and_reasoning_tokens(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    responses = ResponsesServer()
    try:
        responses.answer(response_body("ok", usage=(11, 3), cached=8, reasoning_tokens=2))
        async with OpenAIResponsesClient(
            "test-model", base_url=responses.base_url, api_key="k", max_retries=0
        ) as model:
            await telemetry.instrument(Agent(model)).run("hi")
    finally:
        responses.close()
    (chat,) = telemetry.named("chat test-model")
    found = attrs_of(chat)
    assert found["gen_ai.usage.cache_read.input_tokens"] == 8
    assert found["gen_ai.usage.reasoning.output_tokens"] == 2
    assert tuple(found["gen_ai.response.finish_reasons"]) == ("stop",)


async def test_an_anthropic_call_names_its_provider_and_its_cache_reads_and_writes(
    telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = AnthropicServer()
    try:
        server.answer(text="ok", usage=(11, 3), cache_read=100, cache_write=20)
        async with AnthropicChatClient(
            "test-model", base_url=server.root_url, api_key="sk-ant", max_retries=0
        ) as model:
            assert model.provider_name == "anthropic"
            await telemetry.instrument(Agent(model)).run("hi")
    finally:
        server.close()
    (run,) = telemetry.named("invoke_agent")
    assert attrs_of(run)["gen_ai.provider.name"] == "anthropic"
    (chat,) = telemetry.named("chat test-model")
    found = attrs_of(chat)
    assert found["gen_ai.provider.name"] == "anthropic"
    # Both cache figures are part of the input, as the conventions ask.
    assert found["gen_ai.usage.input_tokens"] == 131
    assert found["gen_ai.usage.cache_read.input_tokens"] == 100
    assert found["gen_ai.usage.cache_creation.input_tokens"] == 20


async def test_no_cache_write_no_cache_creation_attribute(telemetry: Telemetry) -> None:
    model = ScriptedChatClient([AgentResponse((ChatMessage.assistant("ok"),), Usage(9, 1))])
    await telemetry.instrument(Agent(model)).run("hi")
    (chat,) = telemetry.named("chat")
    found = attrs_of(chat)
    assert found["gen_ai.usage.input_tokens"] == 9
    assert "gen_ai.usage.cache_creation.input_tokens" not in found
    assert "gen_ai.usage.cache_read.input_tokens" not in found


async def test_a_reader_pressing_stop_is_not_an_error(telemetry: Telemetry) -> None:
    agent = telemetry.instrument(Agent(ScriptedChatClient([["one ", "two ", "three"]])))
    async with agent.stream("count") as stream:
        async for _ in stream:
            break
    (run,) = telemetry.named("invoke_agent")
    (chat,) = telemetry.named("chat")
    for span in (run, chat):
        assert span.status.status_code is StatusCode.UNSET, span.name
        assert "error.type" not in attrs_of(span)
        assert attrs_of(span)["raf.stream.closed"] is True
        assert [event.name for event in span.events] == []
    [duration] = telemetry.points("gen_ai.client.operation.duration")
    assert "error.type" not in duration.attributes


@pytest.mark.parametrize(("failures", "with_retry"), [(1, False), (1, True), (2, True)])
async def test_the_exception_event_is_recorded_once_per_failure(
    telemetry: Telemetry, failures: int, with_retry: bool
) -> None:
    model = ScriptedChatClient([RateLimitError(f"slow down {n}") for n in range(failures)])
    stack = [RetryMiddleware(attempts=failures, wait_initial=0)] if with_retry else []
    with pytest.raises(RateLimitError):
        await telemetry.instrument(Agent(model, chat_stack=stack)).run("hi")
    (chat,) = telemetry.named("chat")
    assert [event.name for event in chat.events] == ["exception"] * failures
    assert chat.status.status_code is StatusCode.ERROR
