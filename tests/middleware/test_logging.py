"""LoggingMiddleware: start and end events per run and per model call, with a run id."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import pytest
import structlog
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs

from raf import (
    Agent,
    AgentRunOptions,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    EchoChatClient,
    InMemorySession,
    LoggingMiddleware,
    OpenAIChatClient,
    ScriptedChatClient,
    ToolCall,
    tool,
)
from raf.errors import RateLimitError
from tests._harness.openai_server import OpenAIServer, Reply, text_stream

pytestmark = pytest.mark.anyio


def events(logs: list[dict[str, Any]], *names: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] in names]


@tool
def shout(text: str) -> str:
    """Shout the text."""
    return text.upper()


async def test_run_level_start_and_end_events() -> None:
    session = InMemorySession("s-1")
    agent = Agent(EchoChatClient(), name="echo", tools=[shout], stack=[LoggingMiddleware()])
    with capture_logs(processors=[merge_contextvars]) as logs:
        await agent.run("hello", session=session)
    start, end = events(logs, "run.start", "run.end")
    assert start["event"] == "run.start"
    assert start["agent"] == "echo"
    assert start["session_id"] == "s-1"
    assert start["request_messages"] == 1
    assert start["tools"] == 1
    assert end["outcome"] == "ok"
    assert end["log_level"] == "info"
    assert isinstance(end["duration_ms"], float)
    assert end["duration_ms"] >= 0
    assert (end["messages"], end["tool_calls"]) == (1, 0)
    assert (end["input_tokens"], end["output_tokens"]) == (1, 1)
    assert start["run_id"] == end["run_id"]
    assert len(start["run_id"]) == 16


async def test_each_run_gets_its_own_id_and_the_id_does_not_leak() -> None:
    agent = Agent(EchoChatClient(), stack=[LoggingMiddleware()])
    with capture_logs(processors=[merge_contextvars]) as logs:
        await agent.run("one")
        await agent.run("two")
    ids = [entry["run_id"] for entry in events(logs, "run.end")]
    assert len(set(ids)) == 2
    assert "run_id" not in structlog.contextvars.get_contextvars()


async def test_model_calls_in_the_chat_stack_share_the_run_id() -> None:
    model = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(ToolCall("c1", "shout", '{"text": "hi"}')),
            "HI",
        ]
    )
    agent = Agent(
        model, tools=[shout], stack=[LoggingMiddleware()], chat_stack=[LoggingMiddleware()]
    )
    with capture_logs(processors=[merge_contextvars]) as logs:
        await agent.run("shout hi")
    names = [entry["event"] for entry in logs]
    assert names == ["run.start", "model.start", "model.end", "model.start", "model.end", "run.end"]
    assert len({entry["run_id"] for entry in logs}) == 1
    first_start, first_end, second_start, second_end = events(logs, "model.start", "model.end")
    assert (first_start["messages"], first_start["tools"]) == (1, 1)
    assert first_end["tool_calls"] == 1
    assert second_start["messages"] == 3
    assert second_end["tool_calls"] == 0
    run_end = events(logs, "run.end")[0]
    assert (run_end["messages"], run_end["tool_calls"]) == (3, 1)


async def test_model_calls_alone_bind_their_own_run_id() -> None:
    agent = Agent(EchoChatClient(), chat_stack=[LoggingMiddleware()])
    with capture_logs(processors=[merge_contextvars]) as logs:
        await agent.run("x")
    start, end = logs
    assert start["run_id"] == end["run_id"]


async def test_events_logged_inside_the_run_carry_the_run_id() -> None:
    class Chatty(ContextProvider):
        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            structlog.get_logger("app").info("provider.hello")
            return ContextResult()

    agent = Agent(EchoChatClient(), stack=[LoggingMiddleware(), Chatty()])
    with capture_logs(processors=[merge_contextvars]) as logs:
        await agent.run("x")
    hello = events(logs, "provider.hello")[0]
    assert hello["run_id"] == events(logs, "run.end")[0]["run_id"]


async def test_a_failed_call_logs_the_error_outcome() -> None:
    agent = Agent(
        ScriptedChatClient([RateLimitError("slow down", status_code=429)]),
        stack=[LoggingMiddleware()],
        chat_stack=[LoggingMiddleware()],
    )
    with capture_logs() as logs, pytest.raises(RateLimitError):
        await agent.run("x")
    model_end, run_end = events(logs, "model.end", "run.end")
    for end in (model_end, run_end):
        assert end["outcome"] == "error"
        assert end["log_level"] == "error"
        assert end["error_type"] == "RateLimitError"
        assert end["error"] == "slow down"
        assert end["duration_ms"] >= 0


async def test_a_cancelled_call_logs_the_cancelled_outcome() -> None:
    with anyio.CancelScope() as scope:

        async def hang(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
            scope.cancel()
            await anyio.sleep_forever()
            return "unreachable"

        agent = Agent(ScriptedChatClient([hang]), stack=[LoggingMiddleware()])
        with capture_logs() as logs:
            await agent.run("x")
    (end,) = events(logs, "run.end")
    assert end["outcome"] == "cancelled"


async def test_a_given_logger_is_used() -> None:
    with capture_logs() as logs:
        logger = structlog.get_logger("mine").bind(component="agent")
        agent = Agent(EchoChatClient(), stack=[LoggingMiddleware(logger=logger)])
        await agent.run("x")
    assert all(entry["component"] == "agent" for entry in logs)
    assert len(logs) == 2


async def test_usage_is_none_when_the_client_reports_none() -> None:
    agent = Agent(ScriptedChatClient(["plain"]), chat_stack=[LoggingMiddleware()])
    with capture_logs() as logs:
        response = await agent.run("x")
    assert response.usage is None
    end = events(logs, "model.end")[0]
    assert end["input_tokens"] is None


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = OpenAIServer()
    yield running
    running.close()


async def test_the_model_that_answered_is_logged_not_none(server: OpenAIServer) -> None:
    # The client's default model is used: the run names none.
    server.answer(model="test-model-2024-07-18")
    model = OpenAIChatClient("test-model", base_url=server.base_url, api_key="k", max_retries=0)
    async with model:
        agent = Agent(model, stack=[LoggingMiddleware()], chat_stack=[LoggingMiddleware()])
        with capture_logs() as logs:
            await agent.run("x")
    run_start, model_start, model_end, run_end = logs
    assert run_start["model"] == "test-model"
    assert model_start["model"] == "test-model"  # the client's default, named: never None
    assert model_end["model"] == "test-model-2024-07-18"
    assert run_end["model"] == "test-model-2024-07-18"


async def test_a_streamed_call_logs_the_model_its_chunks_name(server: OpenAIServer) -> None:
    server.reply(Reply(events=tuple({**c, "model": "test-model-0613"} for c in text_stream("hi"))))
    model = OpenAIChatClient("test-model", base_url=server.base_url, api_key="k", max_retries=0)

    async def on_update(update: Any) -> None:
        pass

    async with model:
        agent = Agent(model, stack=[LoggingMiddleware()], chat_stack=[LoggingMiddleware()])
        with capture_logs() as logs:
            await agent.run("x", on_update=on_update)
    model_end, run_end = events(logs, "model.end", "run.end")
    assert model_end["model"] == run_end["model"] == "test-model-0613"
    assert (model_end["updates"], run_end["updates"]) == (2, 2)


async def test_without_a_reported_model_the_requested_one_is_logged() -> None:
    agent = Agent(ScriptedChatClient(["a", "b"]), chat_stack=[LoggingMiddleware()])
    with capture_logs() as logs:
        await agent.run("x", options=AgentRunOptions(model="chosen"))
        await agent.run("x")
    ends = events(logs, "model.end")
    assert [e["model"] for e in ends] == ["chosen", None]


# --- Streamed runs: time to first update and the update count --------------------------------


async def test_a_streamed_run_logs_its_updates_and_time_to_first_update() -> None:
    agent = Agent(EchoChatClient(), stack=[LoggingMiddleware()], chat_stack=[LoggingMiddleware()])
    with capture_logs() as logs:
        async with agent.stream("one two three") as stream:
            async for _ in stream:
                pass
    run_end, model_end = events(logs, "run.end")[0], events(logs, "model.end")[0]
    for end in (run_end, model_end):
        assert end["outcome"] == "ok"
        assert end["updates"] == 4  # three words and the usage
        assert isinstance(end["ttfu_ms"], float)
        assert 0 <= end["ttfu_ms"] <= end["duration_ms"]


async def test_an_unstreamed_run_logs_no_stream_fields() -> None:
    agent = Agent(EchoChatClient(), stack=[LoggingMiddleware()])
    with capture_logs() as logs:
        await agent.run("hello")
    (end,) = events(logs, "run.end")
    assert "updates" not in end
    assert "ttfu_ms" not in end


async def test_a_stream_that_failed_logs_what_it_sent() -> None:
    model = ScriptedChatClient([["Hel", RateLimitError("cut")]])
    agent = Agent(model, chat_stack=[LoggingMiddleware()])

    async def on_update(update: Any) -> None:
        pass

    with capture_logs() as logs, pytest.raises(RateLimitError):
        await agent.run("hi", on_update=on_update)
    (end,) = events(logs, "model.end")
    assert (end["outcome"], end["updates"]) == ("error", 1)
    assert isinstance(end["ttfu_ms"], float)


async def test_a_stream_that_sent_nothing_logs_no_time_to_first_update() -> None:
    model = ScriptedChatClient([[RateLimitError("at once")]])
    agent = Agent(model, stack=[LoggingMiddleware()])

    async def consume() -> None:
        async with agent.stream("hi") as stream:
            async for _ in stream:
                pass

    with capture_logs() as logs, pytest.raises(RateLimitError):
        await consume()
    (end,) = events(logs, "run.end")
    assert (end["updates"], end["ttfu_ms"]) == (0, None)


async def test_an_early_close_logs_the_updates_the_consumer_got() -> None:
    agent = Agent(EchoChatClient(), stack=[LoggingMiddleware()])
    with capture_logs() as logs:
        async with agent.stream("a b c d e") as stream:
            async for update in stream:
                if update.text == "b ":
                    break
    (end,) = events(logs, "run.end")
    assert (end["outcome"], end["error_type"]) == ("error", "StreamClosedError")
    assert end["updates"] == 2
