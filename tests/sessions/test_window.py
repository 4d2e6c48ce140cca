"""The history window: HistoryProvider(max_messages=, max_tokens=) and CompressionProvider's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    ChatMessage,
    CompressionProvider,
    HistoryProvider,
    InMemorySession,
    RequestHash,
    ScriptedChatClient,
    SqliteSessionStore,
    ToolCall,
)
from raf.compression import (
    TruncationStrategy,
    approximate_tokens,
    check_tool_pairing,
    message_units,
)
from raf.testing.strategies import histories

pytestmark = pytest.mark.anyio


class PlainSession:
    """A session with the four protocol methods only: no ``get_last_messages``."""

    def __init__(self, messages: Sequence[ChatMessage]) -> None:
        self.inner = InMemorySession()
        self.messages = list(messages)
        self.id = "plain"

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        return tuple(self.messages)

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        self.messages += messages

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
        return await self.inner.touch_request_hash(messages)

    async def request_hashes(self) -> dict[str, float]:
        return await self.inner.request_hashes()


def chat(n: int) -> list[ChatMessage]:
    return [
        ChatMessage.user(f"q{i}") if i % 2 == 0 else ChatMessage.assistant(f"a{i}")
        for i in range(n)
    ]


async def injected(provider: HistoryProvider, session: object) -> tuple[ChatMessage, ...]:
    result = await provider.on_invoking(None, session, (), None)  # type: ignore[arg-type]
    return tuple(result.messages)


async def test_max_messages_injects_the_newest() -> None:
    session = InMemorySession()
    await session.add_messages(chat(10))
    assert await injected(HistoryProvider(max_messages=4), session) == tuple(chat(10)[-4:])
    assert await injected(HistoryProvider(max_messages=40), session) == tuple(chat(10))


async def test_a_window_never_splits_a_tool_call_from_its_results() -> None:
    call = ToolCall("c1", "now", "{}")
    history = [
        ChatMessage.user("what time is it"),
        ChatMessage.assistant(None, tool_calls=[call]),
        ChatMessage.tool("c1", "noon"),
        ChatMessage.assistant("noon"),
    ]
    session = InMemorySession()
    await session.add_messages(history)
    # The newest 2 would start with the call's result: the cut moves past the whole unit.
    assert await injected(HistoryProvider(max_messages=2, step=1), session) == (history[3],)
    assert await injected(HistoryProvider(max_messages=3, step=1), session) == tuple(history[1:])
    assert await injected(HistoryProvider(max_messages=4, step=1), session) == tuple(history)


async def test_max_tokens_keeps_the_newest_that_fit() -> None:
    session = InMemorySession()
    await session.add_messages(chat(10))
    one_each = HistoryProvider(max_tokens=3, count_tokens=lambda message: 1, step=1)
    assert await injected(one_each, session) == tuple(chat(10)[-3:])
    cost = approximate_tokens(chat(10)[-1])
    assert len(await injected(HistoryProvider(max_tokens=2 * cost, step=1), session)) == 2
    # A step of a third of the bound: the start sits further on, ahead of time.
    third = HistoryProvider(max_tokens=2 * cost, step=2 * cost // 3)
    assert len(await injected(third, session)) == 1
    # By default the start moves by four fifths of the bound (it steps least often).
    by_default = HistoryProvider(max_tokens=10, count_tokens=lambda message: 1)
    assert await injected(by_default, session) == tuple(chat(10)[-10:])
    await session.add_messages(chat(1))  # one more: the start moves by 8, not 5
    assert len(await injected(by_default, session)) == 3


async def test_a_budget_alone_counts_from_the_first_message() -> None:
    session = InMemorySession()
    await session.add_messages(chat(1500))
    provider = HistoryProvider(max_tokens=1000, count_tokens=lambda message: 1, step=1)
    assert await injected(provider, session) == tuple(chat(1500)[-1000:])
    everything = HistoryProvider(max_tokens=10_000, count_tokens=lambda message: 1)
    assert await injected(everything, session) == tuple(chat(1500))


async def test_a_session_without_get_last_messages_is_read_whole_and_cut() -> None:
    session = PlainSession(chat(10))
    assert await injected(HistoryProvider(max_messages=3, step=1), session) == tuple(chat(10)[-3:])


async def test_sqlite_reads_only_the_window(tmp_path: Path) -> None:
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        await (await store.get("long")).add_messages(chat(500))
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("long")
        assert await injected(HistoryProvider(max_messages=20), session) == tuple(chat(500)[-20:])
        assert len(session._history) == 20  # what was decoded: the window, not 500 rows


async def test_an_agent_with_a_window_sends_the_window_and_stores_everything() -> None:
    client = ScriptedChatClient(["one", "two", "three"])
    agent = Agent(client, stack=[HistoryProvider(max_messages=2)])
    session = InMemorySession()
    for text in ("a", "b", "c"):
        await agent.run(text, session=session)
    assert [m.content for m in client.requests[-1].messages] == ["b", "two", "c"]
    assert len(await session.get_messages()) == 6


async def test_compression_reads_the_same_window() -> None:
    session = InMemorySession()
    await session.add_messages(chat(10))
    provider = CompressionProvider(TruncationStrategy(keep_last=100), max_messages=4)
    result = await provider.on_invoking(None, session, (), None)  # type: ignore[arg-type]
    assert tuple(result.messages) == tuple(chat(10)[-4:])
    assert result.replace_messages


@pytest.mark.parametrize(
    "options",
    [{"max_messages": 0}, {"max_tokens": -1}, {"max_messages": 1.5}, {"max_tokens": True}],
)
def test_bad_window_options_are_value_errors(options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="positive int"):
        HistoryProvider(**options)  # type: ignore[arg-type]


def test_a_token_counter_must_be_callable() -> None:
    with pytest.raises(TypeError, match="count_tokens"):
        HistoryProvider(max_tokens=10, count_tokens=3)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    history=histories(max_turns=12),
    max_messages=st.none() | st.integers(1, 12),
    max_tokens=st.none() | st.integers(1, 80),
)
async def test_the_window_is_a_whole_suffix_within_bounds(
    history: tuple[ChatMessage, ...], max_messages: int | None, max_tokens: int | None
) -> None:
    session = InMemorySession()
    await session.add_messages(history)
    provider = HistoryProvider(max_messages=max_messages, max_tokens=max_tokens)
    window = await injected(provider, session)
    assert window == history[len(history) - len(window) :]  # the newest messages, in order
    assert check_tool_pairing(window) is None
    if max_messages is not None:
        assert len(window) <= max_messages
    if max_tokens is not None:
        assert sum(approximate_tokens(m) for m in window) <= max_tokens
    # The same window whether the store reads its tail or everything.
    assert await injected(provider, PlainSession(history)) == window


def waiting_at(messages: Sequence[ChatMessage]) -> int:
    """Where the last calling turn of ``messages`` starts while a call of it has no result
    (the turn a run answers in place: a window keeps it); ``len(messages)`` when none waits."""
    at = len(messages) - 1
    while at >= 0 and messages[at].role == "tool":
        at -= 1
    if at < 0 or not messages[at].tool_calls:
        return len(messages)
    answered = {m.tool_call_id for m in messages[at + 1 :]}
    waits = any(call.id not in answered for call in messages[at].tool_calls)
    return at if waits else len(messages)


def settled(window: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
    """The window without a last turn that waits: what must pair every call with its result."""
    return window[: waiting_at(window)]


def expected_window(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The whole units of ``messages``, then the last turn and its results while it waits."""
    at = waiting_at(messages)
    return (*(m for unit in message_units(messages[:at]) for m in unit), *messages[at:])


def base_start(total: int, bound: int, step: int) -> int:
    """The first multiple of ``step`` from which ``total`` messages fit ``bound``."""
    start = 0
    while total - start > bound:
        start += step
    return start


@settings(max_examples=30, deadline=None)
@given(
    history=histories(max_turns=10),
    bound=st.integers(1, 12),
    data=st.data(),
)
async def test_a_message_window_moves_in_steps_and_every_process_agrees(
    tmp_path_factory: pytest.TempPathFactory,
    history: tuple[ChatMessage, ...],
    bound: int,
    data: st.DataObject,
) -> None:
    step = data.draw(st.integers(1, bound))
    path = tmp_path_factory.mktemp("steps") / "s.db"
    provider = HistoryProvider(max_messages=bound, step=step)
    memory = InMemorySession()
    stored, previous = 0, 0
    async with SqliteSessionStore(path) as store:
        writer = await store.get("s")
        while stored < len(history):
            batch = history[stored : stored + data.draw(st.integers(1, 4))]
            stored += len(batch)
            await memory.add_messages(batch)
            await writer.add_messages(batch)
            window = await injected(provider, memory)
            assert len(window) <= bound
            assert check_tool_pairing(settled(window)) is None
            start = base_start(stored, bound, step)
            assert start % step == 0
            assert start >= previous
            if stored - previous <= bound:
                assert start == previous  # within the bound: the start stays put
            previous = start
            # The same window from a new provider and a new store reading the same file.
            async with SqliteSessionStore(path) as fresh:
                again = HistoryProvider(max_messages=bound, step=step)
                assert await injected(again, await fresh.get("s")) == window
            assert await injected(provider, writer) == window
            assert await injected(provider, PlainSession(history[:stored])) == window
            cut = start
            while cut < stored and history[cut].role == "tool":
                cut += 1
            assert window == expected_window(history[cut:stored])


@settings(max_examples=40, deadline=None)
@given(history=histories(max_turns=10), bound=st.integers(1, 120), data=st.data())
async def test_a_token_window_moves_in_steps(
    history: tuple[ChatMessage, ...], bound: int, data: st.DataObject
) -> None:
    step = data.draw(st.integers(1, bound))
    provider = HistoryProvider(max_tokens=bound, step=step)
    session = InMemorySession()
    previous: tuple[ChatMessage, ...] | None = None
    offset = 0
    for message in history:
        await session.add_messages([message])
        window = await injected(provider, session)
        assert sum(approximate_tokens(m) for m in window) <= bound
        assert check_tool_pairing(settled(window)) is None
        stored = await session.get_messages()
        total = sum(approximate_tokens(m) for m in stored)
        fits = total - offset <= bound
        offset = base_start(total, bound, step)
        if fits and previous:
            # Within the bound, the window only grows at its end: its start stays put.
            assert window[: len(previous)] == previous or not window
        previous = window
    assert await injected(provider, PlainSession(history)) == previous or not history
