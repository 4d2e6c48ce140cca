"""GeminiChatClient against a real HTTP server on loopback (speaking Gemini's REST wire,
checked against the SDK in test_gemini_server.py), through the real ``google-genai``
SDK. The SDK's async client is asyncio-only: the client runs on asyncio, and on trio
it is an error that says so (the last test)."""

from __future__ import annotations

import base64
import gzip
import json
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from google.genai import types

import raf.otel
from raf import (
    Agent,
    AgentResponse,
    ChatClientError,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    GeminiChatClient,
    HistoryProvider,
    InMemorySession,
    Reasoning,
    RedisSessionStore,
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
from tests._harness.cli import run_raf
from tests._harness.gemini_server import (
    Answer,
    GeminiServer,
    call,
    chunks_of,
    client_for,
    response_body,
    served,
    signature,
)
from tests._harness.loopback_server import Exchange, Received, sse
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # google-genai's async client runs on asyncio only


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[GeminiServer]:
    yield from served(monkeypatch)


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


async def test_plain_answer_maps_the_body_usage_and_raw(server: GeminiServer) -> None:
    server.answer(text="Hello there", usage=(11, 3), cached=8, thoughts_tokens=4)
    async with client_for(server) as model:
        response = await model.complete(
            [ChatMessage.system("Be brief."), ChatMessage.user("hi", name="ann")],
            ChatOptions(temperature=0.5, max_tokens=50),
        )
    assert response.text == "Hello there"
    assert response.messages[0].reasoning is None  # nothing to send back
    assert response.usage == Usage(11, 7, cached_input_tokens=8, reasoning_tokens=4)
    assert isinstance(response.raw, types.GenerateContentResponse)
    (request,) = server.requests
    assert request.path.endswith("/models/test-model:generateContent")
    assert request.headers["x-goog-api-key"] == "g-key"
    body = request.body
    assert body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["generationConfig"] == {"temperature": 0.5, "maxOutputTokens": 50}
    assert "tools" not in body


async def test_stream_sends_text_as_it_comes_then_calls_and_usage(server: GeminiServer) -> None:
    body = response_body("one two three", calls=[("c1", "add", {"a": 1})], usage=(4, 3))
    server.answer(body)
    server.answer(body)
    async with client_for(server) as model:
        updates = [u async for u in model.stream([ChatMessage.user("x")], ChatOptions())]
        plain = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert [u.kind for u in updates] == ["text", "text", "text", "tool_call", "usage"]
    assert [u.text for u in updates[:3]] == ["one ", "two ", "three"]
    assert updates[3].tool_call == ToolCall("c1", "add", '{"a":1}')
    assert updates[4].usage == Usage(4, 3)
    assert AgentResponse.from_updates(updates).messages == plain.messages
    assert server.requests[0].path.endswith(":streamGenerateContent?alt=sse")


# --- messages on the wire ---------------------------------------------------------------


@both
async def test_tool_loop_with_parallel_calls_puts_results_in_one_user_turn(
    server: GeminiServer, streamed: bool
) -> None:
    server.answer(
        text="Adding.",
        calls=[("c1", "add", {"a": 1, "b": 2}), ("c2", "add", {"a": 3, "b": 4})],
    )
    server.answer(text="3 and 7")
    async with Agent(client_for(server), tools=[add]) as agent:
        if streamed:
            async with agent.stream("sums?") as stream:
                async for _ in stream:
                    pass
            answer = stream.response
            assert answer is not None
        else:
            answer = await agent.run("sums?")
    assert answer.text == "3 and 7"
    second = server.requests[1].body
    assert second["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "add",
                    "description": "Add two numbers.",
                    # The SDK's own spelling: Google's JSON parser takes both.
                    "parameters_json_schema": add.parameters | {},
                }
            ]
        }
    ]
    assert second["contents"] == [
        {"role": "user", "parts": [{"text": "sums?"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Adding."},
                {"functionCall": {"id": "c1", "name": "add", "args": {"a": 1, "b": 2}}},
                {"functionCall": {"id": "c2", "name": "add", "args": {"a": 3, "b": 4}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "c1", "name": "add", "response": {"output": "3"}}},
                {"functionResponse": {"id": "c2", "name": "add", "response": {"output": "7"}}},
            ],
        },
    ]


async def test_calls_without_ids_get_raf_ids_that_never_go_back(server: GeminiServer) -> None:
    server.answer(text=None, calls=[(None, "add", {"a": 1, "b": 2}), (None, "add", {"a": 2})])
    server.answer(text="done")
    async with Agent(client_for(server), tools=[add]) as agent:
        answer = await agent.run("sums?")
    first, second = answer.messages[0].tool_calls
    assert first.id != second.id
    assert first.id.startswith("raf-gemini-")
    model_turn, results = server.requests[1].body["contents"][1:]
    assert [part["functionCall"] for part in model_turn["parts"]] == [
        {"name": "add", "args": {"a": 1, "b": 2}},
        {"name": "add", "args": {"a": 2}},
    ]
    assert [part["functionResponse"]["name"] for part in results["parts"]] == ["add", "add"]
    assert all("id" not in part["functionResponse"] for part in results["parts"])


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"mode": "AUTO"}),
        ("none", {"mode": "NONE"}),
        ("required", {"mode": "ANY"}),
        ("add", {"mode": "ANY", "allowedFunctionNames": ["add"]}),
    ],
)
async def test_tool_choice_maps_to_function_calling_modes(
    server: GeminiServer, choice: str, wire: dict[str, Any]
) -> None:
    server.answer()
    async with client_for(server) as model:
        await model.complete([ChatMessage.user("x")], ChatOptions(tool_choice=choice, tools=(add,)))
    assert server.requests[0].body["toolConfig"] == {"functionCallingConfig": wire}


async def test_output_schema_and_extra_go_in_the_generation_config(server: GeminiServer) -> None:
    server.answer(text='{"n": 1}')
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    options = ChatOptions(
        output_schema=schema,
        extra={"thinking_config": {"include_thoughts": True, "thinking_budget": 64}, "top_k": 3},
    )
    async with client_for(server) as model:
        answer = await model.complete([ChatMessage.user("x")], options)
    assert answer.text == '{"n": 1}'
    config = server.requests[0].body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == schema
    # As the SDK sends it (Google's JSON parser takes field names in both spellings).
    assert config["thinkingConfig"] == {"include_thoughts": True, "thinking_budget": 64}
    assert config["topK"] == 3


async def test_an_unknown_extra_option_is_refused_by_name(server: GeminiServer) -> None:
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match="'reasoning_effort'"):
            await model.complete(
                [ChatMessage.user("x")], ChatOptions(extra={"reasoning_effort": "high"})
            )
    assert server.requests == []


async def test_the_tail_is_text_in_the_following_user_turn(server: GeminiServer) -> None:
    server.answer()
    messages = [
        ChatMessage.system("Be brief."),
        ChatMessage.user("old question"),
        ChatMessage.assistant("old answer"),
        ChatMessage.system("Fresh passages."),
        ChatMessage.user("new question"),
    ]
    async with client_for(server) as model:
        await model.complete(messages, ChatOptions(history_end=3))
    body = server.requests[0].body
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["contents"][-1] == {
        "role": "user",
        "parts": [{"text": "Fresh passages."}, {"text": "new question"}],
    }


async def test_the_agents_volatile_context_goes_to_the_user_turn(server: GeminiServer) -> None:
    server.answer()
    server.answer()
    agent = Agent(client_for(server), instructions="Be brief.", stack=[HistoryProvider(), Clock()])
    session = InMemorySession()
    async with agent:
        await agent.run("first", session=session)
        await agent.run("second", session=session)
    body = server.requests[1].body
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["contents"][-1] == {
        "role": "user",
        "parts": [{"text": "Now: 12:00."}, {"text": "second"}],
    }


async def test_without_history_the_volatile_context_stays_out_of_the_system_instruction(
    server: GeminiServer,
) -> None:
    class Ticking(ContextProvider):
        calls = 0

        async def on_invoking(self, *args: Any) -> ContextResult:
            Ticking.calls += 1
            return ContextResult(instructions=f"Now: call {Ticking.calls}.", volatile=True)

    server.answer()
    server.answer()
    async with Agent(client_for(server), instructions="Be brief.", stack=[Ticking()]) as agent:
        await agent.run("first")
        await agent.run("second")
    first, second = (request.body for request in server.requests)
    assert first["systemInstruction"] == second["systemInstruction"]
    assert second["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert second["contents"] == [
        {"role": "user", "parts": [{"text": "Now: call 2."}, {"text": "second"}]}
    ]


# --- thought signatures -----------------------------------------------------------------

SIGNED = {"thought": signature("t"), "add": signature("add"), "text": signature("x")}


def thinking_answers(server: GeminiServer) -> None:
    server.answer(
        text="Let me add.",
        thought="I add them.",
        calls=[("c1", "add", {"a": 1, "b": 2}), ("c2", "add", {"a": 3, "b": 4})],
        signatures=SIGNED,
    )
    server.answer(text="3 and 7")


EXPECTED_MODEL_TURN = {
    "role": "model",
    "parts": [
        {"text": "I add them.", "thought": True, "thoughtSignature": SIGNED["thought"]},
        {"text": "Let me add.", "thoughtSignature": SIGNED["text"]},
        {
            "functionCall": {"id": "c1", "name": "add", "args": {"a": 1, "b": 2}},
            "thoughtSignature": SIGNED["add"],
        },
        {"functionCall": {"id": "c2", "name": "add", "args": {"a": 3, "b": 4}}},
    ],
}


@both
async def test_thought_signatures_go_back_unchanged_in_the_tool_loop(
    server: GeminiServer, streamed: bool
) -> None:
    thinking_answers(server)
    async with Agent(client_for(server), tools=[add]) as agent:
        if streamed:
            async with agent.stream("sums?") as stream:
                async for _ in stream:
                    pass
            answer = stream.response
            assert answer is not None
        else:
            answer = await agent.run("sums?")
    assert answer.text == "3 and 7"
    assert server.requests[1].body["contents"][1] == EXPECTED_MODEL_TURN


async def test_the_reasoning_rides_on_the_message(server: GeminiServer) -> None:
    thinking_answers(server)
    async with client_for(server) as model:
        answer = await model.complete([ChatMessage.user("x")], ChatOptions())
    (message,) = answer.messages
    assert message.content == "Let me add."  # the thought is not the answer's text
    assert message.reasoning is not None
    assert message.reasoning.source == "gemini"
    order = json.loads(message.reasoning.data)
    assert [entry["type"] for entry in order] == ["thought", "text", "call", "call"]
    assert base64.b64decode(order[2]["signature"]) == b"sig:add"


async def test_reasoning_of_another_source_is_left_out(server: GeminiServer) -> None:
    server.answer()
    turn = ChatMessage(
        "assistant",
        "Let me add.",
        tool_calls=[ToolCall("c1", "add", '{"a":1,"b":2}')],
        reasoning=Reasoning("anthropic", '[{"type":"thinking","signature":"s"}]'),
    )
    messages = [ChatMessage.user("sums?"), turn, ChatMessage.tool("c1", "3", name="add")]
    async with client_for(server) as model:
        await model.complete(messages, ChatOptions())
    assert server.requests[0].body["contents"][1]["parts"] == [
        {"text": "Let me add."},
        {"functionCall": {"id": "c1", "name": "add", "args": {"a": 1, "b": 2}}},
    ]


async def test_a_turn_whose_calls_changed_is_sent_without_its_reasoning(
    server: GeminiServer,
) -> None:
    thinking_answers(server)
    server.answer()
    async with client_for(server) as model:
        answer = await model.complete([ChatMessage.user("x")], ChatOptions())
        turn = answer.messages[0]
        changed = ChatMessage(
            "assistant", turn.content, tool_calls=turn.tool_calls[:1], reasoning=turn.reasoning
        )
        messages = [ChatMessage.user("x"), changed, ChatMessage.tool("c1", "3")]
        await model.complete(messages, ChatOptions())
    assert server.requests[1].body["contents"][1]["parts"] == [
        {"text": "Let me add."},
        {"functionCall": {"id": "c1", "name": "add", "args": {"a": 1, "b": 2}}},
    ]


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (
            ChatMessage(
                "assistant",
                None,
                tool_calls=[ToolCall("c1", "add", "{}")],
                reasoning=Reasoning("gemini", "not json"),
            ),
            r"messages\[0\]: the reasoning \(source 'gemini'\)",
        ),
        (ChatMessage.tool("c9", "3"), r"messages\[0\]: tool message 'c9' answers no call"),
        (
            ChatMessage("assistant", None, tool_calls=[ToolCall("c1", "add", "[1]")]),
            r"messages\[0\]: the arguments of tool call 'c1' are not a JSON object",
        ),
    ],
)
async def test_a_message_gemini_cannot_take_is_refused_naming_it(
    server: GeminiServer, message: ChatMessage, match: str
) -> None:
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match=match):
            await model.complete([message], ChatOptions())
    assert server.requests == []


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_thought_signatures_survive_a_session_store_into_a_new_client(
    server: GeminiServer, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    thinking_answers(server)
    server.answer(text="again")

    def opened() -> Any:
        if store == "sqlite":
            return SqliteSessionStore(tmp_path / "s.db")
        redis: RedisServer = request.getfixturevalue("redis_server")
        return RedisSessionStore(redis.url, prefix=f"g{id(tmp_path)}")

    for question in ("sums?", "and now?"):
        # A new store connection and a new client each time: the signatures come from the
        # store alone.
        async with (
            opened() as sessions,
            Agent(client_for(server), tools=[add], stack=[HistoryProvider()]) as agent,
        ):
            await agent.run(question, session=await sessions.get("s"))
    assert server.requests[2].body["contents"][1] == EXPECTED_MODEL_TURN


# --- endings ----------------------------------------------------------------------------


@both
async def test_max_tokens_is_incomplete_with_the_partial(
    server: GeminiServer, streamed: bool
) -> None:
    server.answer(text="cut sh", finish_reason="MAX_TOKENS", usage=(5, 9))
    async with client_for(server) as model:
        with pytest.raises(IncompleteResponseError) as caught:
            await call(model, streamed)
    assert caught.value.reason == "MAX_TOKENS"
    assert not caught.value.retryable
    assert "raise max_tokens" in str(caught.value)
    assert caught.value.partial.text == "cut sh"
    assert caught.value.partial.usage == Usage(5, 9)


@both
@pytest.mark.parametrize(
    "reason", ["SAFETY", "RECITATION", "PROHIBITED_CONTENT", "MALFORMED_FUNCTION_CALL"]
)
async def test_a_safety_stop_is_a_non_retryable_error_naming_it(
    server: GeminiServer, streamed: bool, reason: str
) -> None:
    server.answer(text="I", finish_reason=reason)
    async with client_for(server) as model:
        with pytest.raises(ChatClientError, match=reason) as caught:
            await call(model, streamed)
    assert type(caught.value) is ChatClientError
    assert not caught.value.retryable


@both
async def test_a_blocked_prompt_is_a_non_retryable_error_naming_it(
    server: GeminiServer, streamed: bool
) -> None:
    server.answer(block_reason="PROHIBITED_CONTENT")
    async with client_for(server) as model:
        with pytest.raises(ChatClientError, match=r"blocked.*PROHIBITED_CONTENT") as caught:
            await call(model, streamed)
    assert type(caught.value) is ChatClientError
    assert not caught.value.retryable


async def test_a_stream_without_a_finish_reason_is_a_connection_error(
    server: GeminiServer,
) -> None:
    server.reply(Answer(events=chunks_of(response_body("cut short"), terminal=False)))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError, match="finishReason") as caught:
            await call(model, streamed=True)
    assert caught.value.retryable


async def test_a_stream_cut_mid_way_is_a_connection_error(server: GeminiServer) -> None:
    server.reply(Answer(body=response_body("one two three"), drop_after=2))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError):
            await call(model, streamed=True)


async def test_nothing_after_the_finish_reason_changes_the_answer(server: GeminiServer) -> None:
    chunks = chunks_of(response_body("done"))
    late = {"candidates": [{"content": {"role": "model", "parts": [{"text": "!"}]}}]}
    server.reply(Answer(events=[*chunks, late, {"error": {"code": 500, "message": "late"}}]))
    async with client_for(server) as model:
        assert (await call(model, streamed=True)).text == "done"


async def test_an_error_chunk_in_a_stream_is_the_error_it_names(server: GeminiServer) -> None:
    chunks = chunks_of(response_body("one two"), terminal=False)[:1]
    error = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    server.reply(Answer(events=[*chunks, error]))
    async with client_for(server) as model:
        with pytest.raises(ServerError, match="overloaded") as caught:
            await call(model, streamed=True)
    assert caught.value.retryable


async def test_a_reply_that_is_not_json_is_a_protocol_error(server: GeminiServer) -> None:
    server.reply(Answer(raw=b"<html>oops</html>", content_type="text/html"))
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError):
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
        (503, ServerError, True),
    ],
)
async def test_http_errors_map_to_rafs_tree(
    server: GeminiServer,
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
    assert caught.value.retry_after == 3.0
    assert "it went wrong" in str(caught.value)


async def test_a_reply_that_inflates_past_the_bound_is_refused(server: GeminiServer) -> None:
    body = json.dumps(response_body("hi")).encode()
    bomb = gzip.compress(body[:-1] + b" " * 3_000_000 + body[-1:])  # about 3 KB on the wire
    server.reply(Answer(raw=bomb, headers={"content-encoding": "gzip"}))
    async with client_for(server, max_response_bytes=1_000_000) as model:
        with pytest.raises(ChatProtocolError, match="max_response_bytes=1000000"):
            await call(model, streamed=False)


async def test_a_stream_past_the_bound_is_refused(server: GeminiServer) -> None:
    chunk = chunks_of(response_body("x" * 1000), terminal=False)[0]
    server.reply(Answer(events=[chunk] * 500))  # 500 KB, no end
    async with client_for(server, max_response_bytes=100_000) as model:
        with pytest.raises(ChatProtocolError, match="max_response_bytes=100000"):
            await call(model, streamed=True)


class Commenting(GeminiServer):
    """Streams each chunk after an SSE comment line, as keep-alive proxies do."""

    def respond(self, exchange: Exchange, request: Received, answer: Answer) -> None:
        chunks = chunks_of(answer.body)
        frames = [b": keep-alive\n\n" + sse(json.dumps(chunk)) for chunk in chunks]
        exchange.stream([*frames, b": bye\n"], "text/event-stream")


async def test_a_stream_with_sse_comments_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = Commenting()
    server.answer(response_body("Hello there"))
    try:
        async with client_for(server) as model:
            response = await call(model, streamed=True)
    finally:
        server.close()
    assert response.text == "Hello there"


async def test_api_version_is_the_version_in_the_paths(server: GeminiServer) -> None:
    server.answer()
    async with GeminiChatClient(
        "test-model", base_url=server.root_url, api_key="k", api_version="v1alpha"
    ) as model:
        await model.complete([ChatMessage.user("hi")], ChatOptions())
    assert server.requests[0].path.startswith("/v1alpha/models/test-model:generateContent")
    with pytest.raises(ValueError, match="api_version"):
        GeminiChatClient("m", api_key="k", api_version="")


@both
async def test_an_error_quotes_an_excerpt_of_a_huge_upstream_text(
    server: GeminiServer, streamed: bool
) -> None:
    server.fail(400, "it went wrong " + "x" * 2_000_000)
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match="it went wrong") as caught:
            await call(model, streamed)
    assert len(str(caught.value)) < 2000


async def test_an_invalid_key_is_an_authentication_error(server: GeminiServer) -> None:
    body = {
        "error": {
            "code": 400,
            "message": "API key not valid. Please pass a valid API key.",
            "status": "INVALID_ARGUMENT",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
            ],
        }
    }
    server.reply(Answer(400, body))
    async with client_for(server) as model:
        with pytest.raises(AuthenticationError, match="API key not valid"):
            await call(model, streamed=False)


@pytest.mark.slow
async def test_the_sdks_retries_get_past_an_outage(server: GeminiServer) -> None:
    server.fail(503, "busy")
    server.answer(text="fine")
    async with client_for(server, max_retries=1) as model:
        assert (await call(model, streamed=False)).text == "fine"
    assert len(server.requests) == 2


@both
async def test_a_slow_server_is_a_timeout(server: GeminiServer, streamed: bool) -> None:
    server.reply(Answer(body=response_body(), delay=2.0))
    async with client_for(server, timeout=0.2) as model:
        with pytest.raises(ChatTimeoutError) as caught:
            await call(model, streamed)
    assert caught.value.retryable


async def test_a_stalled_stream_is_an_idle_timeout(server: GeminiServer) -> None:
    server.reply(Answer(body=response_body("one two three"), stall_after=2))
    async with client_for(server, idle_timeout=0.2) as model:
        with pytest.raises(ChatTimeoutError, match="idle_timeout"):
            await call(model, streamed=True)


@both
async def test_a_dropped_connection_is_a_connection_error(
    server: GeminiServer, streamed: bool
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
    model = GeminiChatClient("m", base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0)
    async with model:
        with pytest.raises(ChatConnectionError):
            await call(model, streamed=False)


async def test_the_key_comes_from_gemini_api_key_then_google_api_key(
    server: GeminiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.answer()
    server.answer()
    monkeypatch.setenv("GOOGLE_API_KEY", "from-google")
    async with GeminiChatClient("m", base_url=server.root_url, max_retries=0) as model:
        await call(model, streamed=False)
    monkeypatch.setenv("GEMINI_API_KEY", "from-gemini")
    async with GeminiChatClient("m", base_url=server.root_url, max_retries=0) as model:
        await call(model, streamed=False)
    keys = [request.headers["x-goog-api-key"] for request in server.requests]
    assert keys == ["from-google", "from-gemini"]


async def test_no_api_key_is_an_authentication_error(server: GeminiServer) -> None:
    async with GeminiChatClient("m", base_url=server.root_url) as model:
        with pytest.raises(AuthenticationError, match="GEMINI_API_KEY"):
            await call(model, streamed=False)


def test_opentelemetry_names_the_provider_as_the_genai_conventions_do() -> None:
    assert raf.otel.gen_ai_provider_name(GeminiChatClient("m", api_key="k")) == "gcp.gemini"


def test_bad_keywords_are_value_errors() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        GeminiChatClient("m", api_key="k", max_retries=-1)
    with pytest.raises(ValueError, match="idle_timeout"):
        GeminiChatClient("m", api_key="k", idle_timeout=0)
    with pytest.raises(ValueError, match="client="):
        GeminiChatClient("m", api_key="k", client=object())  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_on_trio_a_call_is_an_error_that_says_asyncio_only() -> None:
    async with GeminiChatClient("m", api_key="k") as model:
        with pytest.raises(ChatClientError, match="asyncio only") as caught:
            await call(model, streamed=False)
        with pytest.raises(ChatClientError, match="asyncio only"):
            await call(model, streamed=True)
    assert not caught.value.retryable


# --- raf run and raf chat ---------------------------------------------------------------


def gemini_config(tmp_path: Path, server: GeminiServer) -> Path:
    config = tmp_path / "agent.toml"
    config.write_text(
        f"""
[agent]
name = "support"
instructions = "Be brief."

[model]
client = "gemini"
model = "gemini-test"
base_url = "{server.root_url}"
max_tokens = 300

[[providers]]
kind = "memory"
"""
    )
    return config


def test_raf_run_answers_with_gemini(
    server: GeminiServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "g-env")
    server.answer(text="Hello from Gemini")
    assert run_raf(["run", str(gemini_config(tmp_path, server)), "hi"]) == 0
    assert capsys.readouterr().out == "Hello from Gemini\n"
    (request,) = server.requests
    assert request.path.endswith("/models/gemini-test:streamGenerateContent?alt=sse")
    assert request.body["generationConfig"]["maxOutputTokens"] == 300
    assert request.body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert request.headers["x-goog-api-key"] == "g-env"


def test_raf_chat_talks_with_gemini(
    server: GeminiServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "g-env")
    server.answer(text="first answer")
    server.answer(text="second answer")
    lines = iter(["one", "two", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    config = str(gemini_config(tmp_path, server))
    assert run_raf(["chat", config, "--session", "c", "--db", str(tmp_path / "s.db")]) == 0
    assert capsys.readouterr().out == "first answer\nsecond answer\n"
    contents = server.requests[1].body["contents"]
    assert [content["role"] for content in contents] == ["user", "model", "user"]


def test_raf_run_without_a_key_names_both_variables(
    server: GeminiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_raf(["run", str(gemini_config(tmp_path, server)), "hi"]) != 0
    assert "GEMINI_API_KEY or GOOGLE_API_KEY" in capsys.readouterr().err


async def test_a_consumer_that_leaves_early_closes_the_stream(server: GeminiServer) -> None:
    server.reply(Answer(body=response_body("one two three four"), stall_after=2))
    async with client_for(server) as model:
        stream = model.stream([ChatMessage.user("x")], ChatOptions())
        async for update in stream:
            assert update.text == "one "
            break
        await stream.aclose()  # type: ignore[attr-defined]
        server.answer(text="next")  # the client still answers
        assert (await call(model, streamed=False)).text == "next"
