"""Red-team probes of GeminiChatClient through the real google-genai SDK against the
loopback server: odd chunks, odd calls, odd errors, and the reasoning it keeps."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import anyio
import pytest

from raf import AgentResponse, ChatMessage, ChatOptions, Reasoning, ToolCall, Update
from raf.errors import (
    BadRequestError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    RateLimitError,
)
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

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # google-genai's async client runs on asyncio only


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[GeminiServer]:
    yield from served(monkeypatch)


both = pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])


class HalfEventServer(GeminiServer):
    """Streams the first chunk, then half of the last one, and cuts the connection."""

    def respond(self, exchange: Exchange, request: Received, answer: Answer) -> None:
        chunks = chunks_of(response_body("one two three"))
        last = sse(json.dumps(chunks[-1]))
        exchange.stream(
            [sse(json.dumps(chunks[0])), last[: len(last) // 2]], "text/event-stream", end="cut"
        )


async def test_a_stream_cut_mid_event_is_a_connection_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = HalfEventServer()
    server.answer()
    try:
        async with client_for(server) as model:
            with pytest.raises(ChatConnectionError):
                await call(model, streamed=True)
    finally:
        server.close()


@both
async def test_a_reply_with_two_candidates_is_a_protocol_error(
    server: GeminiServer, streamed: bool
) -> None:
    body = response_body("one")
    body["candidates"].append({**body["candidates"][0], "index": 1})
    server.reply(Answer(body=body, events=[body] if streamed else None))
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match="2 candidates"):
            await call(model, streamed)


async def test_an_early_finish_reason_ends_the_answer(server: GeminiServer) -> None:
    chunks = chunks_of(response_body("one two three"))
    chunks[0]["candidates"][0]["finishReason"] = "STOP"
    server.reply(Answer(events=chunks))
    async with client_for(server) as model:
        updates = [u async for u in model.stream([ChatMessage.user("x")], ChatOptions())]
    assert AgentResponse.from_updates(updates).text == "one "
    assert [u.kind for u in updates] == ["text"]


@both
async def test_the_same_function_twice_and_one_without_args(
    server: GeminiServer, streamed: bool
) -> None:
    calls = [(None, "add", {"a": 1}), (None, "add", {"a": 2}), (None, "now", {})]
    body = response_body(None, calls=calls, signatures={"add": signature("add")})
    del body["candidates"][0]["content"]["parts"][2]["functionCall"]["args"]
    server.answer(body)
    server.answer()
    async with client_for(server) as model:
        answer = await call(model, streamed)
        turn = answer.messages[0]
        assert [(c.name, c.arguments) for c in turn.tool_calls] == [
            ("add", '{"a":1}'),
            ("add", '{"a":2}'),
            ("now", "{}"),
        ]
        assert len({c.id for c in turn.tool_calls}) == 3
        results = [ChatMessage.tool(c.id, str(n)) for n, c in enumerate(turn.tool_calls)]
        await model.complete([ChatMessage.user("x"), turn, *results], ChatOptions())
    contents = server.requests[1].body["contents"]
    assert contents[1]["parts"] == [
        {"functionCall": {"name": "add", "args": {"a": 1}}, "thoughtSignature": signature("add")},
        {"functionCall": {"name": "add", "args": {"a": 2}}},
        {"functionCall": {"name": "now", "args": {}}},
    ]
    assert [p["functionResponse"]["name"] for p in contents[2]["parts"]] == ["add", "add", "now"]


@both
async def test_a_signature_on_text_and_unicode_thoughts_go_back_unchanged(
    server: GeminiServer, streamed: bool
) -> None:
    thought = "think \U0001f600 \u00e9\u4e2d \ud800 end"
    body = response_body(
        "héllo 😀",
        thought=thought,
        signatures={"thought": signature("t"), "text": signature("x")},
    )
    server.answer(body)
    server.answer()
    async with client_for(server) as model:
        answer = await call(model, streamed)
        turn = answer.messages[0]
        assert turn.content == "héllo 😀"
        again = ChatMessage.from_dict(json.loads(json.dumps(turn.to_dict())))
        await model.complete([ChatMessage.user("x"), again, ChatMessage.user("y")], ChatOptions())
    assert server.requests[1].body["contents"][1]["parts"] == [
        # the thought as it came, lone surrogate and all: its signature covers it
        {"text": thought, "thought": True, "thoughtSignature": signature("t")},
        {"text": "héllo 😀", "thoughtSignature": signature("x")},
    ]


async def test_streamed_and_whole_reasoning_are_the_same_bytes(server: GeminiServer) -> None:
    body = response_body(
        "a b",
        thought="hmm",
        calls=[("c1", "add", {"a": 1}), ("c2", "add", {"a": 2})],
        signatures={"thought": signature("t"), "text": signature("x"), "add": signature("a")},
    )
    server.answer(body)
    server.answer(body)
    async with client_for(server) as model:
        whole = await call(model, streamed=False)
        streamed = await call(model, streamed=True)
    assert whole.messages[0].reasoning is not None
    assert streamed.messages[0].reasoning == whole.messages[0].reasoning


@both
async def test_a_429_with_retry_info_is_read_as_retry_after(
    server: GeminiServer, streamed: bool
) -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Quota exceeded.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "38s"}],
        }
    }
    server.reply(Answer(429, body))
    async with client_for(server) as model:
        with pytest.raises(RateLimitError) as caught:
            await call(model, streamed)
    assert caught.value.retry_after == 38.0


async def test_a_429_error_chunk_mid_stream_carries_its_retry_delay(server: GeminiServer) -> None:
    chunks = chunks_of(response_body("one two"), terminal=False)[:1]
    info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}
    error = {"error": {"code": 429, "message": "slow down", "details": [info]}}
    server.reply(Answer(events=[*chunks, error]))
    async with client_for(server) as model:
        with pytest.raises(RateLimitError) as caught:
            await call(model, streamed=True)
    assert caught.value.retry_after == 1.5


@pytest.mark.slow
@both
async def test_timeout_bounds_the_sdks_retries(server: GeminiServer, streamed: bool) -> None:
    for _ in range(4):
        server.fail(503, "busy")
    async with client_for(server, max_retries=3, timeout=0.5) as model:
        with pytest.raises(ChatTimeoutError, match="retries included"):
            await call(model, streamed)


@pytest.mark.parametrize(
    "data",
    [
        '{"type":"call"}',
        "[1]",
        "null",
        '[{"type":"call"}]',
        '[{"type":"call","id":"c1","signature":5}]',
        '[{"type":"call","id":"c1","signature":"!!"}]',
        '[{"type":"call","id":"c1","sig',
    ],
)
async def test_tampered_reasoning_is_an_error_naming_the_message(
    server: GeminiServer, data: str
) -> None:
    turn = ChatMessage(
        "assistant",
        None,
        tool_calls=[ToolCall("c1", "add", "{}")],
        reasoning=Reasoning("gemini", data),
    )
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match=r"messages\[1\]"):
            await model.complete([ChatMessage.user("x"), turn], ChatOptions())
    assert server.requests == []


@pytest.mark.slow
async def test_a_consumer_that_breaks_closes_the_connection_without_a_warning(
    server: GeminiServer,
) -> None:
    # Megabytes of words: more than the sockets buffer, so the server sees the client go.
    server.answer(text=" ".join(["word"] * 100_000))
    async with client_for(server) as model:
        async for update in model.stream([ChatMessage.user("x")], ChatOptions()):
            assert update.text == "word "
            break
        gc.collect()  # no ResourceWarning (filterwarnings=error), nothing left unclosed
        assert await anyio.to_thread.run_sync(server.stream_aborted.wait, 20)
        server.answer(text="next")
        assert (await call(model, streamed=False)).text == "next"


def test_reprs_do_not_dump_the_reasoning() -> None:
    reasoning = Reasoning("gemini", "x" * 1_000_000)
    message = ChatMessage("assistant", "hi", reasoning=reasoning)
    assert len(repr(message)) < 1000
    assert len(repr(Update.of_reasoning(reasoning))) < 1000
    assert len(repr(reasoning)) < 1000
