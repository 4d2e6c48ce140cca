"""The waiting turn of a stored history: read from the store's tail, the same as from the whole."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import ChatMessage, InMemorySession, ToolCall
from raf._sessions.waiting import stored_waiting_turn, unanswered_tail, waiting_turn
from raf.testing.strategies import histories

pytestmark = pytest.mark.anyio


class WholeOnly:
    """A session that can only be read whole (no ``get_last_messages``)."""

    def __init__(self, messages: Sequence[ChatMessage]) -> None:
        self.messages = tuple(messages)

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        return self.messages


def turn_of(calls: int, answered: int, first: int = 0) -> list[ChatMessage]:
    """A calling turn of ``calls`` calls, ``answered`` of them with a result."""
    asked = [ToolCall(f"c{first + n}", "t") for n in range(calls)]
    results = [ChatMessage.tool(call.id, "ok") for call in asked[:answered]]
    return [ChatMessage.assistant(tool_calls=asked), *results]


@settings(max_examples=40, deadline=None)
@given(
    history=histories(max_turns=6),
    calls=st.integers(1, 40),
    data=st.data(),
)
async def test_the_stored_waiting_turn_is_the_whole_historys_whatever_its_length(
    history: tuple[ChatMessage, ...], calls: int, data: st.DataObject
) -> None:
    # Maybe a last turn that waits, with many results already in: more than one look's worth.
    answered = data.draw(st.integers(0, calls))
    tail = turn_of(calls, answered, first=1000) if data.draw(st.booleans()) else []
    messages = (*history, *tail)
    session = InMemorySession()
    await session.add_messages(messages)
    expected = waiting_turn(messages)
    assert await stored_waiting_turn(session) == expected
    assert await stored_waiting_turn(WholeOnly(messages)) == expected  # type: ignore[arg-type]
    assert bool(expected) == (bool(tail) and answered < calls)
    if expected:
        turn, gap = unanswered_tail(expected)
        assert turn is expected[0]
        assert [call.id for call in gap] == [f"c{1000 + n}" for n in range(answered, calls)]
