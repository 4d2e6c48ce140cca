"""What the model sees, in the order a prompt cache serves it: the system message, the
history, the tail of volatile results, the request; and where the stable prefix ends
(``ChatOptions.history_end``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from raf import (
    Agent,
    ChatMessage,
    ContextProvider,
    ContextResult,
    Decision,
    HistoryProvider,
    InMemorySession,
    ProviderError,
    ScriptedChatClient,
    ToolCall,
    parallel,
    tool,
)

pytestmark = pytest.mark.anyio


class Adds(ContextProvider):
    """A provider that contributes a fixed result."""

    def __init__(self, name: str, result: ContextResult) -> None:
        self.name = name
        self.result = result

    async def on_invoking(
        self, agent: Any, session: Any, messages: Sequence[ChatMessage], options: Any
    ) -> ContextResult:
        return self.result


class Clock(ContextProvider):
    """A volatile provider whose text changes every turn, as the time does."""

    def __init__(self) -> None:
        self.turn = 0

    async def on_invoking(
        self, agent: Any, session: Any, messages: Sequence[ChatMessage], options: Any
    ) -> ContextResult:
        self.turn += 1
        return ContextResult(
            instructions=f"It is turn {self.turn}.",
            messages=[ChatMessage.user(f"live state {self.turn}")],
            volatile=True,
        )


@tool
def ping() -> str:
    """Answer pong."""
    return "pong"


HISTORY = (ChatMessage.user("earlier"), ChatMessage.assistant("earlier answer"))


async def test_the_tail_comes_after_the_history_and_before_the_request() -> None:
    client = ScriptedChatClient(["ok"])
    agent = Agent(
        client,
        instructions="Be brief.",
        stack=[
            Adds("live", ContextResult(instructions="Now: noon.", volatile=True)),
            Adds("history", ContextResult(messages=HISTORY)),
            Adds("rules", ContextResult(instructions="Cite sources.")),
        ],
    )
    await agent.run("now?")
    sent = client.requests[0]
    assert sent.messages == (
        ChatMessage.system("Be brief.\nCite sources."),
        *HISTORY,
        ChatMessage.system("Now: noon."),
        ChatMessage.user("now?"),
    )
    assert sent.options.history_end == 3


async def test_two_volatile_providers_keep_registration_order() -> None:
    first, second = ChatMessage.user("passage one"), ChatMessage.user("passage two")
    client = ScriptedChatClient(["ok"])
    agent = Agent(
        client,
        stack=[
            Adds("a", ContextResult(instructions="A.", messages=[first], volatile=True)),
            Adds("history", ContextResult(messages=HISTORY)),
            Adds("b", ContextResult(instructions="B.", messages=[second], volatile=True)),
        ],
    )
    await agent.run("q")
    # Instructions as one system message, then the messages, each in stack order.
    assert client.requests[0].messages == (
        *HISTORY,
        ChatMessage.system("A.\nB."),
        first,
        second,
        ChatMessage.user("q"),
    )
    assert client.requests[0].options.history_end == 2


async def test_a_group_and_a_streamed_run_place_the_tail_the_same_way() -> None:
    stack = [
        Adds("history", ContextResult(messages=HISTORY)),
        parallel(
            Adds("a", ContextResult(instructions="A.", volatile=True)),
            Adds("rules", ContextResult(instructions="Rules.")),
            Adds("b", ContextResult(instructions="B.", volatile=True)),
        ),
    ]
    client = ScriptedChatClient(["ok", "ok"])
    agent = Agent(client, stack=stack)
    await agent.run("q")
    async with agent.stream("q") as stream:
        async for _ in stream:
            pass
    run, streamed = client.requests
    assert streamed.streamed
    assert (
        run.messages
        == streamed.messages
        == (
            ChatMessage.system("Rules."),
            *HISTORY,
            ChatMessage.system("A.\nB."),
            ChatMessage.user("q"),
        )
    )
    assert run.options.history_end == streamed.options.history_end == 3


async def test_the_tail_is_never_stored_and_the_prefix_stays_put() -> None:
    client = ScriptedChatClient(["one", "two"])
    clock = Clock()
    agent = Agent(client, instructions="Be brief.", stack=[HistoryProvider(), clock])
    session = InMemorySession()
    await agent.run("first", session=session)
    await agent.run("second", session=session)
    stored = await session.get_messages()
    assert stored == (
        ChatMessage.user("first"),
        ChatMessage.assistant("one"),
        ChatMessage.user("second"),
        ChatMessage.assistant("two"),
    )
    earlier, later = client.requests
    # The second call's prefix is the first call without its tail, then the answer: what
    # changed from turn to turn comes after the history, where a cache loses nothing.
    assert later.messages[:3] == (
        earlier.messages[0],
        earlier.messages[-1],
        ChatMessage.assistant("one"),
    )
    assert later.messages[3:] == (
        ChatMessage.system("It is turn 2."),
        ChatMessage.user("live state 2"),
        ChatMessage.user("second"),
    )
    # The first call has no history yet, but its tail ends the prefix all the same.
    assert (earlier.options.history_end, later.options.history_end) == (1, 3)


async def test_history_end_is_none_when_nothing_was_injected() -> None:
    client = ScriptedChatClient(["ok", "ok"])
    await Agent(client, instructions="x").run("q")
    await Agent(client).run("q")
    assert [r.options.history_end for r in client.requests] == [None, None]


async def test_a_tail_without_history_ends_the_prefix_after_the_system_message() -> None:
    # The tail is injected too: the stable prefix is the system message alone, so a client
    # that moves the tail out of its system field (Anthropic, Gemini) does so here too.
    client = ScriptedChatClient(["ok", "ok"])
    live = Adds("live", ContextResult("t", volatile=True))
    await Agent(client, instructions="x", stack=[live]).run("q")
    await Agent(client, stack=[live]).run("q")
    assert [r.options.history_end for r in client.requests] == [1, 0]


async def test_history_end_counts_no_system_message_when_there_is_none() -> None:
    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=[Adds("history", ContextResult(messages=HISTORY))]).run("q")
    assert client.requests[0].options.history_end == 2


async def test_history_end_stays_put_across_the_tool_loop() -> None:
    turn = ScriptedChatClient.tool_turn(ToolCall("c1", "ping"))
    client = ScriptedChatClient([turn, turn, "done"])
    agent = Agent(
        client,
        tools=[ping],
        stack=[
            Adds("history", ContextResult(messages=HISTORY)),
            Adds("live", ContextResult(instructions="Now: noon.", volatile=True)),
        ],
    )
    await agent.run("q")
    assert [r.options.history_end for r in client.requests] == [2, 2, 2]
    last = client.requests[-1].messages
    # The loop's turns come after the request: the tail stays where it was.
    assert last[:4] == (*HISTORY, ChatMessage.system("Now: noon."), ChatMessage.user("q"))
    assert len(last) == 8


async def test_a_volatile_result_that_replaces_the_history_is_a_provider_error() -> None:
    bad = ContextResult(messages=HISTORY, replace_messages=True, volatile=True)
    agent = Agent(ScriptedChatClient(["ok"]), stack=[Adds("bad", bad)])
    with pytest.raises(ProviderError) as info:
        await agent.run("q")
    assert (info.value.provider, info.value.field) == ("bad", "volatile")


async def test_the_session_and_the_agent_name_reach_the_client() -> None:
    client = ScriptedChatClient(["ok", "ok"])
    session = InMemorySession()
    await Agent(client, name="support").run("q", session=session)
    await Agent(client).run("q", session=session)
    assert [(r.options.session_id, r.options.agent_name) for r in client.requests] == [
        (session.id, "support"),
        (session.id, None),
    ]


async def test_history_end_takes_in_the_answers_a_resumed_run_adds_to_the_history() -> None:
    @tool(approval=True)
    def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    call = ToolCall("call_1", "delete", '{"path": "a.txt"}')
    client = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "All done."])
    agent = Agent(client, tools=[delete], history=True)
    session = InMemorySession()
    (pending,) = (await agent.run("clean up", session=session)).pending
    await agent.run(Decision(pending.token, approve=True), session=session)
    resumed = client.requests[-1]
    # The stored turn and its answer, which is stored with this run: all of it history.
    assert resumed.messages[-1] == ChatMessage.tool("call_1", "deleted a.txt", name="delete")
    assert resumed.options.history_end == len(resumed.messages) == 3
