"""CompactionMiddleware over real HTTP: native compaction on the Responses and Anthropic
wires, a compression strategy elsewhere, portability through FallbackMiddleware (no wire
ever gets a foreign item, and a smaller model still fits), and compact-and-retry-once
when the server says the prompt is too long (loopback servers with windows, see
tests/_harness/context_window.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from raf import (
    Agent,
    AgentResponse,
    AnthropicChatClient,
    ChatMessage,
    ChatOptions,
    ChatRequest,
    CompactionMiddleware,
    ContextOverflowError,
    FallbackMiddleware,
    HistoryProvider,
    InMemorySession,
    OpenAIChatClient,
    OpenAIResponsesClient,
    ScriptedChatClient,
    Update,
)
from raf.compression import SummaryStrategy, TruncationStrategy
from tests._harness.anthropic_server import AnthropicServer
from tests._harness.context_window import AnthropicCompaction, ResponsesCompaction, Window
from tests._harness.openai_server import OpenAIServer, completion
from tests._harness.responses_server import ResponsesServer

pytestmark = pytest.mark.anyio

BIG = "word " * 3000  # some 3,750 tokens in the servers' count


@pytest.fixture(autouse=True)
def _loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def responses() -> Iterator[ResponsesServer]:
    server = ResponsesServer()
    server.compaction = ResponsesCompaction()
    yield server
    server.close()


@pytest.fixture
def anthropic() -> Iterator[AnthropicServer]:
    server = AnthropicServer()
    server.compaction = AnthropicCompaction()
    yield server
    server.close()


@pytest.fixture
def chat() -> Iterator[OpenAIServer]:
    server = OpenAIServer()
    yield server
    server.close()


def gpt(server: ResponsesServer) -> OpenAIResponsesClient:
    return OpenAIResponsesClient("m", base_url=server.base_url, api_key="k", max_retries=0)


def claude(server: AnthropicServer) -> AnthropicChatClient:
    return AnthropicChatClient("m", base_url=server.root_url, api_key="k", max_retries=0)


def chat_client(server: OpenAIServer) -> OpenAIChatClient:
    return OpenAIChatClient("m", base_url=server.base_url, api_key="k", max_retries=0)


async def long_session(turns: int = 3) -> InMemorySession:
    """A session that already holds a long conversation."""
    session = InMemorySession()
    for n in range(turns):
        await session.add_messages([ChatMessage.user(f"{n}: {BIG}"), ChatMessage.assistant("ok")])
    return session


def as_input(data: str) -> dict[str, Any]:
    """A stored Responses compaction item as the input item raf sends back."""
    item = json.loads(data)
    return {key: item[key] for key in ("type", "id", "encrypted_content")}


def foreign_items(body: Any) -> list[Any]:
    """Every compaction item or block in a request body (input items, content blocks)."""
    found = []
    for item in body.get("input") or body.get("messages") or ():
        if isinstance(item, dict) and item.get("type") == "compaction":
            found.append(item)
        content = item.get("content") if isinstance(item, dict) else None
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "compaction":
                found.append(block)
    return found


# --- native ---------------------------------------------------------------------------


async def test_native_on_responses_the_server_compacts_and_the_next_turn_sends_from_it(
    responses: ResponsesServer,
) -> None:
    session = await long_session()
    agent = Agent(
        gpt(responses),
        instructions="Be brief.",
        stack=[HistoryProvider()],
        chat_stack=[CompactionMiddleware(2_000)],
    )
    try:
        responses.answer(text="compacted and answered")
        first = await agent.run("go on", session=session)
        responses.answer(text="next")
        await agent.run("and then?", session=session)
    finally:
        await agent.aclose()
    asked = responses.requests[0].body
    assert asked["context_management"] == [{"type": "compaction", "compact_threshold": 2_000}]
    turn = first.messages[-1]
    assert turn.compaction is not None
    stored = await session.get_messages()
    assert stored[-3].compaction == turn.compaction  # kept with the session, on its turn
    sent = responses.requests[1].body["input"]
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert sent[1] == as_input(turn.compaction.data)
    assert BIG not in json.dumps(sent)  # what the item replaced is never sent again


async def test_native_false_compresses_with_the_fallback_and_asks_the_server_nothing(
    responses: ResponsesServer,
) -> None:
    session = await long_session()
    middleware = CompactionMiddleware(2_000, fallback=TruncationStrategy(2), native=False)
    agent = Agent(gpt(responses), stack=[HistoryProvider()], chat_stack=[middleware])
    try:
        responses.answer(text="ok")
        answer = await agent.run("go on", session=session)
    finally:
        await agent.aclose()
    body = responses.requests[0].body
    assert "context_management" not in body
    assert body["input"] == [
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go on"},
    ]
    assert answer.messages[-1].compaction is None
    assert len(await session.get_messages()) == 8  # the session keeps everything


async def test_a_call_under_the_threshold_goes_as_it_is(chat: OpenAIServer) -> None:
    middleware = CompactionMiddleware(100_000, fallback=TruncationStrategy(1))
    agent = Agent(chat_client(chat), stack=[HistoryProvider()], chat_stack=[middleware])
    session = InMemorySession()
    await session.add_messages([ChatMessage.user("hi"), ChatMessage.assistant("hello")])
    try:
        chat.answer(completion("ok"))
        await agent.run("go on", session=session)
    finally:
        await agent.aclose()
    assert [m["content"] for m in chat.requests[0].body["messages"]] == ["hi", "hello", "go on"]


async def test_anthropic_native_compaction_uses_its_minimum_trigger(
    anthropic: AnthropicServer,
) -> None:
    agent = Agent(claude(anthropic), chat_stack=[CompactionMiddleware(2_000)])
    try:
        anthropic.answer(text="ok")
        await agent.run("hi")
    finally:
        await agent.aclose()
    request = anthropic.requests[0]
    edit = request.body["context_management"]["edits"][0]
    assert edit == {
        "type": "compact_20260112",
        "trigger": {"type": "input_tokens", "value": 50_000},
    }
    assert request.headers["anthropic-beta"] == "compact-2026-01-12"


# --- portable -------------------------------------------------------------------------


@pytest.mark.parametrize("to", ["anthropic", "chat completions"])
async def test_a_fallback_model_never_gets_the_foreign_item_and_still_fits(
    to: str, responses: ResponsesServer, anthropic: AnthropicServer, chat: OpenAIServer
) -> None:
    """Responses compacts natively (its item is encrypted: no summary); the next call falls
    back to a model whose window the whole history would not fit: it gets the summary the
    fallback strategy made of what the item replaced, and no item."""
    backup: Any
    if to == "anthropic":
        backup, server = claude(anthropic), anthropic
        anthropic.window = Window("anthropic", 3_000)
        anthropic.answer(text="from the backup")
    else:
        backup, server = chat_client(chat), chat
        chat.window = Window("openai", 3_000)
        chat.answer(completion("from the backup"))
    summarizer = ScriptedChatClient(["they talked of words"])
    strategy = SummaryStrategy(summarizer, keep_last=1)
    session = await long_session()
    agent = Agent(
        gpt(responses),
        instructions="Be brief.",
        stack=[HistoryProvider()],
        chat_stack=[CompactionMiddleware(2_000, fallback=strategy), FallbackMiddleware(backup)],
    )
    try:
        responses.answer(text="compacted")
        await agent.run("go on", session=session)
        responses.fail(500)  # the primary is down: the call falls back
        answer = await agent.run("and then?", session=session)
    finally:
        await agent.aclose()
    assert answer.text == "from the backup"
    body = server.requests[-1].body
    assert foreign_items(body) == []
    text = json.dumps(body)
    assert "they talked of words" in text  # the summary stands in for what the item replaced
    assert BIG not in text
    assert len(summarizer.requests) == 1  # made once for the item
    # The primary still gets its own item, not the summary.
    assert foreign_items(responses.requests[-1].body) != []


async def test_a_summary_is_made_only_when_another_wire_may_be_reached(
    responses: ResponsesServer,
) -> None:
    summarizer = ScriptedChatClient(["unused"])
    strategy = SummaryStrategy(summarizer, keep_last=1)
    session = await long_session()
    agent = Agent(
        gpt(responses),
        stack=[HistoryProvider()],
        chat_stack=[CompactionMiddleware(2_000, fallback=strategy)],
    )
    try:
        responses.answer(text="compacted")
        await agent.run("go on", session=session)
        responses.answer(text="then")
        await agent.run("and then?", session=session)
    finally:
        await agent.aclose()
    assert summarizer.requests == []


# --- overflow -------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_overflow_compacts_on_the_server_and_retries_once(
    responses: ResponsesServer, streamed: bool
) -> None:
    responses.window = Window("responses", 6_000)
    session = await long_session()
    # A threshold the server never reaches before the window: only the overflow compacts.
    agent = Agent(
        gpt(responses),
        instructions="Be brief.",
        stack=[HistoryProvider()],
        chat_stack=[CompactionMiddleware(1_000_000)],
    )
    updates: list[Update] = []

    async def sink(update: Update) -> None:
        updates.append(update)

    try:
        responses.answer(text="fits now")
        first = await agent.run("go on", session=session, on_update=sink if streamed else None)
        responses.answer(text="still fits")
        second = await agent.run("and then?", session=session)
    finally:
        await agent.aclose()
    paths = [request.path for request in responses.requests]
    assert paths == ["/v1/responses", "/v1/responses/compact", "/v1/responses", "/v1/responses"]
    turn = first.messages[-1]
    assert turn.content == "fits now"
    assert turn.compaction is not None
    assert (await session.get_messages())[-3].compaction == turn.compaction
    retried = responses.requests[2].body["input"]
    assert retried == [
        {"role": "system", "content": "Be brief."},
        as_input(turn.compaction.data),
        {"role": "user", "content": "go on"},
    ]
    assert second.text == "still fits"  # the next turn starts from the item: no overflow
    if streamed:
        assert AgentResponse.from_updates(updates).messages == first.messages


async def test_an_overflow_that_still_does_not_fit_says_so_and_the_next_turn_works(
    responses: ResponsesServer,
) -> None:
    responses.window = Window("responses", 2_000)
    session = InMemorySession()
    agent = Agent(
        gpt(responses), stack=[HistoryProvider()], chat_stack=[CompactionMiddleware(10**6)]
    )
    try:
        with pytest.raises(ContextOverflowError, match="still does not fit") as caught:
            await agent.run(BIG, session=session)  # the request itself is too long
        responses.answer(text="ok")
        answer = await agent.run("short", session=session)
    finally:
        await agent.aclose()
    assert isinstance(caught.value.__cause__, ContextOverflowError)
    assert answer.text == "ok"
    assert [m.content for m in await session.get_messages()] == ["short", "ok"]


async def test_an_overflow_compresses_with_the_fallback_where_the_server_cannot_compact(
    chat: OpenAIServer,
) -> None:
    chat.window = Window("openai", 6_000)
    session = await long_session()
    middleware = CompactionMiddleware(10**6, fallback=TruncationStrategy(2))
    agent = Agent(chat_client(chat), stack=[HistoryProvider()], chat_stack=[middleware])
    try:
        chat.answer(completion("fits now"))
        answer = await agent.run("go on", session=session)
    finally:
        await agent.aclose()
    assert answer.text == "fits now"
    assert len(chat.requests) == 2
    assert [m["content"] for m in chat.requests[1].body["messages"]] == ["ok", "go on"]


async def test_when_the_server_cannot_compact_the_fallback_does(responses: ResponsesServer) -> None:
    responses.compaction = None  # /responses/compact answers what the script says
    responses.window = Window("responses", 6_000)
    session = await long_session()
    middleware = CompactionMiddleware(10**6, fallback=TruncationStrategy(2))
    agent = Agent(gpt(responses), stack=[HistoryProvider()], chat_stack=[middleware])
    try:
        responses.fail(500)  # the compaction request
        responses.answer(text="fits now")
        answer = await agent.run("go on", session=session)
    finally:
        await agent.aclose()
    assert [r.path for r in responses.requests] == [
        "/v1/responses",
        "/v1/responses/compact",
        "/v1/responses",
    ]
    assert answer.text == "fits now"
    assert answer.messages[-1].compaction is None
    assert responses.requests[-1].body["input"] == [
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go on"},
    ]


async def test_an_overflow_with_no_way_to_compact_is_raised_with_a_note(
    chat: OpenAIServer,
) -> None:
    chat.window = Window("openai", 2_000)
    agent = Agent(chat_client(chat), chat_stack=[CompactionMiddleware(10**6)])
    try:
        with pytest.raises(ContextOverflowError) as caught:
            await agent.run(BIG)
    finally:
        await agent.aclose()
    assert any("could not compact" in note for note in caught.value.__notes__)


# --- arguments ------------------------------------------------------------------------


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="threshold_tokens must be an int >= 1"):
        CompactionMiddleware(0)
    with pytest.raises(TypeError, match="fallback must be a compression strategy"):
        CompactionMiddleware(10, fallback="summary")
    with pytest.raises(TypeError, match="native must be True or False"):
        CompactionMiddleware(10, native=1)  # type: ignore[arg-type]


async def test_it_belongs_in_the_chat_stack() -> None:
    async def call_next(request: Any) -> AgentResponse:
        return AgentResponse()

    with pytest.raises(TypeError, match="belongs in Agent\\(chat_stack"):
        await CompactionMiddleware(10)(object(), call_next)
    request = ChatRequest([ChatMessage.user("hi")], ChatOptions())
    assert await CompactionMiddleware(10)(request, call_next) == AgentResponse()
