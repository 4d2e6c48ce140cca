"""FallbackMiddleware: a retryable failure sends the same call to the next client, over real
HTTP (two loopback OpenAI servers) and offline; streamed calls only before the first update."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

import raf.otel
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ChatRequest,
    FallbackMiddleware,
    LoggingMiddleware,
    OpenAIChatClient,
    RetryMiddleware,
    ScriptedChatClient,
    Update,
    tool,
)
from raf.errors import BadRequestError, ChatConnectionError, RateLimitError, ServerError
from tests._harness.openai_server import OpenAIServer, Reply, chunk, text_stream

pytestmark = pytest.mark.anyio


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[OpenAIServer, OpenAIServer]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    primary, backup = OpenAIServer(), OpenAIServer()
    yield primary, backup
    primary.close()
    backup.close()


def client(server: OpenAIServer, model: str) -> OpenAIChatClient:
    return OpenAIChatClient(model, base_url=server.base_url, api_key="sk", max_retries=0)


async def collect(agent: Agent, text: str = "hi") -> tuple[AgentResponse | None, list[Update]]:
    updates: list[Update] = []
    async with agent.stream(text) as stream:
        async for update in stream:
            updates.append(update)
    return stream.response, updates


async def test_a_retryable_failure_goes_to_the_fallback_with_its_own_model(
    servers: tuple[OpenAIServer, OpenAIServer],
) -> None:
    primary, backup = servers
    primary.fail(503)
    backup.answer(content="from the backup", model="backup-model-2024")
    agent = Agent(
        client(primary, "primary-model"),
        chat_stack=[LoggingMiddleware(), FallbackMiddleware(client(backup, "backup-model"))],
    )
    with capture_logs() as logs:
        async with agent:
            response = await agent.run("hi")
    assert response.text == "from the backup"
    assert response.model == "backup-model-2024"  # the server's own name for it
    (first,) = primary.requests
    (second,) = backup.requests
    assert first.body["model"] == "primary-model"
    assert second.body["model"] == "backup-model"
    assert second.body["messages"] == first.body["messages"]
    (fallback,) = [e for e in logs if e["event"] == "model.fallback"]
    assert fallback["from_model"] == "primary-model"
    assert fallback["to_model"] == "backup-model"
    assert fallback["error_type"] == "ServerError"
    (end,) = [e for e in logs if e["event"] == "model.end"]
    assert end["model"] == "backup-model-2024"
    assert end["outcome"] == "ok"


async def test_a_bad_request_does_not_fall_back(
    servers: tuple[OpenAIServer, OpenAIServer],
) -> None:
    primary, backup = servers
    primary.fail(400, "bad")
    agent = Agent(client(primary, "p"), chat_stack=[FallbackMiddleware(client(backup, "b"))])
    async with agent:
        with pytest.raises(BadRequestError):
            await agent.run("hi")
    assert backup.requests == []


async def test_a_stream_that_fails_before_its_first_update_falls_back(
    servers: tuple[OpenAIServer, OpenAIServer],
) -> None:
    primary, backup = servers
    primary.fail(429)
    backup.reply(Reply(events=text_stream("back", "up")))
    agent = Agent(client(primary, "p"), chat_stack=[FallbackMiddleware(client(backup, "b"))])
    async with agent:
        response, updates = await collect(agent)
    assert response is not None
    assert response.text == "backup"
    assert response.model == "b"
    assert [u.text for u in updates if u.kind == "text"] == ["back", "up"]
    assert backup.requests[0].body["stream"] is True


async def test_a_stream_that_fails_after_its_first_update_does_not_fall_back(
    servers: tuple[OpenAIServer, OpenAIServer],
) -> None:
    primary, backup = servers
    # The first chunk goes out, then the connection is cut: the consumer has seen "Hel".
    primary.reply(Reply(events=(chunk("Hel", role="assistant"),), done=False, cut=True))
    agent = Agent(client(primary, "p"), chat_stack=[FallbackMiddleware(client(backup, "b"))])
    seen: list[Update] = []

    async def consume() -> None:
        async with agent.stream("hi") as stream:
            async for update in stream:
                seen.append(update)

    async with agent:
        with pytest.raises(ChatConnectionError):
            await consume()
    assert [u.text for u in seen] == ["Hel"]
    assert backup.requests == []


# --- Offline: the rules -------------------------------------------------------------------


class Named(ScriptedChatClient):
    """A scripted client with a model name, as a real client has."""

    def __init__(self, model: str, script: list[Any]) -> None:
        super().__init__(script)
        self.model = model


async def test_clients_are_tried_in_order_and_the_last_error_carries_the_others() -> None:
    first, second, third = (
        Named("a", [RateLimitError("a busy")]),
        Named("b", [ServerError("b down")]),
        Named("c", [ChatConnectionError("c away")]),
    )
    agent = Agent(first, chat_stack=[FallbackMiddleware(second, third)])
    with pytest.raises(ChatConnectionError) as caught:
        await agent.run("hi")
    notes = caught.value.__notes__
    assert notes == [
        "raf: fallback: before it, model 'a' failed: RateLimitError: a busy",
        "raf: fallback: before it, model 'b' failed: ServerError: b down",
    ]
    assert third.requests[0].options.model == "c"


async def test_a_non_retryable_error_of_a_fallback_stops_there() -> None:
    first, second, third = (
        Named("a", [ServerError("down")]),
        Named("b", [BadRequestError("no")]),
        Named("c", ["never"]),
    )
    agent = Agent(first, chat_stack=[FallbackMiddleware(second, third)])
    with pytest.raises(BadRequestError):
        await agent.run("hi")
    assert third.requests == []


async def test_fallback_on_names_the_errors_that_fall_back() -> None:
    first = Named("a", [ValueError("odd")])
    agent = Agent(
        first, chat_stack=[FallbackMiddleware(Named("b", ["ok"]), fallback_on=(ValueError,))]
    )
    assert (await agent.run("hi")).text == "ok"


async def test_a_retry_inside_it_retries_the_primary_first() -> None:
    first = Named("a", [ServerError("1"), ServerError("2")])
    backup = Named("b", ["backup"])
    agent = Agent(
        first,
        chat_stack=[FallbackMiddleware(backup), RetryMiddleware(attempts=2, wait_initial=0)],
    )
    response = await agent.run("hi")
    assert response.text == "backup"
    assert len(first.requests) == 2


async def test_the_answer_of_the_primary_is_left_as_it_is() -> None:
    agent = Agent(Named("a", ["fine"]), chat_stack=[FallbackMiddleware(Named("b", []))])
    response = await agent.run("hi")
    assert response.text == "fine"
    assert response.model is None


async def test_the_run_says_which_model_answered_after_tool_calls() -> None:
    from raf import ToolCall

    @tool
    def now() -> str:
        """The time."""
        return "noon"

    primary = Named("a", [ScriptedChatClient.tool_turn(ToolCall("1", "now")), ServerError("x")])
    agent = Agent(
        primary,
        tools=[now],
        stack=[LoggingMiddleware()],
        chat_stack=[FallbackMiddleware(Named("b", ["it is noon"]))],
    )
    with capture_logs() as logs:
        response = await agent.run("time?")
    assert response.text == "it is noon"
    assert response.model == "b"
    (end,) = [e for e in logs if e["event"] == "run.end"]
    assert end["model"] == "b"


async def test_otel_says_which_model_answered() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(
        Named("a", [ServerError("down")]),
        chat_stack=[FallbackMiddleware(Named("b", ["ok"]))],
    )
    traced = raf.otel.instrument(agent, tracer_provider=provider)
    await traced.run("hi")
    (chat,) = [span for span in exporter.get_finished_spans() if span.name.startswith("chat")]
    attributes = dict(chat.attributes or {})
    assert attributes["gen_ai.request.model"] == "a"
    assert attributes["gen_ai.response.model"] == "b"
    assert "gen_ai.output.type" not in attributes


async def test_otel_says_a_structured_call_asks_for_json() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = raf.otel.instrument(Agent(Named("a", ['{"value": 1}'])), tracer_provider=provider)
    assert (await agent.run("hi", output_type=int)).output == 1
    (chat,) = [span for span in exporter.get_finished_spans() if span.name.startswith("chat")]
    assert dict(chat.attributes or {})["gen_ai.output.type"] == "json"
    provider.shutdown()
    provider.shutdown()


async def test_it_belongs_in_the_chat_stack_and_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match="at least one"):
        FallbackMiddleware()
    with pytest.raises(TypeError, match="chat_clients\\[0\\]"):
        FallbackMiddleware("gpt")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fallback_on"):
        FallbackMiddleware(Named("b", []), fallback_on=ValueError)  # type: ignore[arg-type]
    agent = Agent(Named("a", ["x"]), stack=[FallbackMiddleware(Named("b", []))])
    with pytest.raises(TypeError, match="chat_stack"):
        await agent.run("hi")


async def test_aclose_closes_the_fallback_clients() -> None:
    closed: list[str] = []

    class Closing(Named):
        async def aclose(self) -> None:
            closed.append(self.model)

    agent = Agent(
        Named("a", []), chat_stack=[FallbackMiddleware(Closing("b", []), Closing("c", []))]
    )
    await agent.aclose()
    assert closed == ["c", "b"]


async def test_a_direct_call_with_a_chat_request() -> None:
    middleware = FallbackMiddleware(Named("b", ["ok"]))

    async def failing(request: ChatRequest) -> AgentResponse:
        raise ServerError("down")

    request = ChatRequest((ChatMessage.user("hi"),), ChatOptions(model="a"))
    response = await middleware(request, failing)
    assert response.text == "ok"
    assert response.model == "b"
    assert repr(middleware) == "FallbackMiddleware(Named)"
