"""AnthropicChatClient against a real HTTP server on loopback (speaking Anthropic's
Messages wire, checked against the SDK in test_anthropic_server.py), through the real
``anthropic`` SDK, on asyncio and trio."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from raf import (
    Agent,
    AgentResponse,
    AnthropicChatClient,
    ChatClientError,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    FallbackMiddleware,
    HistoryProvider,
    InMemorySession,
    OpenAIChatClient,
    Reasoning,
    RedisSessionStore,
    RetryMiddleware,
    SqliteSessionStore,
    ToolCall,
    Usage,
    tool,
)
from raf.errors import (
    AuthenticationError,
    BadRequestError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    IncompleteResponseError,
    RateLimitError,
    ServerError,
)
from tests._harness.anthropic_server import Answer, AnthropicServer, events_of, message_body
from tests._harness.cli import run_raf
from tests._harness.loopback_server import Exchange, Received, sse
from tests._harness.openai_server import OpenAIServer, completion
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio

EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[AnthropicServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    running = AnthropicServer()
    yield running
    running.close()


def client_for(server: AnthropicServer, **kwargs: Any) -> AnthropicChatClient:
    kwargs.setdefault("max_retries", 0)
    return AnthropicChatClient("test-model", base_url=server.root_url, api_key="sk-ant", **kwargs)


async def call(
    model: AnthropicChatClient,
    streamed: bool,
    messages: list[ChatMessage] | None = None,
    options: ChatOptions | None = None,
) -> AgentResponse:
    """One call: streamed and assembled, or not."""
    messages = messages or [ChatMessage.user("x")]
    options = options or ChatOptions()
    if streamed:
        return AgentResponse.from_updates([u async for u in model.stream(messages, options)])
    return await model.complete(messages, options)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


both = pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])


class Clock(ContextProvider):
    """A volatile provider: its text goes to the tail, after the history."""

    async def on_invoking(
        self, agent: Any, session: Any, messages: Sequence[ChatMessage], options: Any
    ) -> ContextResult:
        return ContextResult(instructions="Now: 12:00.", volatile=True)


# --- plain and streamed -----------------------------------------------------------------


async def test_plain_answer_maps_the_body_usage_and_raw(server: AnthropicServer) -> None:
    from anthropic.types import Message  # here, not at the top: collection stays SDK-free

    server.answer(text="Hello there", usage=(11, 3), cache_read=100, cache_write=20)
    async with client_for(server, cache=False) as model:
        response = await model.complete(
            [ChatMessage.system("Be brief."), ChatMessage.user("hi", name="ann")],
            ChatOptions(temperature=0.5),
        )
    assert response.text == "Hello there"
    assert response.usage == Usage(131, 3, cached_input_tokens=100, cache_write_tokens=20)
    assert isinstance(response.raw, Message)
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["anthropic-version"]
    assert request.body == {
        "model": "test-model",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "temperature": 0.5,
    }


async def test_stream_sends_text_as_it_comes_then_calls_and_usage(
    server: AnthropicServer,
) -> None:
    body = message_body(
        "one two three",
        calls=[("toolu_1", "add", {"a": 1})],
        usage=(4, 3),
        cache_read=8,
        cache_write=2,
    )
    server.answer(body)
    server.answer(body)
    async with client_for(server) as model:
        updates = [u async for u in model.stream([ChatMessage.user("x")], ChatOptions())]
        plain = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert [u.kind for u in updates] == ["text", "text", "text", "tool_call", "usage"]
    assert [u.text for u in updates[:3]] == ["one ", "two ", "three"]
    assert updates[3].tool_call == ToolCall("toolu_1", "add", '{"a":1}')
    assert updates[4].usage == Usage(14, 3, cached_input_tokens=8, cache_write_tokens=2)
    assert AgentResponse.from_updates(updates).messages == plain.messages
    assert server.requests[0].body["stream"] is True


# --- messages on the wire ---------------------------------------------------------------


async def test_tool_loop_with_parallel_calls_puts_results_in_one_user_turn(
    server: AnthropicServer,
) -> None:
    server.answer(
        text="Adding.",
        calls=[("toolu_1", "add", {"a": 1, "b": 2}), ("toolu_2", "add", {"a": 3, "b": 4})],
    )
    server.answer(text="3 and 7")
    async with client_for(server, cache=False) as model:
        answer = await Agent(model, tools=[add]).run("sums?")  # the client closes it
    assert answer.text == "3 and 7"
    second = server.requests[1].body
    assert second["tools"] == [
        {
            "name": "add",
            "description": "Add two numbers.",
            "input_schema": add.parameters | {},
        }
    ]
    assert second["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "sums?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
                {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {"a": 3, "b": 4}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "7"},
            ],
        },
    ]


async def test_a_history_with_another_vendors_call_ids_is_sent_with_ids_anthropic_takes(
    server: AnthropicServer,
) -> None:
    # Made with other models (a fallback, a switch): ids Anthropic refuses ("functions.add:0"),
    # and "call_0" in every turn (servers that number each answer's calls from zero).
    def turn(call_id: str, a: int) -> list[ChatMessage]:
        return [
            ChatMessage.user(f"add {a}"),
            ChatMessage.assistant(tool_calls=[ToolCall(call_id, "add", f'{{"a": {a}, "b": 1}}')]),
            ChatMessage.tool(call_id, str(a + 1)),
            ChatMessage.assistant(f"{a + 1}"),
        ]

    history = [*turn("call_0", 1), *turn("call_0", 2), *turn("functions.add:0", 3)]
    server.answer(text="done")
    server.answer(text="done")
    async with client_for(server, cache=False) as model:
        await model.complete([*history, ChatMessage.user("and?")], ChatOptions(tools=(add,)))
        answered = [ChatMessage.user("and?"), ChatMessage.assistant("done")]
        again = [*history, *answered, *turn("call_0", 4)]
        await model.complete(again, ChatOptions(tools=(add,)))
    first, second = (exchange.body for exchange in server.requests)
    uses = [
        block["id"]
        for message in first["messages"]
        for block in message["content"]
        if block["type"] == "tool_use"
    ]
    results = [
        block["tool_use_id"]
        for message in first["messages"]
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    assert uses == ["call_0", "call_0_2", "functions_add_0"]
    assert results == uses
    # The ids are a function of the history up to each call: a longer history sends the same.
    assert second["messages"][: len(first["messages"])] == first["messages"]


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ("add", {"type": "tool", "name": "add"}),
    ],
)
async def test_tool_choice_maps_to_anthropic_words(
    server: AnthropicServer, choice: str, wire: dict[str, str]
) -> None:
    server.answer()
    async with client_for(server) as model:
        await model.complete([ChatMessage.user("x")], ChatOptions(tool_choice=choice))
    assert server.requests[0].body["tool_choice"] == wire


async def test_output_schema_max_tokens_and_extra_go_in_the_body(
    server: AnthropicServer,
) -> None:
    server.answer(text='{"n": 1}')
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    options = ChatOptions(
        max_tokens=99,
        output_schema=schema,
        extra={"thinking": {"type": "enabled", "budget_tokens": 50}, "top_k": 3},
    )
    async with client_for(server) as model:
        await model.complete([ChatMessage.user("x")], options)
    body = server.requests[0].body
    assert body["max_tokens"] == 99
    assert body["output_config"] == {
        "format": {
            "type": "json_schema",
            "schema": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            },
        }
    }
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 50}
    assert body["top_k"] == 3


async def test_the_tail_is_text_in_the_following_user_turn(server: AnthropicServer) -> None:
    server.answer()
    messages = [
        ChatMessage.system("Be brief."),
        ChatMessage.user("old question"),
        ChatMessage.assistant("old answer"),
        ChatMessage.system("Fresh passages."),
        ChatMessage.user("new question"),
    ]
    async with client_for(server, cache=False) as model:
        await model.complete(messages, ChatOptions(history_end=3))
    body = server.requests[0].body
    assert body["system"] == [{"type": "text", "text": "Be brief."}]
    assert body["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "Fresh passages."},
            {"type": "text", "text": "new question"},
        ],
    }


async def test_the_agents_tail_goes_to_the_user_turn_and_the_breakpoints_around_it(
    server: AnthropicServer,
) -> None:
    server.answer()
    server.answer()
    agent = Agent(
        client_for(server),
        instructions="Be brief.",
        tools=[add],
        stack=[HistoryProvider(), Clock()],
    )
    session = InMemorySession()
    async with agent:
        await agent.run("first", session=session)
        await agent.run("second", session=session)
    body = server.requests[1].body
    marked = [
        block
        for part in (body["tools"], body["system"], *(m["content"] for m in body["messages"]))
        for block in part
        if "cache_control" in block
    ]
    assert marked == [
        body["tools"][-1],
        body["system"][-1],
        body["messages"][1]["content"][-1],  # the history's last message: the answer "ok"
        body["messages"][2]["content"][-1],  # the last message
    ]
    assert body["messages"][1]["content"][-1]["text"] == "ok"
    assert body["messages"][2]["content"] == [
        {"type": "text", "text": "Now: 12:00."},
        {"type": "text", "text": "second", "cache_control": EPHEMERAL},
    ]


class Ticking(ContextProvider):
    """A volatile provider whose text changes every call."""

    def __init__(self) -> None:
        self.calls = 0

    async def on_invoking(
        self, agent: Any, session: Any, messages: Sequence[ChatMessage], options: Any
    ) -> ContextResult:
        self.calls += 1
        return ContextResult(instructions=f"Now: call {self.calls}.", volatile=True)


async def test_without_history_the_tail_stays_out_of_the_system_field(
    server: AnthropicServer,
) -> None:
    # No history provider: the tail goes to the user turn all the same, so the system
    # field (the cached prefix) is the same on every call.
    server.answer()
    server.answer()
    async with Agent(client_for(server), instructions="Be brief.", stack=[Ticking()]) as agent:
        await agent.run("first")
        await agent.run("second")
    first, second = (request.body for request in server.requests)
    assert (
        first["system"]
        == second["system"]
        == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    )
    assert second["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Now: call 2."},
                {"type": "text", "text": "second", "cache_control": EPHEMERAL},
            ],
        }
    ]


async def test_breakpoints_are_at_most_four_and_none_without_cache(
    server: AnthropicServer,
) -> None:
    messages = [
        ChatMessage.system("Be brief."),
        ChatMessage.user("q1"),
        ChatMessage.assistant("a1"),
        ChatMessage.user("q2"),
    ]
    server.answer()
    server.answer()
    server.answer()
    options = ChatOptions(tools=(add,), history_end=3)
    async with client_for(server) as model:
        await model.complete(messages, options)
        await model.complete(messages, ChatOptions(tools=(add,)))
    async with client_for(server, cache=False) as model:
        await model.complete(messages, options)
    cached, no_history, uncached = (r.raw.decode() for r in server.requests)
    assert cached.count('"cache_control"') == 4
    assert '"text":"a1","cache_control"' in cached
    assert no_history.count('"cache_control"') == 3  # no history: no mark before the tail
    assert "cache_control" not in uncached


# --- thinking ---------------------------------------------------------------------------

THINKING = {"type": "thinking", "thinking": "I add them.", "signature": "sig-abc"}
REDACTED = {"type": "redacted_thinking", "data": "opaque-xyz"}


def thinking_answers(server: AnthropicServer) -> None:
    server.answer(
        text=None,
        thinking=[("I add them.", "sig-abc")],
        redacted="opaque-xyz",
        calls=[("toolu_1", "add", {"a": 1, "b": 2})],
    )
    server.answer(text="3")


@both
async def test_thinking_blocks_go_back_unchanged_in_the_tool_loop(
    server: AnthropicServer, streamed: bool
) -> None:
    thinking_answers(server)
    async with Agent(client_for(server, cache=False), tools=[add]) as agent:
        if streamed:
            async with agent.stream("1+2?") as stream:
                async for _ in stream:
                    pass
            answer = stream.response
            assert answer is not None
        else:
            answer = await agent.run("1+2?")
    assert answer.text == "3"
    assistant = server.requests[1].body["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": [
            THINKING,
            REDACTED,
            {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
        ],
    }


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_thinking_survives_a_session_store_round_trip_into_a_new_client(
    server: AnthropicServer, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    thinking_answers(server)
    server.answer(text="again")

    def opened() -> Any:
        if store == "sqlite":
            return SqliteSessionStore(tmp_path / "s.db")
        redis: RedisServer = request.getfixturevalue("redis_server")
        return RedisSessionStore(redis.url, prefix=f"t{id(tmp_path)}")

    for question in ("1+2?", "and now?"):
        # A new client, agent and connection each turn: the thinking is only in the store.
        agent = Agent(client_for(server), tools=[add], stack=[HistoryProvider()])
        async with agent, opened() as sessions:
            await agent.run(question, session=await sessions.get("s"))
    assistant = server.requests[2].body["messages"][1]
    assert assistant["content"][:2] == [THINKING, REDACTED]
    blocks = json.dumps([THINKING, REDACTED], separators=(",", ":"))[1:-1]
    assert blocks.encode() in server.requests[2].raw


def test_thinking_is_kept_on_the_message_and_other_reasoning_is_left_out() -> None:
    tool_use = {"type": "tool_use", "id": "t1"}
    call = ToolCall("t1", "add", "{}")
    ours = Reasoning("anthropic", json.dumps([THINKING, tool_use]))
    theirs = Reasoning("openai.responses", json.dumps([{"type": "reasoning", "id": "rs"}]))
    model = AnthropicChatClient("claude", api_key="k")
    for reasoning, expected in [(ours, [THINKING]), (theirs, [])]:
        message = ChatMessage.assistant(None, tool_calls=[call], reasoning=reasoning)
        _, body, _ = model.request_body([ChatMessage.user("x"), message], ChatOptions())
        assert body["messages"][1]["content"][:-1] == expected
    broken = ChatMessage.assistant("hi", reasoning=Reasoning("anthropic", "{not json"))
    with pytest.raises(BadRequestError, match="source 'anthropic'"):
        model.request_body([broken], ChatOptions())


# --- endings ----------------------------------------------------------------------------


@both
async def test_max_tokens_is_incomplete_with_the_partial(
    server: AnthropicServer, streamed: bool
) -> None:
    server.answer(text="cut sh", stop_reason="max_tokens", usage=(5, 9))
    async with client_for(server) as model:
        with pytest.raises(IncompleteResponseError) as caught:
            await call(model, streamed)
    assert caught.value.reason == "max_tokens"
    assert not caught.value.retryable
    assert "raise max_tokens" in str(caught.value)
    assert caught.value.partial.text == "cut sh"
    assert caught.value.partial.usage == Usage(5, 9)


async def test_a_stream_cut_in_a_tool_calls_arguments_is_incomplete_not_garbled(
    server: AnthropicServer,
) -> None:
    body = message_body("Let me", calls=[("toolu_1", "add", {"a": 1})], stop_reason="max_tokens")
    events = events_of(body)
    for event in events:
        if event.get("delta", {}).get("type") == "input_json_delta":
            event["delta"]["partial_json"] = '{"a'  # both pieces: the JSON never closes
    server.reply(Answer(events=events))
    async with client_for(server) as model:
        with pytest.raises(IncompleteResponseError) as caught:
            await call(model, streamed=True)
    assert caught.value.partial.text == "Let me"


@both
async def test_a_refusal_is_a_non_retryable_error_naming_it(
    server: AnthropicServer, streamed: bool
) -> None:
    server.answer(text="I can't", stop_reason="refusal")
    async with client_for(server) as model:
        with pytest.raises(ChatClientError, match="refusal") as caught:
            await call(model, streamed)
    assert type(caught.value) is ChatClientError
    assert not caught.value.retryable


async def test_a_stream_without_message_stop_is_a_connection_error(
    server: AnthropicServer,
) -> None:
    server.reply(Answer(events=events_of(message_body("cut"), terminal=False)))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError, match="message_stop") as caught:
            await call(model, streamed=True)
    assert caught.value.retryable


async def test_a_stream_cut_mid_way_is_a_connection_error(server: AnthropicServer) -> None:
    server.reply(Answer(body=message_body("one two three"), drop_after=4))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError):
            await call(model, streamed=True)


async def test_nothing_after_message_stop_changes_the_answer(server: AnthropicServer) -> None:
    events = events_of(message_body("done"))
    late = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}
    server.reply(Answer(events=[*events, late, {"type": "error", "error": {"type": "api_error"}}]))
    async with client_for(server) as model:
        assert (await call(model, streamed=True)).text == "done"


@pytest.mark.parametrize(
    ("kind", "error", "retryable"),
    [
        ("overloaded_error", ServerError, True),
        ("rate_limit_error", RateLimitError, True),
        ("invalid_request_error", ChatClientError, False),
    ],
)
async def test_an_error_event_is_the_error_it_names(
    server: AnthropicServer, kind: str, error: type[ChatClientError], retryable: bool
) -> None:
    events = events_of(message_body("x"))[:2]
    events.append({"type": "error", "error": {"type": kind, "message": "busy"}})
    server.reply(Answer(events=events))
    async with client_for(server) as model:
        with pytest.raises(error, match=kind) as caught:
            await call(model, streamed=True)
    assert caught.value.retryable is retryable


async def test_a_streamed_tool_input_nested_too_deeply_is_a_protocol_error(
    server: AnthropicServer,
) -> None:
    events = events_of(message_body(calls=[("toolu_1", "add", {"a": 1})]))
    pieces = [e for e in events if e.get("delta", {}).get("type") == "input_json_delta"]
    for event in pieces:
        event["delta"]["partial_json"] = ""
    pieces[-1]["delta"]["partial_json"] = '{"a":' * 5000 + "1" + "}" * 5000
    server.reply(Answer(events=events))
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match="nested too deeply"):
            await call(model, streamed=True)


def test_arguments_nested_too_deeply_to_send_are_a_bad_request() -> None:
    deep = '{"a":' * 5000 + "1" + "}" * 5000
    call_message = ChatMessage.assistant(None, tool_calls=[ToolCall("toolu_1", "add", deep)])
    with pytest.raises(BadRequestError, match="not a JSON object"):
        AnthropicChatClient("m", api_key="k").request_body(
            [ChatMessage.user("x"), call_message], ChatOptions(), stream=False
        )


class Pinging(AnthropicServer):
    """Answers a stream with its message_start, then ping events only, for 20 s."""

    def respond(self, exchange: Exchange, request: Received, answer: Answer) -> None:
        start = events_of(message_body())[0]
        ping = sse(json.dumps({"type": "ping"}), "ping")
        frames = [sse(json.dumps(start), "message_start"), *[ping] * 400]
        exchange.stream(frames, "text/event-stream", pause=0.05)


async def test_a_stream_of_nothing_but_pings_is_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = Pinging()
    server.answer()
    try:
        async with client_for(server, idle_timeout=0.5) as model:
            with pytest.raises(ChatTimeoutError, match=r"idle_timeout=0\.5"):
                await call(model, streamed=True)
    finally:
        server.close()


async def test_a_reply_that_is_not_a_message_is_a_protocol_error(
    server: AnthropicServer,
) -> None:
    server.answer({"type": "message", "content": [{"type": "text", "text": 3}]})
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match=r"content\[0\]\.text"):
            await call(model, streamed=False)


async def test_a_reply_with_a_key_of_the_sdk_s_builder_is_a_protocol_error(
    server: AnthropicServer,
) -> None:
    # A key the SDK's model builder takes for an argument of its own (was: a raw AttributeError).
    server.answer({**message_body("hi"), "_fields_set": 1})
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match="cannot be built as the SDK's Message"):
            await call(model, streamed=False)


# --- errors -----------------------------------------------------------------------------


@both
@pytest.mark.parametrize(
    ("status", "error", "retryable"),
    [
        (400, BadRequestError, False),
        (401, AuthenticationError, False),
        (403, AuthenticationError, False),
        (404, BadRequestError, False),
        (413, BadRequestError, False),
        (429, RateLimitError, True),
        (500, ServerError, True),
        (529, ServerError, True),
    ],
)
async def test_http_errors_map_to_rafs_tree(
    server: AnthropicServer,
    streamed: bool,
    status: int,
    error: type[ChatClientError],
    retryable: bool,
) -> None:
    server.fail(status, "it went wrong", headers={"retry-after": "3"})
    async with client_for(server) as model:
        with pytest.raises(error) as caught:
            await call(model, streamed)
    assert type(caught.value) is error
    assert caught.value.retryable is retryable
    assert caught.value.status_code == status
    # retry-after-ms (which fail() adds to a retryable status) wins over Retry-After.
    assert caught.value.retry_after == (0.001 if retryable else 3.0)
    assert "it went wrong" in str(caught.value)
    if status == 529:
        assert "overloaded_error" in str(caught.value)


@both
async def test_an_error_quotes_an_excerpt_of_a_huge_upstream_text(
    server: AnthropicServer, streamed: bool
) -> None:
    server.fail(400, "it went wrong " + "x" * 2_000_000)
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match="it went wrong") as caught:
            await call(model, streamed)
    assert len(str(caught.value)) < 2000


async def test_an_error_event_quotes_an_excerpt_of_a_huge_upstream_text(
    server: AnthropicServer,
) -> None:
    error = {"type": "error", "error": {"type": "api_error", "message": "boom " + "x" * 2_000_000}}
    server.reply(Answer(events=[error]))
    async with client_for(server) as model:
        with pytest.raises(ServerError, match="boom") as caught:
            await call(model, streamed=True)
    assert len(str(caught.value)) < 2000


async def test_retry_after_is_read_in_seconds(server: AnthropicServer) -> None:
    server.reply(
        Answer(
            429,
            {"type": "error", "error": {"type": "rate_limit_error"}},
            headers={"retry-after": "3"},
        )
    )
    async with client_for(server) as model:
        with pytest.raises(RateLimitError) as caught:
            await call(model, streamed=False)
    assert caught.value.retry_after == 3.0


async def test_the_sdks_retries_get_past_an_overload(server: AnthropicServer) -> None:
    server.fail(529, "busy")
    server.answer(text="fine")
    async with client_for(server, max_retries=1) as model:
        assert (await call(model, streamed=False)).text == "fine"
    assert len(server.requests) == 2


@both
async def test_a_slow_server_is_a_timeout(server: AnthropicServer, streamed: bool) -> None:
    server.reply(Answer(body=message_body(), delay=2.0))
    async with client_for(server, timeout=0.2) as model:
        with pytest.raises(ChatTimeoutError) as caught:
            await call(model, streamed)
    assert caught.value.retryable


async def test_a_stalled_stream_is_an_idle_timeout(server: AnthropicServer) -> None:
    server.reply(Answer(body=message_body("one two"), stall_after=3))
    async with client_for(server, idle_timeout=0.2) as model:
        with pytest.raises(ChatTimeoutError, match="idle_timeout"):
            await call(model, streamed=True)


@both
async def test_a_dropped_connection_is_a_connection_error(
    server: AnthropicServer, streamed: bool
) -> None:
    server.reply(Answer(drop=True))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError) as caught:
            await call(model, streamed)
    assert caught.value.retryable


async def test_an_unreachable_server_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = AnthropicChatClient(
        "m", base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0
    )
    async with model:
        with pytest.raises(ChatConnectionError):
            await call(model, streamed=False)


async def test_no_api_key_is_an_authentication_error(
    server: AnthropicServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no credentials file either
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    async with AnthropicChatClient("m", base_url=server.root_url, max_retries=0) as model:
        with pytest.raises(AuthenticationError, match="ANTHROPIC_API_KEY"):
            await call(model, streamed=False)


def test_bad_keywords_are_value_errors() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        AnthropicChatClient("m", api_key="k", max_tokens=0)
    with pytest.raises(ValueError, match="cache"):
        AnthropicChatClient("m", api_key="k", cache=1)  # type: ignore[arg-type]


# --- across vendors ---------------------------------------------------------------------


@pytest.mark.parametrize("primary", ["openai", "anthropic"])
async def test_retries_then_a_fallback_across_vendors(
    server: AnthropicServer, primary: str
) -> None:
    openai_server = OpenAIServer()
    gpt = OpenAIChatClient("gpt", base_url=openai_server.base_url, api_key="sk", max_retries=0)
    claude = client_for(server)
    first, second = (gpt, claude) if primary == "openai" else (claude, gpt)
    agent = Agent(
        first,
        chat_stack=[FallbackMiddleware(second), RetryMiddleware(attempts=2, wait_initial=0)],
    )
    try:
        if primary == "openai":
            openai_server.fail(500)
            openai_server.fail(500)
            server.answer(text="from the backup")
        else:
            server.fail(529, "busy")
            server.fail(529, "busy")
            openai_server.answer(completion("from the backup"))
        answer = await agent.run("hi")
    finally:
        await agent.aclose()
        openai_server.close()
    assert answer.text == "from the backup"
    assert len(server.requests) + len(openai_server.requests) == 3


# --- raf run ----------------------------------------------------------------------------


def test_raf_run_answers_with_claude(
    server: AnthropicServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SUPPORT_BOT_KEY", "sk-ant-env")
    config = tmp_path / "agent.toml"
    config.write_text(
        f"""
[agent]
name = "support"
instructions = "Be brief."

[model]
client = "anthropic"
model = "claude-test"
base_url = "{server.root_url}"
api_key_env = "SUPPORT_BOT_KEY"
max_tokens = 300
"""
    )
    server.answer(text="Hello from Claude")
    assert run_raf(["run", str(config), "hi"]) == 0
    assert capsys.readouterr().out == "Hello from Claude\n"
    (request,) = server.requests
    assert request.body["model"] == "claude-test"
    assert request.body["max_tokens"] == 300
    assert request.body["system"][0]["text"] == "Be brief."
    assert "sk-ant-env" in str(request.headers)
