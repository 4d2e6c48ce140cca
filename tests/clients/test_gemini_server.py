"""The Gemini loopback server checked against the real ``google-genai`` SDK: what it sends
is what the SDK parses into its own types, plain, streamed and failed, so the client
tests cannot agree with a wrong server. google-genai's async client runs on asyncio only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import pytest
from google import genai
from google.genai import errors, types

from tests._harness.gemini_server import GeminiServer, response_body, signature
from tests._harness.tls import TLS

pytestmark = pytest.mark.anyio

BODY = response_body(
    "two words",
    calls=[("c1", "add", {"a": 1, "b": 2}), (None, "mul", {"a": 3, "b": 4})],
    thought="Let me add.",
    signatures={"thought": signature("t"), "add": signature("add")},
    usage=(10, 7),
    cached=4,
    thoughts_tokens=3,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[GeminiServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = GeminiServer()
    yield running
    running.close()


@pytest.fixture
async def models(server: GeminiServer) -> AsyncIterator[Any]:
    """The SDK's async models API on the server, its connections closed after.

    Over httpx, as raf's client speaks it: with aiohttp installed (litellm brings it) the
    SDK would take aiohttp, whose session class warns when the SDK subclasses it."""
    options = types.HttpOptions(
        base_url=server.root_url,
        # The SDK's httpx and websockets TLS contexts too: one each per client otherwise.
        async_client_args={
            "transport": httpx2.AsyncHTTPTransport(verify=TLS),
            "verify": TLS,
            "ssl": TLS,
        },
    )
    client = genai.Client(api_key="g-key", http_options=options)
    yield client.aio.models
    await client.aio.aclose()


def check(parts: list[types.Part], usage: types.GenerateContentResponseUsageMetadata) -> None:
    thought, *rest = parts
    assert thought.thought is True
    assert thought.text == "Let me add."
    assert thought.thought_signature == b"sig:t"
    text = "".join(part.text or "" for part in rest if part.function_call is None)
    assert text == "two words"
    first, second = (part for part in rest if part.function_call is not None)
    assert first.function_call is not None
    assert (first.function_call.id, first.function_call.name) == ("c1", "add")
    assert first.function_call.args == {"a": 1, "b": 2}
    assert first.thought_signature == b"sig:add"
    assert second.function_call is not None
    assert (second.function_call.id, second.function_call.args) == (None, {"a": 3, "b": 4})
    assert (usage.prompt_token_count, usage.candidates_token_count) == (10, 7)
    assert (usage.cached_content_token_count, usage.thoughts_token_count) == (4, 3)


async def test_the_sdk_parses_a_response(server: GeminiServer, models: Any) -> None:
    server.answer(BODY)
    response = await models.generate_content(model="test-model", contents="hi")
    assert isinstance(response, types.GenerateContentResponse)
    (candidate,) = response.candidates or []
    assert candidate.finish_reason == types.FinishReason.STOP
    assert candidate.content is not None
    assert response.usage_metadata is not None
    check(candidate.content.parts or [], response.usage_metadata)
    (request,) = server.requests
    assert request.path.endswith("/models/test-model:generateContent")  # /v1 or /v1beta
    assert request.headers["x-goog-api-key"] == "g-key"
    assert request.body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]


async def test_the_sdk_reads_a_stream_chunk_by_chunk(server: GeminiServer, models: Any) -> None:
    server.answer(BODY)
    stream = await models.generate_content_stream(model="test-model", contents="hi")
    chunks = [chunk async for chunk in stream]
    parts = [
        part
        for chunk in chunks
        for candidate in chunk.candidates or []
        if candidate.content is not None
        for part in candidate.content.parts or []
    ]
    signed = [part for part in parts if part.thought_signature == b"sig:t"]
    assert len(signed) == 1  # the thought's signature on a part of its own
    assert signed[0].text == ""
    # The SDK hands over parts as they came: the signature follows its thought.
    merged = [parts[0].model_copy(update={"thought_signature": b"sig:t"}), *parts[2:]]
    assert parts[1] is signed[0]
    assert merged[0].thought is True
    assert chunks[-1].usage_metadata is not None
    check(merged, chunks[-1].usage_metadata)
    assert [c.candidates[0].finish_reason for c in chunks if c.candidates][-1] == "STOP"
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1] if c.candidates)
    (request,) = server.requests
    assert request.path.endswith("/models/test-model:streamGenerateContent?alt=sse")


async def test_the_sdk_reads_a_blocked_prompt(server: GeminiServer, models: Any) -> None:
    server.answer(block_reason="SAFETY")
    response = await models.generate_content(model="test-model", contents="hi")
    assert response.candidates is None
    assert response.prompt_feedback is not None
    assert response.prompt_feedback.block_reason == types.BlockedReason.SAFETY


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, errors.ClientError),
        (401, errors.ClientError),
        (403, errors.ClientError),
        (404, errors.ClientError),
        (413, errors.ClientError),
        (429, errors.ClientError),
        (500, errors.ServerError),
        (503, errors.ServerError),
    ],
)
@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_the_sdk_reads_an_error(
    server: GeminiServer,
    models: Any,
    status: int,
    error: type[errors.APIError],
    streamed: bool,
) -> None:
    server.fail(status, "it went wrong", headers={"retry-after": "3"})
    with pytest.raises(error) as caught:
        await generate(models, streamed)
    assert caught.value.code == status
    assert caught.value.message == "it went wrong"
    assert caught.value.status == error_status(status)
    assert caught.value.response.headers["retry-after"] == "3"


async def generate(models: Any, streamed: bool) -> None:
    if streamed:
        async for _ in await models.generate_content_stream(model="test-model", contents="x"):
            pass
    else:
        await models.generate_content(model="test-model", contents="x")


def error_status(status: int) -> str:
    from tests._harness.gemini_server import STATUSES

    return STATUSES[status]
