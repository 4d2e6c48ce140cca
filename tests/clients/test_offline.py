"""The offline clients stream: EchoChatClient word by word, ScriptedChatClient as scripted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import (
    AgentResponse,
    ChatClient,
    ChatMessage,
    ChatOptions,
    EchoChatClient,
    ScriptedChatClient,
    StreamingChatClient,
    ToolCall,
    Update,
    Usage,
)
from raf.testing.strategies import run_responses

pytestmark = pytest.mark.anyio

OPTIONS = ChatOptions()


async def collect(updates: AsyncIterator[Update]) -> list[Update]:
    return [update async for update in updates]


async def test_echo_streams_word_by_word_then_the_usage() -> None:
    client = EchoChatClient()
    updates = await collect(client.stream([ChatMessage.user(" hello  big world ")], OPTIONS))
    assert [u.text for u in updates if u.kind == "text"] == [" hello  ", "big ", "world "]
    assert updates[-1] == Update.of_usage(Usage(3, 3))


@pytest.mark.parametrize("text", ["", " ", "one", "a b\nc", "  lead", "trail  "])
async def test_echo_stream_assembles_to_what_complete_returns(text: str) -> None:
    client = EchoChatClient(prefix="> ")
    messages = [ChatMessage.user(text)]
    streamed = AgentResponse.from_updates(await collect(client.stream(messages, OPTIONS)))
    assert streamed == await client.complete(messages, OPTIONS)


async def test_both_protocols_are_checkable() -> None:
    assert isinstance(EchoChatClient(), StreamingChatClient)
    assert isinstance(ScriptedChatClient(), StreamingChatClient)

    class OnlyComplete:
        async def complete(self, messages: object, options: object) -> AgentResponse:
            return AgentResponse()

    assert isinstance(OnlyComplete(), ChatClient)
    assert not isinstance(OnlyComplete(), StreamingChatClient)


async def test_scripted_chunks_stream_one_by_one_and_complete_assembles_them() -> None:
    call = ToolCall("c1", "now")
    chunks = ["It ", "is ", Update.of_tool_call(call), Update.of_usage(Usage(2, 3))]
    client = ScriptedChatClient([chunks, list(chunks)])
    streamed = await collect(client.stream([ChatMessage.user("hi")], OPTIONS))
    assert streamed == [
        Update.of_text("It "),
        Update.of_text("is "),
        Update.of_tool_call(call),
        Update.of_usage(Usage(2, 3)),
    ]
    completed = await client.complete([], OPTIONS)
    assert completed == AgentResponse(
        (ChatMessage.assistant("It is ", tool_calls=[call]),), Usage(2, 3)
    )
    assert [request.streamed for request in client.requests] == [True, False]
    assert client.requests[0].messages == (ChatMessage.user("hi"),)


async def test_an_exception_chunk_is_raised_where_it_stands() -> None:
    dropped = ConnectionError("dropped")
    client = ScriptedChatClient([["Hel", dropped, "lo"], ["Hel", dropped]])
    seen: list[Update] = []

    async def read() -> None:
        async for update in client.stream([], OPTIONS):
            seen.append(update)

    with pytest.raises(ConnectionError) as raised:
        await read()
    assert raised.value is dropped
    assert seen == [Update.of_text("Hel")]
    with pytest.raises(ConnectionError):
        await client.complete([], OPTIONS)


async def test_other_steps_stream_as_their_updates() -> None:
    call = ToolCall("c1", "now")
    client = ScriptedChatClient(
        [
            "plain",
            ScriptedChatClient.tool_turn(call, text="asking"),
            lambda messages, options: ["from ", "a function"],
            ValueError("no answer"),
        ]
    )
    assert await collect(client.stream([], OPTIONS)) == [Update.of_text("plain")]
    assert await collect(client.stream([], OPTIONS)) == [
        Update.of_text("asking"),
        Update.of_tool_call(call),
    ]
    assert AgentResponse.from_updates(await collect(client.stream([], OPTIONS))).text == (
        "from a function"
    )
    with pytest.raises(ValueError, match="no answer"):
        await collect(client.stream([], OPTIONS))
    with pytest.raises(AssertionError, match="call 5 has no scripted answer left"):
        await collect(client.stream([], OPTIONS))


async def test_an_unusable_chunk_says_what_is_allowed() -> None:
    client = ScriptedChatClient([["ok", 3]])
    with pytest.raises(TypeError, match=r"unusable chunk 3 \(a str, an Update or an exception\)"):
        await collect(client.stream([], OPTIONS))


@settings(max_examples=50, deadline=None)
@given(run_responses(), st.sampled_from(["asyncio", "trio"]))
def test_a_scripted_response_streams_to_itself(response: AgentResponse, backend: str) -> None:
    async def main() -> None:
        client = ScriptedChatClient([response, response])
        streamed = AgentResponse.from_updates(await collect(client.stream([], OPTIONS)))
        assert streamed == await client.complete([], OPTIONS) == response

    anyio.run(main, backend=backend)
