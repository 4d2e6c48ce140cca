"""HistoryProvider through real Agent runs."""

from __future__ import annotations

from collections.abc import Iterable

import anyio
import pytest

from raf import (
    Agent,
    ChatClientError,
    ChatMessage,
    HistoryProvider,
    InMemorySession,
    ProviderError,
    ScriptedChatClient,
    ToolCall,
    tool,
)
from raf.compression import check_tool_pairing

pytestmark = pytest.mark.anyio

#: What a stored call whose result never came back is answered with: the model reads it.
INTERRUPTED = "This call was interrupted before its result came back; it may or may not have run."


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class CountingSession(InMemorySession):
    """Counts add_messages calls and what they carried."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[ChatMessage, ...]] = []

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        batch = tuple(messages)
        self.calls.append(batch)
        await super().add_messages(batch)


async def test_second_run_sees_the_first_turn() -> None:
    client = ScriptedChatClient(["Hello Ada.", "Your name is Ada."])
    agent = Agent(client, stack=[HistoryProvider()])
    session = InMemorySession()
    await agent.run("I am Ada.", session=session)
    response = await agent.run("What is my name?", session=session)
    assert response.text == "Your name is Ada."
    seen = [(m.role, m.content) for m in client.requests[1].messages]
    assert seen == [
        ("user", "I am Ada."),
        ("assistant", "Hello Ada."),
        ("user", "What is my name?"),
    ]


async def test_tool_calls_and_results_are_persisted_in_one_call() -> None:
    call = ToolCall("c1", "add", '{"a": 2, "b": 3}')
    client = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "5"])
    agent = Agent(client, tools=[add], stack=[HistoryProvider()])
    session = CountingSession()
    await agent.run("2+3?", session=session)
    assert len(session.calls) == 1
    stored = await session.get_messages()
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert stored[1].tool_calls == (call,)
    assert stored[2].tool_call_id == "c1"
    assert stored[2].content == "5"


async def test_failed_run_persists_nothing() -> None:
    client = ScriptedChatClient([ChatClientError("model down")])
    agent = Agent(client, stack=[HistoryProvider()])
    session = CountingSession()
    with pytest.raises(ChatClientError):
        await agent.run("hi", session=session)
    assert session.calls == []
    assert await session.get_messages() == ()


async def test_inner_provider_failure_persists_nothing() -> None:
    class Broken:
        async def on_invoking(self, *args: object) -> object:
            raise RuntimeError("boom")

    agent = Agent(ScriptedChatClient(["never"]), stack=[HistoryProvider(), Broken()])
    session = CountingSession()
    with pytest.raises(ProviderError):
        await agent.run("hi", session=session)
    assert session.calls == []


async def test_cancelled_run_persists_nothing() -> None:
    started = anyio.Event()

    async def hang(messages: object, options: object) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = Agent(ScriptedChatClient([hang]), stack=[HistoryProvider()])
    session = CountingSession()
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: agent.run("hi", session=session))
        await started.wait()
        group.cancel_scope.cancel()
    assert session.calls == []


async def test_history_snapshot_is_passed_through_without_copying() -> None:
    session = InMemorySession()
    await session.add_messages([ChatMessage.user(f"m{i}") for i in range(1000)])
    snapshot = await session.get_messages()
    result = await HistoryProvider().on_invoking(None, session, (), None)  # type: ignore[arg-type]
    assert result.messages is snapshot
    assert type(result.messages) is tuple


async def test_empty_session_injects_nothing_and_inject_false_keeps_persisting() -> None:
    provider = HistoryProvider(inject=False, name="history")
    assert provider.name == "history"
    assert provider.kind == "memory"
    client = ScriptedChatClient(["one", "two"])
    agent = Agent(client, stack=[provider])
    session = InMemorySession()
    await agent.run("first", session=session)
    await agent.run("second", session=session)
    assert [m.content for m in client.requests[1].messages] == ["second"]
    assert [m.content for m in await session.get_messages()] == ["first", "one", "second", "two"]


# -- streamed turns left early ------------------------------------------------------------


async def leave_after(agent: Agent, session: InMemorySession, count: int) -> None:
    """Stream a turn and leave after ``count`` updates."""
    async with agent.stream("tell me", session=session) as stream:
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == count:
                break


async def test_an_early_close_persists_nothing_by_default() -> None:
    session = CountingSession()
    agent = Agent(ScriptedChatClient([["Once ", "upon ", "a time"]]), stack=[HistoryProvider()])
    await leave_after(agent, session, 2)
    assert session.calls == []


async def test_persist_partial_stores_the_request_and_what_the_consumer_saw() -> None:
    session = CountingSession()
    agent = Agent(
        ScriptedChatClient([["Once ", "upon ", "a time"], "next"]),
        stack=[HistoryProvider(persist_partial=True)],
    )
    await leave_after(agent, session, 2)
    assert session.calls == [(ChatMessage.user("tell me"), ChatMessage.assistant("Once upon "))]
    # The next turn sees the partial answer in its history.
    await agent.run("go on", session=session)
    assert [m.content for m in agent.chat_client.requests[1].messages] == [  # type: ignore[attr-defined]
        "tell me",
        "Once upon ",
        "go on",
    ]


async def test_persist_partial_answers_tool_calls_left_without_a_result_as_interrupted() -> None:
    # Issue 21 changed this: a call may have run, so it is kept, answered as interrupted.
    session = CountingSession()
    first, second = (
        ToolCall("a", "add", '{"a": 1, "b": 1}'),
        ToolCall("b", "add", '{"a": 2, "b": 2}'),
    )
    agent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(first, second, text="Adding.")]),
        tools=[add],
        stack=[HistoryProvider(persist_partial=True)],
    )
    # text, call a, call b, result a: the consumer leaves before the result of b.
    await leave_after(agent, session, 4)
    assert session.calls == [
        (
            ChatMessage.user("tell me"),
            ChatMessage.assistant("Adding.", tool_calls=[first, second]),
            ChatMessage.tool("a", "2", name="add"),
            ChatMessage.tool("b", INTERRUPTED, name="add"),
        )
    ]
    assert check_tool_pairing(session.calls[0]) is None


async def test_persist_partial_answers_a_turn_of_unanswered_calls_as_interrupted() -> None:
    session = CountingSession()
    call = ToolCall("a", "add", '{"a": 1, "b": 1}')
    agent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(call)]),
        tools=[add],
        stack=[HistoryProvider(persist_partial=True)],
    )
    await leave_after(agent, session, 1)
    assert session.calls == [
        (
            ChatMessage.user("tell me"),
            ChatMessage.assistant(None, tool_calls=[call]),
            ChatMessage.tool("a", INTERRUPTED, name="add"),
        )
    ]
