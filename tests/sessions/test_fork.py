"""store.fork in every store (memory, SQLite, and real Redis and PostgreSQL servers): the
first turns copied, nothing shared, nothing overwritten, no approval carried."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raf
from raf import ChatMessage, InMemorySessionStore, PendingCall, SqliteSessionStore, ToolCall
from raf.errors import SessionExistsError
from raf.testing.strategies import histories
from tests._harness.postgres_server import PostgresServer
from tests._harness.redis_server import RedisServer
from tests._harness.spilling import LOG, dump

pytestmark = pytest.mark.anyio

CALL = ToolCall("c1", "lookup", '{"order": "1"}')
#: Three turns: a plain one, one with a tool call and its result, a last plain one.
HISTORY = (
    ChatMessage.system("You help with orders."),
    ChatMessage.user("hi"),
    ChatMessage.assistant("hello"),
    ChatMessage.user("where is order 1?"),
    ChatMessage.assistant(None, tool_calls=(CALL,)),
    ChatMessage.tool("c1", "shipped", name="lookup"),
    ChatMessage.assistant("It has shipped."),
    ChatMessage.user("thanks"),
    ChatMessage.assistant("You're welcome."),
)


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """Each store raf has; the servers are the suite's (a prefix of this test's own)."""
    prefix = f"fork{uuid.uuid4().hex[:8]}"
    if request.param == "memory":
        yield InMemorySessionStore()
    elif request.param == "sqlite":
        async with SqliteSessionStore(tmp_path / "sessions.db") as opened:
            yield opened
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        async with raf.RedisSessionStore(server.url, prefix=prefix) as redis_store:
            yield redis_store
    else:
        pg: PostgresServer = request.getfixturevalue("postgres_server")
        async with raf.PostgresSessionStore(pg.url(), prefix=prefix) as pg_store:
            yield pg_store


async def _stored(store: Any, session_id: str, messages: Any = HISTORY) -> None:
    await (await store.get(session_id)).add_messages(messages)


async def _messages(store: Any, session_id: str) -> tuple[ChatMessage, ...]:
    return tuple(await (await store.get(session_id)).get_messages())


async def test_a_fork_without_at_copies_every_turn(store: Any) -> None:
    await _stored(store, "original")
    fork = await store.fork("original", "copy")
    assert fork.id == "copy"
    assert tuple(await fork.get_messages()) == HISTORY
    assert await _messages(store, "copy") == HISTORY


@pytest.mark.parametrize(("at", "end"), [(0, 1), (1, 3), (2, 7), (3, 9)])
async def test_a_fork_at_a_turn_copies_the_turns_before_it(store: Any, at: int, end: int) -> None:
    # What comes before the first user message (the system message) goes with every fork.
    await _stored(store, "original")
    await store.fork("original", f"at-{at}", at=at)
    assert await _messages(store, f"at-{at}") == HISTORY[:end]


@pytest.mark.parametrize("at", [-1, 4, 100])
async def test_an_at_outside_the_turns_is_a_value_error_and_writes_nothing(
    store: Any, at: int
) -> None:
    await _stored(store, "original")
    with pytest.raises(ValueError, match=r"session 'original' has 3 turns; at must be 0 to 3"):
        await store.fork("original", "copy", at=at)
    assert await _messages(store, "copy") == ()


async def test_a_session_that_holds_nothing_cannot_be_forked(store: Any) -> None:
    with pytest.raises(ValueError, match="'nobody' holds no messages"):
        await store.fork("nobody", "copy")
    with pytest.raises(ValueError, match="a fork needs an id of its own"):
        await store.fork("nobody", "nobody")


async def test_a_new_id_that_holds_messages_is_refused_and_kept(store: Any) -> None:
    await _stored(store, "original")
    await _stored(store, "taken", [ChatMessage.user("mine")])
    with pytest.raises(SessionExistsError, match="'taken': it already holds 1 message") as caught:
        await store.fork("original", "taken")
    assert caught.value.session_id == "taken"
    assert await _messages(store, "taken") == (ChatMessage.user("mine"),)


async def test_of_two_forks_into_one_id_at_once_one_writes(store: Any) -> None:
    await _stored(store, "original")
    outcomes: list[str] = []

    async def fork(at: int) -> None:
        try:
            await store.fork("original", "contested", at=at)
            outcomes.append(f"wrote {at}")
        except SessionExistsError:
            outcomes.append("refused")

    async with anyio.create_task_group() as group:
        group.start_soon(fork, 1)
        group.start_soon(fork, 3)
    assert sorted(outcomes)[0] == "refused"
    assert len(outcomes) == 2
    written = int(next(o for o in outcomes if o.startswith("wrote")).split()[1])
    assert await _messages(store, "contested") == HISTORY[: {1: 3, 3: 9}[written]]


async def test_the_fork_and_the_original_share_nothing_writable(store: Any) -> None:
    await _stored(store, "original")
    fork = await store.fork("original", "copy", at=1)
    await fork.add_messages([ChatMessage.user("only in the fork")])
    await _stored(store, "original", [ChatMessage.user("only in the original")])
    assert (await _messages(store, "copy"))[-1].content == "only in the fork"
    assert len(await _messages(store, "copy")) == 4
    original = await _messages(store, "original")
    assert original[-1].content == "only in the original"
    assert len(original) == len(HISTORY) + 1


async def test_calls_waiting_for_approval_are_not_carried(store: Any) -> None:
    waiting = ChatMessage.assistant(None, tool_calls=(ToolCall("c2", "refund", "{}"),))
    session = await store.get("original")
    await session.add_messages(HISTORY)
    await session.record_pending(
        [ChatMessage.user("refund it"), waiting], [PendingCall(waiting.tool_calls[0], "tok")]
    )
    fork = await store.fork("original", "copy")
    # The messages are copied as they are; what waits stays with the original only.
    assert (await fork.get_messages())[-1] == waiting
    assert await fork.list_pending() == ()
    assert [p.token for p in await session.list_pending()] == ["tok"]


@settings(max_examples=40, deadline=None)
@given(history=histories(max_turns=10), data=st.data())
async def test_a_fork_is_the_prefix_that_ends_where_turn_at_would_begin(
    history: tuple[ChatMessage, ...], data: st.DataObject
) -> None:
    # The law, on the in-memory store: a fork at `at` is a prefix of the session holding
    # exactly `at` user messages, and the next message of the session (if any) is a user's.
    store = InMemorySessionStore()
    if not history:
        return
    await (await store.get("s")).add_messages(history)
    turns = sum(m.role == "user" for m in history)
    at = data.draw(st.integers(0, turns))
    copied = await (await store.fork("s", "f", at=at)).get_messages()
    assert history[: len(copied)] == copied
    assert sum(m.role == "user" for m in copied) == at
    assert len(copied) == len(history) or history[len(copied)].role == "user"


async def test_the_memory_store_keeps_one_session_per_id() -> None:
    store = InMemorySessionStore()
    first = await store.get("a")
    assert await store.get("a") is first
    assert await store.session_ids() == []  # a session is listed once it holds messages
    await first.add_messages([ChatMessage.user("hi")])
    await store.fork("a", "b")
    assert await store.session_ids() == ["a", "b"]
    with pytest.raises(ValueError, match="non-empty str"):
        await store.get("")
    async with store as same:
        assert same is store
    assert repr(store) == "InMemorySessionStore(sessions=2)"


async def _spill_in(store: Any, session_id: str) -> None:
    """A turn whose tool result ToolOutputLimit cut and spilled (``call_big``), then a last
    plain turn: two turns."""
    client = raf.ScriptedChatClient(
        [raf.ScriptedChatClient.tool_turn(ToolCall("call_big", "dump", "{}")), "seen", "ok"]
    )
    agent = raf.Agent(client, tools=[dump], tool_stack=[raf.ToolOutputLimit(1000)], history=True)
    session = await store.get(session_id)
    await agent.run("dump the log", session=session)
    await agent.run("thanks", session=session)
    assert await session.spilled_tool_result("call_big") == LOG


async def test_a_fork_carries_the_spilled_results_of_the_turns_it_copies(store: Any) -> None:
    await _spill_in(store, "a")
    fork = await store.fork("a", "b")
    assert await fork.spilled_tool_result("call_big") == LOG
    # The model of the fork reads the cut result back, as it could in the original.
    arguments = json.dumps({"call_id": "call_big", "pattern": "^row 2999$"})
    client = raf.ScriptedChatClient(
        [raf.ScriptedChatClient.tool_turn(ToolCall("r1", "read_tool_result", arguments)), "found"]
    )
    agent = raf.Agent(client, tools=[dump], tool_stack=[raf.ToolOutputLimit(1000)], history=True)
    response = await agent.run("find the last row", session=fork)
    read = next(m.content or "" for m in response.messages if m.role == "tool")
    assert "line 3000: row 2999" in read
    # A fork before the cut turn carries nothing of it; the original keeps its own.
    before = await store.fork("a", "c", at=0)
    assert await before.spilled_tool_result("call_big") is None
    assert await (await store.get("a")).spilled_tool_result("call_big") == LOG


async def test_a_refused_fork_leaves_the_spilled_results_of_new_id_alone(store: Any) -> None:
    await _spill_in(store, "a")
    taken = await store.get("taken")
    await taken.add_messages([ChatMessage.user("mine")])
    await taken.spill_tool_result("call_big", "my own")
    with pytest.raises(SessionExistsError):
        await store.fork("a", "taken")
    assert await taken.spilled_tool_result("call_big") == "my own"
