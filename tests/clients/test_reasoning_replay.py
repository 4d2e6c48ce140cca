"""Reasoning kept on a message, across vendors (through their real SDKs against the
loopback servers): a turn from one wire replayed into another after a fallback, a
turn whose reasoning was tampered with in a store, and a streamed turn's reasoning
against the whole reply's. Gemini's SDK is asyncio-only, so these run on asyncio."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import raf.serve
from raf import (
    Agent,
    AgentResponse,
    AnthropicChatClient,
    ChatMessage,
    ChatOptions,
    FallbackMiddleware,
    GeminiChatClient,
    HistoryProvider,
    OpenAIResponsesClient,
    Reasoning,
    ToolCall,
    tool,
)
from raf.errors import BadRequestError
from tests._harness.anthropic_server import AnthropicServer, message_body
from tests._harness.gemini_server import GeminiServer
from tests._harness.gemini_server import response_body as gemini_body
from tests._harness.gemini_server import signature as gemini_signature
from tests._harness.responses_server import ResponsesServer
from tests._harness.responses_server import response_body as responses_body

pytestmark = pytest.mark.anyio

Client = AnthropicChatClient | GeminiChatClient | OpenAIResponsesClient


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # google-genai's async client runs on asyncio only


class Servers(dict[str, Any]):
    """The loopback server of each wire, started when first asked for."""

    def __missing__(self, source: str) -> Any:
        kinds = {"anthropic": AnthropicServer, "gemini": GeminiServer}
        self[source] = kinds.get(source, ResponsesServer)()
        return self[source]


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Servers]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = Servers()
    yield running
    for server in running.values():
        server.close()


def client(servers: dict[str, Any], source: str) -> Client:
    server = servers[source]
    if source == "anthropic":
        return AnthropicChatClient("m", base_url=server.root_url, api_key="k", max_retries=0)
    if source == "gemini":
        return GeminiChatClient("m", base_url=server.root_url, api_key="k", max_retries=0)
    return OpenAIResponsesClient("m", base_url=server.base_url, api_key="k", max_retries=0)


def answer_thinking(servers: dict[str, Any], source: str) -> None:
    """Queue a reply with reasoning and two calls on ``source``'s server."""
    calls = [("c1", "add", {"a": 1, "b": 2}), ("c2", "add", {"a": 3, "b": 4})]
    server = servers[source]
    if source == "anthropic":
        server.answer(message_body("Let me add.", thinking=[("I add.", "sig-abc")], calls=calls))
    elif source == "gemini":
        server.answer(
            gemini_body(
                "Let me add.",
                thought="I add.",
                calls=calls,
                signatures={"thought": gemini_signature("t"), "add": gemini_signature("a")},
            )
        )
    else:
        wire = [(i, n, json.dumps(a)) for i, n, a in calls]
        server.answer(responses_body("Let me add.", calls=wire, reasoning="rs_1"))


def answer_plain(servers: dict[str, Any], source: str) -> None:
    server = servers[source]
    if source == "anthropic":
        server.answer(message_body("3 and 7"))
    elif source == "gemini":
        server.answer(gemini_body("3 and 7"))
    else:
        server.answer(responses_body("3 and 7"))


SOURCES = ["anthropic", "gemini", "openai.responses"]


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.mark.parametrize("source", SOURCES)
async def test_streamed_and_whole_turns_keep_the_same_reasoning(
    servers: dict[str, Any], source: str
) -> None:
    answer_thinking(servers, source)
    answer_thinking(servers, source)
    async with client(servers, source) as model:
        messages = [ChatMessage.user("x")]
        whole = await model.complete(messages, ChatOptions())
        updates = [u async for u in model.stream(messages, ChatOptions())]
    streamed = AgentResponse.from_updates(updates)
    assert whole.messages[0].reasoning is not None
    assert whole.messages[0].reasoning.source == source
    assert streamed.messages[0].reasoning == whole.messages[0].reasoning


@pytest.mark.parametrize(
    ("primary", "backup"), [(a, b) for a in SOURCES for b in SOURCES if a != b]
)
async def test_a_fallback_mid_tool_loop_leaves_the_other_wires_reasoning_out(
    servers: dict[str, Any], primary: str, backup: str
) -> None:
    answer_thinking(servers, primary)
    servers[primary].fail({"anthropic": 529, "gemini": 503}.get(primary, 500), "gone")
    answer_plain(servers, backup)
    agent = Agent(
        client(servers, primary),
        tools=[add],
        chat_stack=[FallbackMiddleware(client(servers, backup))],
    )
    async with agent:
        answer = await agent.run("sums?")
    assert answer.text == "3 and 7"
    (request,) = servers[backup].requests
    sent = str(request.body)
    for kept in ("sig-abc", "rs_1", "I add.", gemini_signature("a")):
        assert kept not in sent


TAMPERED = ["not json", '[{"type":"thinking"', "null", "7", '"text"', "[1]"]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("data", TAMPERED)
async def test_tampered_reasoning_is_a_bad_request_naming_the_message(
    servers: dict[str, Any], source: str, data: str
) -> None:
    turn = ChatMessage(
        "assistant",
        "Let me add.",
        tool_calls=[ToolCall("c1", "add", '{"a":1,"b":2}')],
        reasoning=Reasoning(source, data),
    )
    messages = [ChatMessage.user("x"), turn, ChatMessage.tool("c1", "3", name="add")]
    async with client(servers, source) as model:
        with pytest.raises(BadRequestError, match=r"messages\[1\]"):
            await model.complete(messages, ChatOptions())
    assert servers[source].requests == []


@pytest.mark.parametrize("source", SOURCES)
async def test_a_turn_whose_calls_a_provider_edited_goes_back_without_reasoning(
    servers: Servers, source: str
) -> None:
    answer_thinking(servers, source)
    answer_plain(servers, source)
    async with client(servers, source) as model:
        turn = (await model.complete([ChatMessage.user("x")], ChatOptions())).messages[0]
        edited = ChatMessage(
            "assistant", turn.content, tool_calls=turn.tool_calls[1:], reasoning=turn.reasoning
        )
        messages = [ChatMessage.user("x"), edited, ChatMessage.tool("c2", "7", name="add")]
        await model.complete(messages, ChatOptions())
    sent = str(servers[source].requests[1].body)
    for kept in ("sig-abc", "rs_1", "I add.", gemini_signature("a")):
        assert kept not in sent
    assert "c2" in sent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("source", SOURCES)
async def test_reasoning_survives_raf_serve_keeping_the_history(
    servers: Servers, source: str, stream: bool
) -> None:
    answer_thinking(servers, source)
    answer_plain(servers, source)
    answer_plain(servers, source)
    agent = Agent(client(servers, source), tools=[add], stack=[HistoryProvider()])
    headers = {"X-Session-Id": f"s-{source}-{stream}"}
    transport = httpx.ASGITransport(app=raf.serve.app(agent))
    async with (
        agent,
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http,
    ):
        conversation = [{"role": "user", "content": "sums?"}]
        for text in ("sums?", "more?"):
            conversation[-1] = {"role": "user", "content": text}
            body = {"model": "raf-agent", "messages": conversation, "stream": stream}
            reply = await http.post("/v1/chat/completions", json=body, headers=headers)
            assert reply.status_code == 200, reply.text
            conversation += [{"role": "assistant", "content": "3 and 7"}, {}]
    third = str(servers[source].requests[2].body)
    assert "more?" in third
    for kept in {
        "anthropic": ["sig-abc", "I add."],
        "gemini": [gemini_signature("a"), gemini_signature("t"), "I add."],
        "openai.responses": ["rs_1"],
    }[source]:
        assert kept in third
