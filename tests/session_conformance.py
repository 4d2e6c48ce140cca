"""The Session conformance suite: what every Session implementation must do.

A test module runs it for its store by importing the tests and providing a
``harness`` fixture that yields a :class:`Harness` (see ``test_sessions.py``)::

    from tests.session_conformance import *  # noqa: F403
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raf import Agent, ChatMessage, ScriptedChatClient, Session, ToolCall
from raf.sessions import request_hash

__all__ = [
    "Harness",
    "conversation",
    "messages_strategy",
    "test_add_messages_accepts_any_iterable",
    "test_add_messages_is_all_or_nothing",
    "test_agent_runs_persist_through_a_history_middleware",
    "test_concurrent_appends_lose_nothing_and_stay_together",
    "test_empty_add_changes_nothing",
    "test_history_keeps_order_across_appends",
    "test_new_session_is_empty",
    "test_request_hash_is_the_canonical_sha256",
    "test_returned_history_is_a_snapshot",
    "test_round_trip_of_arbitrary_messages",
    "test_round_trip_survives_reopening",
    "test_sessions_are_independent",
]


class Harness(Protocol):
    """How the suite gets sessions from the store under test."""

    async def new(self, session_id: str) -> Session:
        """A session with this id (fresh ids are fresh sessions)."""
        ...

    async def reopen(self, session: Session) -> Session:
        """The same session as seen by a new store object (a durable store's file reopened)."""
        ...


_ids = itertools.count()


def fresh_id() -> str:
    return f"session-{next(_ids)}"


def conversation() -> list[ChatMessage]:
    """Every role and field: names, tool calls, tool results, None and empty content, unicode."""
    call_a = ToolCall("call_a", "lookup", '{"q": "caf\u00e9", "n": 2}')
    call_b = ToolCall("call_b", "now", "{}")
    return [
        ChatMessage.system("You are terse."),
        ChatMessage.user("Bonjour \u2014 \u00e7a va? \U0001f600", name="ann"),
        ChatMessage.assistant(None, tool_calls=[call_a, call_b]),
        ChatMessage.tool("call_a", '{"hits": ["x"]}', name="lookup"),
        ChatMessage.tool("call_b", ""),
        ChatMessage.assistant('line one\nline two\t"quoted" \\ back'),
        ChatMessage.user(""),
    ]


_text = st.text(max_size=30)
_calls = st.builds(ToolCall, st.text(min_size=1, max_size=8), st.text(max_size=8), _text)


def messages_strategy() -> st.SearchStrategy[list[ChatMessage]]:
    """Lists of arbitrary valid messages."""
    message = st.one_of(
        st.builds(ChatMessage.user, _text),
        st.builds(ChatMessage.system, _text),
        st.builds(
            ChatMessage.assistant,
            st.none() | _text,
            tool_calls=st.lists(_calls, max_size=3),
        ),
        st.builds(ChatMessage.tool, st.text(min_size=1, max_size=8), _text),
        st.builds(
            ChatMessage,
            st.sampled_from(["user", "assistant"]),
            st.none() | _text,
            name=st.none() | st.text(max_size=5),
        ),
    )
    return st.lists(message, max_size=8)


async def test_new_session_is_empty(harness: Harness) -> None:
    session_id = fresh_id()
    session = await harness.new(session_id)
    assert session.id == session_id
    history = await session.get_messages()
    assert type(history) is tuple
    assert history == ()


async def test_round_trip_survives_reopening(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    await session.add_messages(conversation())
    assert list(await session.get_messages()) == conversation()
    again = await harness.reopen(session)
    history = await again.get_messages()
    assert type(history) is tuple
    assert list(history) == conversation()
    assert [type(m) for m in history] == [ChatMessage] * len(history)


async def test_history_keeps_order_across_appends(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    expected: list[ChatMessage] = []
    for turn in range(5):
        batch = [ChatMessage.user(f"q{turn}"), ChatMessage.assistant(f"a{turn}")]
        await session.add_messages(batch)
        expected += batch
        assert list(await session.get_messages()) == expected
    assert list(await (await harness.reopen(session)).get_messages()) == expected


async def test_add_messages_accepts_any_iterable(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    await session.add_messages(m for m in [ChatMessage.user("a")])
    await session.add_messages((ChatMessage.user("b"),))
    await session.add_messages((ChatMessage.user("c"),))
    assert [m.content for m in await session.get_messages()] == ["a", "b", "c"]


async def test_add_messages_is_all_or_nothing(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    await session.add_messages([ChatMessage.user("kept")])
    with pytest.raises(TypeError, match=r"\[1\]"):
        await session.add_messages([ChatMessage.user("lost"), "not a message"])  # type: ignore[list-item]
    assert [m.content for m in await session.get_messages()] == ["kept"]
    again = await harness.reopen(session)
    assert [m.content for m in await again.get_messages()] == ["kept"]


async def test_empty_add_changes_nothing(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    await session.add_messages([ChatMessage.user("x")])
    before = await session.get_messages()
    await session.add_messages([])
    assert await session.get_messages() == before


async def test_returned_history_is_a_snapshot(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    await session.add_messages([ChatMessage.user("first")])
    snapshot = await session.get_messages()
    await session.add_messages([ChatMessage.user("second")])
    assert [m.content for m in snapshot] == ["first"]
    assert [m.content for m in await session.get_messages()] == ["first", "second"]


async def test_sessions_are_independent(harness: Harness) -> None:
    one = await harness.new(fresh_id())
    two = await harness.new(fresh_id())
    await one.add_messages([ChatMessage.user("for one")])
    await two.add_messages([ChatMessage.user("for two")])
    assert [m.content for m in await one.get_messages()] == ["for one"]
    assert [m.content for m in await two.get_messages()] == ["for two"]


async def test_concurrent_appends_lose_nothing_and_stay_together(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    writers, batch = 40, 5

    async def write(writer: int) -> None:
        await session.add_messages(
            [ChatMessage.user(f"{writer}:{index}") for index in range(batch)]
        )

    async with anyio.create_task_group() as group:
        for writer in range(writers):
            group.start_soon(write, writer)
    for view in (session, await harness.reopen(session)):
        texts = [m.content or "" for m in await view.get_messages()]
        assert len(texts) == writers * batch
        chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        for chunk in chunks:
            writer = chunk[0].split(":")[0]
            assert chunk == [f"{writer}:{index}" for index in range(batch)]
        assert sorted(int(chunk[0].split(":")[0]) for chunk in chunks) == list(range(writers))


async def test_request_hash_is_the_canonical_sha256(harness: Harness) -> None:
    session = await harness.new(fresh_id())
    request = conversation()[:2]
    touched = await session.touch_request_hash(request)
    digest = touched.digest
    assert digest == request_hash(request)
    assert len(digest) == 64
    assert not touched.repeated
    again = await session.touch_request_hash(list(request))
    assert (again.digest, again.repeated) == (digest, True)
    assert (await session.touch_request_hash(request[:1])).digest != digest
    # Hashing records, it does not add to the history.
    assert await session.get_messages() == ()


async def test_agent_runs_persist_through_a_history_middleware(harness: Harness) -> None:
    """A run reads the history and appends its turn: the shape of a history provider."""

    async def history(request: object, call_next: Callable[[object], Awaitable[object]]) -> object:
        from raf import Invocation

        assert isinstance(request, Invocation)
        past = await request.session.get_messages()
        response = await call_next(attrs.evolve(request, messages=past + request.messages))
        await request.session.add_messages([*request.request_messages, *response.messages])  # type: ignore[attr-defined]
        return response

    model = ScriptedChatClient(["one", "two"])
    agent = Agent(model, stack=[history])
    session = await harness.new(fresh_id())
    await agent.run("first", session=session)
    await agent.run("second", session=session)
    assert [m.content for m in model.requests[1].messages] == ["first", "one", "second"]
    stored = await (await harness.reopen(session)).get_messages()
    assert [m.content for m in stored] == ["first", "one", "second", "two"]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(messages_strategy(), max_size=4))
async def test_round_trip_of_arbitrary_messages(
    harness: Harness, batches: list[list[ChatMessage]]
) -> None:
    session = await harness.new(fresh_id())
    for batch in batches:
        await session.add_messages(batch)
    expected = [m for batch in batches for m in batch]
    assert list(await session.get_messages()) == expected
    assert list(await (await harness.reopen(session)).get_messages()) == expected
