"""Compaction on the wires that do it on their servers: OpenAI Responses
(``context_management``, ``POST /responses/compact``) and Anthropic (the
``compact_20260112`` edit behind its beta), against loopback servers that compact as
those servers do and refuse what they refuse (tests/_harness/context_window.py, checked
against the SDKs' own types)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from raf import (
    AgentResponse,
    AnthropicChatClient,
    ChatMessage,
    ChatOptions,
    Compaction,
    OpenAIResponsesClient,
)
from tests._harness.anthropic_server import AnthropicServer
from tests._harness.context_window import AnthropicCompaction, ResponsesCompaction
from tests._harness.responses_server import ResponsesServer

pytestmark = pytest.mark.anyio

SYSTEM = ChatMessage.system("Be brief.")


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


async def _call(
    client: Any, messages: list[ChatMessage], options: ChatOptions, streamed: bool
) -> AgentResponse:
    if streamed:
        return AgentResponse.from_updates([u async for u in client.stream(messages, options)])
    response: AgentResponse = await client.complete(messages, options)
    return response


def _history(words: int) -> list[ChatMessage]:
    return [SYSTEM, ChatMessage.user("word " * words), ChatMessage.assistant("noted")]


@pytest.mark.parametrize("streamed", [False, True])
async def test_responses_compacts_past_the_threshold_and_sends_from_the_item_on(
    responses: ResponsesServer, streamed: bool
) -> None:
    client = OpenAIResponsesClient("m", base_url=responses.base_url, api_key="k", max_retries=0)
    options = ChatOptions(compact_threshold=500)
    history = [*_history(4000), ChatMessage.user("go on")]
    try:
        responses.answer(text="done")
        first = await _call(client, history, options, streamed)
        turn = first.messages[0]
        later = [*history, turn, ChatMessage.user("and then?")]
        responses.answer(text="then")
        second = await _call(client, later, options, streamed)
    finally:
        await client.aclose()
    assert responses.requests[0].body["context_management"] == [
        {"type": "compaction", "compact_threshold": 500}
    ]
    compaction = turn.compaction
    assert isinstance(compaction, Compaction)
    assert compaction.source == "openai.responses"
    assert compaction.summary is None  # OpenAI's item is encrypted
    item = json.loads(compaction.data)  # kept as it came, output metadata included
    assert item["type"] == "compaction"
    assert item["created_by"] == "compaction"
    assert item["encrypted_content"] in responses.compaction.issued
    assert turn.content == "done"
    sent = responses.requests[1].body["input"]
    # The standing prompt, the item (as the input item it is), the turn's text, the new
    # request: what the item replaced (the long user message) is never sent again.
    assert sent == [
        {"role": "system", "content": "Be brief."},
        {"type": "compaction", "id": item["id"], "encrypted_content": item["encrypted_content"]},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "and then?"},
    ]
    assert second.text == "then"


async def test_responses_compact_asks_for_the_same_input_and_cache_key(
    responses: ResponsesServer,
) -> None:
    client = OpenAIResponsesClient("m", base_url=responses.base_url, api_key="k", max_retries=0)
    options = ChatOptions(session_id="s1", extra={"timeout": 30})
    history = [*_history(50), ChatMessage.user("go on")]
    try:
        compaction = await client.compact(history, options)
        called = client.request_body(history, options)[1]
    finally:
        await client.aclose()
    request = responses.requests[0]
    assert request.path == "/v1/responses/compact"
    assert request.body == {
        "model": "m",
        "input": called["input"],
        "prompt_cache_key": called["prompt_cache_key"],
    }
    assert compaction.source == "openai.responses"
    assert json.loads(compaction.data)["encrypted_content"] in responses.compaction.issued


async def test_responses_refuses_an_item_it_never_issued(responses: ResponsesServer) -> None:
    """The loopback server is as strict as the real one: what raf sends back must be the
    item as it came."""
    from raf.errors import BadRequestError

    client = OpenAIResponsesClient("m", base_url=responses.base_url, api_key="k", max_retries=0)
    forged = Compaction("openai.responses", '{"type":"compaction","encrypted_content":"x"}')
    try:
        with pytest.raises(BadRequestError, match="could not be verified"):
            await client.complete(
                [ChatMessage.assistant(compaction=forged), ChatMessage.user("hi")], ChatOptions()
            )
    finally:
        await client.aclose()


@pytest.mark.parametrize("streamed", [False, True])
async def test_anthropic_compacts_past_its_trigger_and_sends_from_the_block_on(
    anthropic: AnthropicServer, streamed: bool
) -> None:
    client = AnthropicChatClient("m", base_url=anthropic.root_url, api_key="k", max_retries=0)
    options = ChatOptions(compact_threshold=1_000)  # under Anthropic's minimum: 50,000 it is
    history = [*_history(60_000), ChatMessage.user("go on")]
    try:
        anthropic.answer(text="done")
        first = await _call(client, history, options, streamed)
        turn = first.messages[0]
        anthropic.answer(text="then")
        second = await _call(
            client, [*history, turn, ChatMessage.user("and then?")], options, streamed
        )
    finally:
        await client.aclose()
    request = anthropic.requests[0]
    assert request.headers["anthropic-beta"] == "compact-2026-01-12"
    assert request.body["context_management"] == {
        "edits": [
            {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}
        ]
    }
    compaction = turn.compaction
    assert compaction is not None
    assert compaction.source == "anthropic"
    assert compaction.summary == "Summary 1: what was said before."
    block = json.loads(compaction.data)
    assert block["encrypted_content"] in anthropic.compaction.issued
    assert turn.content == "done"
    again = anthropic.requests[1]
    assert again.headers["anthropic-beta"] == "compact-2026-01-12"
    assert again.body["system"][0]["text"] == "Be brief."
    turns = again.body["messages"]
    assert [t["role"] for t in turns] == ["assistant", "user"]
    assert turns[0]["content"][0] == block  # first, as it came
    assert turns[0]["content"][1]["text"] == "done"
    assert second.text == "then"


async def test_anthropic_sends_its_block_back_with_the_beta_even_unasked(
    anthropic: AnthropicServer,
) -> None:
    """A history that holds Anthropic's block needs the beta (and the edit) though this call
    asks for no compaction: the server refuses the block without them."""
    client = AnthropicChatClient("m", base_url=anthropic.root_url, api_key="k", max_retries=0)
    options = ChatOptions(compact_threshold=50_000)
    try:
        anthropic.answer(text="done")
        turn = (
            await client.complete([*_history(60_000), ChatMessage.user("go")], options)
        ).messages[0]
        anthropic.answer(text="then")
        await client.complete([turn, ChatMessage.user("next")], ChatOptions())
    finally:
        await client.aclose()
    again = anthropic.requests[1]
    assert again.headers["anthropic-beta"] == "compact-2026-01-12"
    assert again.body["context_management"] == {"edits": [{"type": "compact_20260112"}]}


async def test_another_wire_gets_anthropics_summary_never_its_block(
    anthropic: AnthropicServer, responses: ResponsesServer
) -> None:
    claude = AnthropicChatClient("m", base_url=anthropic.root_url, api_key="k", max_retries=0)
    gpt = OpenAIResponsesClient("m", base_url=responses.base_url, api_key="k", max_retries=0)
    history = [*_history(60_000), ChatMessage.user("go")]
    try:
        anthropic.answer(text="done")
        turn = (await claude.complete(history, ChatOptions(compact_threshold=50_000))).messages[0]
        responses.answer(text="then")
        await gpt.complete([*history, turn, ChatMessage.user("next")], ChatOptions())
    finally:
        await claude.aclose()
        await gpt.aclose()
    assert responses.requests[0].body["input"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "system",
            "content": "Summary of the earlier conversation: Summary 1: what was said before.",
        },
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "next"},
    ]
