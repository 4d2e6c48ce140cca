"""The OpenAI clients and the provider's prompt cache: the ``prompt_cache_key`` they send
and the cached tokens they read, through the real SDK against loopback servers."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from raf import (
    Agent,
    AgentRunOptions,
    ChatMessage,
    ChatOptions,
    InMemorySession,
    OpenAIChatClient,
    OpenAIResponsesClient,
    Usage,
)
from tests._harness.loopback_server import LoopbackServer
from tests._harness.openai_server import OpenAIServer, Reply, completion, text_stream
from tests._harness.responses_server import ResponsesServer, response_body

pytestmark = pytest.mark.anyio

Client = OpenAIChatClient | OpenAIResponsesClient


@attrs.frozen
class Wire:
    """One OpenAI protocol: its server, a client on it, and a reply that reports the cache."""

    server: LoopbackServer[Any]
    client: Client
    #: Queue one answer whose usage says ``(input, output)``, ``cached`` and ``written``;
    #: ``streamed`` for a streamed call.
    answer: Callable[..., None]


def _chat_answer(server: OpenAIServer) -> Callable[..., None]:
    def answer(
        prompt: int, output: int, cached: int = 0, written: int = 0, streamed: bool = False
    ) -> None:
        if streamed:
            *chunks, last = text_stream("ok", usage=(prompt, output))
            last["usage"]["prompt_tokens_details"] = {
                "cached_tokens": cached,
                "cache_write_tokens": written,
            }
            server.reply(Reply(events=(*chunks, last)))
            return
        body = completion(usage=(prompt, output), cached=cached)
        body["usage"]["prompt_tokens_details"]["cache_write_tokens"] = written
        server.answer(body)

    return answer


def _responses_answer(server: ResponsesServer) -> Callable[..., None]:
    def answer(
        prompt: int, output: int, cached: int = 0, written: int = 0, streamed: bool = False
    ) -> None:
        body = response_body(usage=(prompt, output), cached=cached)
        body["usage"]["input_tokens_details"]["cache_write_tokens"] = written
        server.answer(body)  # streamed or not, as the request asks

    return answer


@pytest.fixture(params=["chat", "responses"])
def wire(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Wire]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server: Any
    client: Client
    if request.param == "chat":
        server = OpenAIServer()
        client = OpenAIChatClient(
            "test-model", base_url=server.base_url, api_key="sk-test", max_retries=0
        )
        answer = _chat_answer(server)
    else:
        server = ResponsesServer()
        client = OpenAIResponsesClient(
            "test-model", base_url=server.base_url, api_key="sk-test", max_retries=0
        )
        answer = _responses_answer(server)
    yield Wire(server, client, answer)
    server.close()


def expected_key(session_id: str, name: str | None = None) -> str:
    owner = session_id if name is None else f"{name}\x00{session_id}"
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


async def test_the_key_is_the_agent_and_the_session_hashed_and_stable(wire: Wire) -> None:
    one, two = InMemorySession(), InMemorySession()
    for _ in range(4):
        wire.answer(10, 1)
    async with wire.client:
        support = Agent(wire.client, name="support")
        for session in (one, one, two):
            await support.run("hi", session=session)
        await Agent(wire.client).run("hi", session=one)
    keys = [request.body["prompt_cache_key"] for request in wire.server.requests]
    assert keys == [
        expected_key(one.id, "support"),
        expected_key(one.id, "support"),
        expected_key(two.id, "support"),
        expected_key(one.id),
    ]
    assert len(set(keys)) == 3
    assert one.id not in keys[0]  # the ids do not go out as they are


@pytest.mark.parametrize(
    "extra",
    [{"prompt_cache_key": "mine"}, {"extra_body": {"prompt_cache_key": "mine"}}],
    ids=["extra", "extra_body"],
)
async def test_a_key_the_caller_set_is_not_overridden(wire: Wire, extra: dict[str, Any]) -> None:
    wire.answer(10, 1)
    async with wire.client:
        agent = Agent(wire.client, name="support")
        await agent.run("hi", session=InMemorySession(), options=AgentRunOptions(extra=extra))
    assert wire.server.requests[0].body["prompt_cache_key"] == "mine"


async def test_a_call_outside_a_session_sends_no_key(wire: Wire) -> None:
    wire.answer(10, 1)
    async with wire.client:
        await wire.client.complete([ChatMessage.user("hi")], ChatOptions())
    assert "prompt_cache_key" not in wire.server.requests[0].body


async def test_the_cached_part_of_the_prompt_is_read_into_the_usage(wire: Wire) -> None:
    wire.answer(1200, 7, cached=1024)
    wire.answer(1300, 5, cached=1152, written=64, streamed=True)
    session = InMemorySession()
    async with wire.client:
        agent = Agent(wire.client, history=True)
        first = await agent.run("hi", session=session)
        async with agent.stream("again", session=session) as stream:
            async for _ in stream:
                pass
    assert first.usage == Usage(1200, 7, cached_input_tokens=1024)
    assert stream.response is not None
    assert stream.response.usage == Usage(1300, 5, cached_input_tokens=1152, cache_write_tokens=64)
