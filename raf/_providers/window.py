"""read_window: the newest part of a history, by count and token budget, reading only that."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from raf._providers.tokens import approximate_tokens, message_units
from raf._sessions.base import Session
from raf._values.messages import ChatMessage

__all__: list[str] = []

#: A token counter: the tokens one message costs.
TokenCounter = Callable[[ChatMessage], int]

#: How many messages a token budget without a count reads first; doubled while it fits.
FIRST_READ: Final = 256


def checked_window(
    max_messages: int | None, max_tokens: int | None, count_tokens: TokenCounter | None
) -> TokenCounter:
    """Check a window's options (a clear ``ValueError`` or ``TypeError``); the token counter."""
    for name, value in (("max_messages", max_messages), ("max_tokens", max_tokens)):
        if value is not None and (type(value) is not int or value < 1):
            raise ValueError(f"{name} must be None or a positive int, got {value!r}")
    if count_tokens is None:
        return approximate_tokens
    if not callable(count_tokens):
        raise TypeError(f"count_tokens must be callable(message) -> int, got {count_tokens!r}")
    return count_tokens


async def read_window(
    session: Session,
    max_messages: int | None,
    max_tokens: int | None,
    count_tokens: TokenCounter = approximate_tokens,
) -> tuple[ChatMessage, ...]:
    """The newest messages of ``session``: at most ``max_messages``, at most ``max_tokens``.

    Reads only the tail it needs with the session's ``get_last_messages``
    (raf's stores have it; another session is read whole and cut). Never
    splits an assistant turn's tool calls from their results: a cut that
    would is moved forward to the next whole unit (:func:`message_units`).
    With neither bound, the whole history.
    """
    if max_messages is None and max_tokens is None:
        return await session.get_messages()
    last = getattr(session, "get_last_messages", None)
    want = max_messages if max_messages is not None else FIRST_READ
    while True:
        if last is None:
            history = await session.get_messages()
            tail = history[-want:]
            complete = len(tail) == len(history)
        else:
            tail = await last(want)
            complete = len(tail) < want
        kept = _fitting(tail, max_tokens, count_tokens)
        if kept is not None:
            return kept  # the budget was reached within what was read
        if max_messages is not None or complete:
            return _whole_units(tail)
        want *= 2  # a budget alone, not reached yet: read further back


def _fitting(
    tail: Sequence[ChatMessage], max_tokens: int | None, count_tokens: TokenCounter
) -> tuple[ChatMessage, ...] | None:
    """The newest whole units of ``tail`` within ``max_tokens``; ``None`` when all of them fit."""
    if max_tokens is None:
        return None
    units = message_units(tail)
    used = 0
    for index in range(len(units) - 1, -1, -1):
        used += sum(count_tokens(message) for message in units[index])
        if used > max_tokens:
            return tuple(message for unit in units[index + 1 :] for message in unit)
    return None


def _whole_units(tail: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """``tail`` without a cut unit at its start (orphan tool results, half-answered calls)."""
    for message in tail:
        if message.tool_calls or message.role == "tool":
            break
    else:
        return tuple(tail)  # no calls, no results: all whole units (a quarter of the time)
    units = message_units(tail)
    if sum(len(unit) for unit in units) == len(tail):
        return tuple(tail)
    return tuple(message for unit in units for message in unit)
