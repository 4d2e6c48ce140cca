"""RetryMiddleware: which errors are retried, how often, how long it waits, and where."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    RetryMiddleware,
    ScriptedChatClient,
    ToolCall,
    Update,
    tool,
)
from raf.errors import BadRequestError, ChatConnectionError, RateLimitError, ServerError

pytestmark = pytest.mark.anyio

FAST = {"wait_initial": 0.0}


def retries(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "retry"]


async def test_retryable_errors_are_retried_in_the_chat_stack() -> None:
    model = ScriptedChatClient([RateLimitError("slow down"), ServerError("oops"), "finally"])
    agent = Agent(model, chat_stack=[RetryMiddleware(attempts=3, **FAST)])
    with capture_logs() as logs:
        response = await agent.run("hi")
    assert response.text == "finally"
    assert len(model.requests) == 3
    logged = retries(logs)
    assert [(e["attempt"], e["attempts"], e["retrying"]) for e in logged] == [
        (1, 3, "model"),
        (2, 3, "model"),
    ]
    assert [e["error_type"] for e in logged] == ["RateLimitError", "ServerError"]
    assert all(e["log_level"] == "warning" for e in logged)


async def test_a_non_retryable_error_is_raised_at_once() -> None:
    error = BadRequestError("bad field", status_code=400)
    model = ScriptedChatClient([error, "never"])
    agent = Agent(model, chat_stack=[RetryMiddleware(**FAST)])
    with capture_logs() as logs, pytest.raises(BadRequestError) as caught:
        await agent.run("hi")
    assert caught.value is error
    assert len(model.requests) == 1
    assert retries(logs) == []


async def test_when_attempts_run_out_the_last_error_is_raised_unchanged() -> None:
    errors = [ChatConnectionError(f"down {n}") for n in range(3)]
    model = ScriptedChatClient(errors)
    agent = Agent(model, chat_stack=[RetryMiddleware(attempts=3, **FAST)])
    with pytest.raises(ChatConnectionError) as caught:
        await agent.run("hi")
    assert caught.value is errors[-1]
    assert len(model.requests) == 3


async def test_one_attempt_means_no_retry() -> None:
    model = ScriptedChatClient([RateLimitError("x"), "unused"])
    agent = Agent(model, chat_stack=[RetryMiddleware(attempts=1)])
    with pytest.raises(RateLimitError):
        await agent.run("hi")
    assert len(model.requests) == 1


async def test_retry_on_names_the_exception_types() -> None:
    model = ScriptedChatClient([ValueError("flaky"), "ok"])
    agent = Agent(model, chat_stack=[RetryMiddleware(retry_on=(ValueError,), **FAST)])
    assert (await agent.run("hi")).text == "ok"
    # With an explicit retry_on, even a retryable ChatClientError is not retried.
    model = ScriptedChatClient([RateLimitError("x"), "ok"])
    agent = Agent(model, chat_stack=[RetryMiddleware(retry_on=(ValueError,), **FAST)])
    with pytest.raises(RateLimitError):
        await agent.run("hi")


async def test_cancellation_is_never_retried() -> None:
    calls = 0

    with anyio.CancelScope() as scope:

        async def hang(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
            nonlocal calls
            calls += 1
            scope.cancel()
            await anyio.sleep_forever()
            return "unreachable"

        retry = RetryMiddleware(retry_on=(BaseException,), **FAST)
        agent = Agent(ScriptedChatClient([hang, hang, hang]), chat_stack=[retry])
        await agent.run("hi")
    assert scope.cancelled_caught
    assert calls == 1


async def test_in_the_chat_stack_tool_calls_are_not_repeated() -> None:
    used: list[int] = []

    @tool
    def count() -> int:
        """Count a call."""
        used.append(1)
        return len(used)

    model = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(ToolCall("c1", "count")), RateLimitError("x"), "done"]
    )
    agent = Agent(model, tools=[count], chat_stack=[RetryMiddleware(**FAST)])
    assert (await agent.run("go")).text == "done"
    assert len(used) == 1
    assert len(model.requests) == 3


class Counting(ContextProvider):
    def __init__(self) -> None:
        self.pre = 0
        self.errors: list[BaseException | None] = []

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        self.pre += 1
        return ContextResult(instructions="counted")

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Any,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        self.errors.append(error)


async def test_in_the_run_stack_the_whole_inner_run_is_retried() -> None:
    inner = Counting()
    model = ScriptedChatClient([ServerError("boom"), "recovered"])
    agent = Agent(model, stack=[RetryMiddleware(**FAST), inner])
    with capture_logs() as logs:
        assert (await agent.run("hi")).text == "recovered"
    assert inner.pre == 2
    assert [type(e).__name__ for e in inner.errors] == ["ServerError", "NoneType"]
    assert [e["retrying"] for e in retries(logs)] == ["run"]


async def test_waits_grow_exponentially_within_bounds() -> None:
    model = ScriptedChatClient([RateLimitError(str(n)) for n in range(4)] + ["ok"])
    retry = RetryMiddleware(attempts=5, wait_initial=0.001, wait_max=0.005)
    with capture_logs() as logs:
        await Agent(model, chat_stack=[retry]).run("hi")
    waits = [e["wait_s"] for e in retries(logs)]
    assert len(waits) == 4
    for attempt, wait in enumerate(waits, start=1):
        low = min(0.001 * 2 ** (attempt - 1), 0.005)
        assert low - 1e-9 <= wait <= min(low + 0.001, 0.005) + 1e-9


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryMiddleware(attempts=0)
    with pytest.raises(TypeError, match="retry_on"):
        RetryMiddleware(retry_on=ValueError)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retry_on"):
        RetryMiddleware(retry_on=("ValueError",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait"):
        RetryMiddleware(wait_initial=-1)


async def test_what_is_retried_survives_the_usual_log_level_processor() -> None:
    # add_log_level writes the event's "level" field: the retry must not use that key.
    model = ScriptedChatClient([RateLimitError("slow down"), "ok"])
    agent = Agent(model, chat_stack=[RetryMiddleware(**FAST)])
    with capture_logs(processors=[structlog.processors.add_log_level]) as logs:
        await agent.run("hi")
    [retry] = retries(logs)
    assert (retry["retrying"], retry["level"]) == ("model", "warning")


@pytest.mark.mock_clock
async def test_the_wait_is_at_least_what_the_server_asked_for() -> None:
    model = ScriptedChatClient([RateLimitError("slow down", retry_after=0.2), "ok"])
    retry = RetryMiddleware(wait_initial=0.001, wait_max=5)
    started = anyio.current_time()
    with capture_logs() as logs:
        assert (await Agent(model, chat_stack=[retry]).run("hi")).text == "ok"
    assert anyio.current_time() - started >= 0.19
    [logged] = retries(logs)
    assert logged["wait_s"] == 0.2


@pytest.mark.mock_clock
async def test_a_backoff_longer_than_the_servers_ask_wins() -> None:
    model = ScriptedChatClient([ServerError("a", retry_after=0.0), ServerError("b"), "ok"])
    retry = RetryMiddleware(wait_initial=0.01, wait_max=5)
    with capture_logs() as logs:
        await Agent(model, chat_stack=[retry]).run("hi")
    first, second = (e["wait_s"] for e in retries(logs))
    assert 0.01 <= first <= 0.02
    assert 0.02 <= second <= 0.03


@pytest.mark.parametrize("asked", [100_000.0, float("inf"), 8.5])
async def test_when_the_server_asks_for_longer_than_wait_max_the_error_is_raised_at_once(
    asked: float,
) -> None:
    error = RateLimitError("slow down", status_code=429, retry_after=asked)
    model = ScriptedChatClient([error, "never"])
    with capture_logs() as logs, anyio.fail_after(5), pytest.raises(RateLimitError) as caught:
        await Agent(model, chat_stack=[RetryMiddleware(wait_max=8.0)]).run("hi")
    assert caught.value is error
    assert len(model.requests) == 1
    assert retries(logs) == []
    [gave_up] = [e for e in logs if e["event"] == "retry.gave_up"]
    assert (gave_up["retry_after_s"], gave_up["wait_max"], gave_up["attempt"]) == (asked, 8.0, 1)
    assert gave_up["log_level"] == "warning"


async def test_retry_after_is_honoured_with_an_explicit_retry_on() -> None:
    error = RateLimitError("slow down", retry_after=60.0)
    model = ScriptedChatClient([error, "never"])
    retry = RetryMiddleware(retry_on=(RateLimitError,), wait_max=1.0)
    with anyio.fail_after(5), pytest.raises(RateLimitError):
        await Agent(model, chat_stack=[retry]).run("hi")
    assert len(model.requests) == 1


@pytest.mark.mock_clock
async def test_a_short_ask_never_makes_it_give_up_even_with_wait_max_zero() -> None:
    model = ScriptedChatClient([RateLimitError("soon", retry_after=0.02), "ok"])
    retry = RetryMiddleware(wait_initial=0, wait_max=0)
    with capture_logs() as logs:
        assert (await Agent(model, chat_stack=[retry]).run("hi")).text == "ok"
    [logged] = retries(logs)
    # Never earlier than asked: a short ask is waited for in full, whatever wait_max says.
    assert logged["wait_s"] == 0.02


@pytest.mark.mock_clock
@pytest.mark.parametrize(("asked", "wait_max"), [(1.0, 0.5), (0.3, 0.0)])
async def test_a_retry_never_comes_earlier_than_the_server_asked(
    asked: float, wait_max: float
) -> None:
    model = ScriptedChatClient([RateLimitError("slow down", retry_after=asked), "ok"])
    retry = RetryMiddleware(wait_initial=0.001, wait_max=wait_max)
    started = anyio.current_time()
    with capture_logs() as logs:
        assert (await Agent(model, chat_stack=[retry]).run("hi")).text == "ok"
    assert anyio.current_time() - started >= asked
    [logged] = retries(logs)
    assert logged["wait_s"] >= asked


# --- Streamed runs: retried only while nothing was sent onward -------------------------------


async def _streamed(agent: Agent) -> tuple[list[str], AgentResponse]:
    texts: list[str] = []

    async def on_update(update: Update) -> None:
        if update.kind == "text":
            texts.append(update.text)

    response = await agent.run("hi", on_update=on_update)
    return texts, response


@pytest.mark.parametrize("where", ["chat_stack", "stack"])
async def test_a_streamed_call_that_failed_before_its_first_update_is_retried(
    where: str,
) -> None:
    model = ScriptedChatClient([[ServerError("busy"), "never"], ["Hel", "lo"]])
    agent = Agent(model, **{where: [RetryMiddleware(attempts=3, **FAST)]})
    with capture_logs() as logs:
        texts, response = await _streamed(agent)
    assert texts == ["Hel", "lo"]  # nothing of the failed attempt reached the consumer
    assert response.text == "Hello"
    assert len(model.requests) == 2
    assert [e["error_type"] for e in retries(logs)] == ["ServerError"]


@pytest.mark.parametrize("where", ["chat_stack", "stack"])
async def test_a_streamed_call_that_failed_after_an_update_is_not_retried(where: str) -> None:
    error = ChatConnectionError("dropped mid-stream")
    model = ScriptedChatClient([["Hel", error], ["never"]])
    agent = Agent(model, **{where: [RetryMiddleware(attempts=3, **FAST)]})
    texts: list[str] = []

    async def on_update(update: Update) -> None:
        texts.append(update.text)

    with capture_logs() as logs, pytest.raises(ChatConnectionError) as caught:
        await agent.run("hi", on_update=on_update)
    assert caught.value is error
    assert texts == ["Hel"]
    assert len(model.requests) == 1
    assert retries(logs) == []
    (gave_up,) = [e for e in logs if e["event"] == "retry.gave_up"]
    assert (gave_up["reason"], gave_up["error_type"]) == ("streamed", "ChatConnectionError")


async def test_each_streamed_attempt_starts_with_nothing_sent() -> None:
    # Attempt 1 fails before sending, attempt 2 too: both are retried; attempt 3 streams.
    model = ScriptedChatClient([RateLimitError("a"), [ServerError("b")], ["ok"]])
    agent = Agent(model, chat_stack=[RetryMiddleware(attempts=3, **FAST)])
    async with agent.stream("hi") as stream:
        texts = [update.text async for update in stream if update.kind == "text"]
    assert texts == ["ok"]
    assert len(model.requests) == 3


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


async def test_a_tool_loop_retries_each_streamed_model_call_on_its_own() -> None:
    # In the chat stack each model call is its own streamed call: the second call's
    # failure before its first update is retried although the first call streamed.
    call = ToolCall("c1", "echo", '{"text": "x"}')
    model = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(call, text="Let me see."), [ServerError("busy")], "done"]
    )
    agent = Agent(model, tools=[echo], chat_stack=[RetryMiddleware(attempts=2, **FAST)])
    texts, response = await _streamed(agent)
    assert response.text == "done"
    assert texts == ["Let me see.", "done"]
