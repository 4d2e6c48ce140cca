"""Each client reads its server's "the prompt is too long" answer as ContextOverflowError
(not retryable, with the sizes when the server says them), against loopback servers that
refuse a prompt past their window in the vendor's own words; the next, shorter call works."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from raf import (
    Agent,
    AgentResponse,
    AnthropicChatClient,
    ChatMessage,
    ChatOptions,
    ContextOverflowError,
    HistoryProvider,
    InMemorySession,
    OpenAIChatClient,
    OpenAIResponsesClient,
)
from raf.errors import BadRequestError
from tests._harness import gemini_server
from tests._harness.anthropic_server import AnthropicServer
from tests._harness.context_window import Window
from tests._harness.openai_server import OpenAIServer, Reply, completion, text_stream
from tests._harness.responses_server import ResponsesServer

pytestmark = pytest.mark.anyio

LONG = "word " * 4000  # some 5,000 tokens in the servers' count
WINDOW = 1000


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


Served = tuple[Any, Any]


@pytest.fixture(params=["openai", "responses", "anthropic"])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    """A server of one vendor with a window of 1,000 tokens, and raf's client on it."""
    vendor = request.param
    server: Any
    if vendor == "openai":
        server = OpenAIServer()
        client: Any = OpenAIChatClient("m", base_url=server.base_url, api_key="k", max_retries=0)
    elif vendor == "responses":
        server = ResponsesServer()
        client = OpenAIResponsesClient("m", base_url=server.base_url, api_key="k", max_retries=0)
    else:
        server = AnthropicServer()
        client = AnthropicChatClient("m", base_url=server.root_url, api_key="k", max_retries=0)
    server.window = Window(vendor, WINDOW)
    yield server, client
    server.close()


def _answer(server: Any, streamed: bool) -> None:
    """Queue an "ok" answer (chat completions: as a stream to a streamed call)."""
    if not isinstance(server, OpenAIServer):
        server.answer(text="ok")
    elif streamed:
        server.reply(Reply(200, None, events=text_stream("ok")))
    else:
        server.answer(completion("ok"))


async def _call(client: Any, messages: list[ChatMessage], streamed: bool) -> AgentResponse:
    if streamed:
        updates = [u async for u in client.stream(messages, ChatOptions())]
        return AgentResponse.from_updates(updates)
    response: AgentResponse = await client.complete(messages, ChatOptions())
    return response


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_prompt_past_the_window_is_a_context_overflow_then_a_short_one_works(
    served: Served, streamed: bool
) -> None:
    server, client = served
    try:
        with pytest.raises(ContextOverflowError) as caught:
            await _call(client, [ChatMessage.user(LONG)], streamed)
        _answer(server, streamed)
        answer = await _call(client, [ChatMessage.user("short")], streamed)
    finally:
        await client.aclose()
    error = caught.value
    assert isinstance(error, BadRequestError)
    assert not error.retryable
    # A Responses stream says it in an error event of a 200 reply: no status of its own.
    in_stream = streamed and isinstance(server, ResponsesServer)
    assert error.status_code == (None if in_stream else 400)
    assert "longer than the model's context window" in str(error)
    if isinstance(server, ResponsesServer):  # the Responses API says no sizes
        assert (error.input_tokens, error.max_tokens) == (None, None)
    else:
        assert error.max_tokens == WINDOW
        assert error.input_tokens is not None
        assert error.input_tokens > WINDOW
    assert answer.text == "ok"
    assert len(server.requests) == 2  # refused once, not retried


async def test_an_agent_is_not_wedged_by_a_turn_too_long(served: Served) -> None:
    """Without compaction: the error, nothing of the failed turn stored, and the next turn
    with a shorter message works."""
    server, client = served
    session = InMemorySession()
    agent = Agent(client, stack=[HistoryProvider()])
    try:
        _answer(server, False)
        await agent.run("hello", session=session)
        with pytest.raises(ContextOverflowError):
            await agent.run(LONG, session=session)
        _answer(server, False)
        answer = await agent.run("and now?", session=session)
    finally:
        await agent.aclose()
    assert answer.text == "ok"
    stored = [m.content for m in await session.get_messages()]
    assert stored == ["hello", "ok", "and now?", "ok"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # google-genai runs on asyncio only
@pytest.mark.parametrize("streamed", [False, True])
async def test_gemini_reads_its_token_count_refusal(
    streamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = next(gemini_server.served(monkeypatch))
    server.window = Window("gemini", WINDOW)
    client = gemini_server.client_for(server)
    try:
        with pytest.raises(ContextOverflowError) as caught:
            await gemini_server.call(client, streamed, [ChatMessage.user(LONG)])
        server.answer(text="ok")
        answer = await gemini_server.call(client, streamed, [ChatMessage.user("short")])
    finally:
        await client.aclose()
        server.close()
    assert caught.value.max_tokens == WINDOW
    assert caught.value.input_tokens is not None
    assert caught.value.input_tokens > WINDOW
    assert answer.text == "ok"


@pytest.mark.parametrize(
    ("error", "sizes"),
    [
        (
            {
                "code": "context_length_exceeded",
                "message": "This model's maximum context length is 8192 tokens. However, you "
                "requested 9000 tokens (8000 in the messages, 1000 in the completion).",
            },
            (8000, 8192),
        ),
        ({"message": "prompt is too long: 208310 tokens > 200000 maximum"}, (208310, 200000)),
        (
            {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: "
                "199759 + 8192 > 200000, decrease input length or `max_tokens` and try again",
            },
            (199759, 200000),
        ),
        (  # a Responses stream's error event, the error nested
            {
                "type": "error",
                "sequence_number": 2,
                "error": {
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "message": "Your input exceeds the context window of this model.",
                },
            },
            (None, None),
        ),
        (
            {
                "status": "INVALID_ARGUMENT",
                "message": "exceeds the maximum number of tokens allowed",
            },
            (None, None),
        ),
    ],
)
def test_the_sizes_are_read_from_each_wording(error: dict[str, Any], sizes: Any) -> None:
    from raf._clients._overflow import overflow

    found = overflow(error, "the call failed", 400)
    assert found is not None
    assert (found.input_tokens, found.max_tokens) == sizes


def test_other_refusals_are_no_overflow() -> None:
    from raf._clients._overflow import overflow

    assert overflow({"message": "bad", "status": "INVALID_ARGUMENT"}, "x", 400) is None
    assert overflow({"code": "invalid_value", "message": "no"}, "x", 400) is None
    assert overflow("not an object", "x", 400) is None
