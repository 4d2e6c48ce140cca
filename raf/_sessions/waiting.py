"""What a stored history still waits for: its last calling turn, while a call of it has no result.

A turn whose calls are deferred (waiting for a person's decision, or for the
client that runs them) is stored with the results of its other calls; until
every call has its result, it is the history's last calling turn. The
windows keep it in view, and a run that resumes reads it from the store
when the view lacks it, so no window, compression or store hides it from its answers.
"""

from __future__ import annotations

from collections.abc import Sequence

from raf._values.messages import ChatMessage, ToolCall
from raf._values.protocols import Session

__all__: list[str] = []

#: How many of the newest messages a first look at the store's tail reads.
FIRST_LOOK = 8


def unanswered_tail(
    messages: Sequence[ChatMessage],
) -> tuple[ChatMessage | None, tuple[ToolCall, ...]]:
    """The last message of ``messages`` that is not a tool result, if it is a calling assistant
    turn, and its calls that no tool message after it answers."""
    answered: set[str | None] = set()
    for message in reversed(messages):
        if message.role == "tool":
            answered.add(message.tool_call_id)
            continue
        if message.role == "assistant" and message.tool_calls:
            return message, tuple(c for c in message.tool_calls if c.id not in answered)
        return None, ()
    return None, ()


def waiting_turn(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The last calling turn of ``messages`` and the results after it, when one of its calls
    has no result yet; else ``()``."""
    turn, gap = unanswered_tail(messages)
    if turn is None or not gap:
        return ()
    start = len(messages) - 1
    while messages[start] is not turn:
        start -= 1
    return tuple(messages[start:])


async def stored_waiting_turn(session: Session) -> tuple[ChatMessage, ...]:
    """:func:`waiting_turn` of ``session``'s stored history, read from its newest messages.

    A store with ``get_last_messages`` (raf's) is read from the end, more
    at each look, until a message that is not a tool result is in; another
    is read whole.
    """
    last = getattr(session, "get_last_messages", None)
    if not callable(last):
        return waiting_turn(await session.get_messages())
    count = FIRST_LOOK
    while True:
        tail: Sequence[ChatMessage] = await last(count)
        if len(tail) < count or any(message.role != "tool" for message in tail):
            return waiting_turn(tail)
        count *= 4


async def still_owed(session: Session, answers: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The ``answers`` whose calls the stored history still waits for, read just before storing.

    Another run may have answered them meanwhile (a new message sent while
    an approved call ran elsewhere): a second answer, after that run's turn,
    would answer nothing, and a model refuses such a history.
    """
    if not answers:
        return ()
    _, gap = unanswered_tail(await session.get_messages())
    waiting = {call.id for call in gap}
    return tuple(answer for answer in answers if answer.tool_call_id in waiting)
