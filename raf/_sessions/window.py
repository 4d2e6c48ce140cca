"""read_window: the newest part of a history, cut at a start that moves in steps.

A provider prompt cache serves a call whose start it has seen before, so a
window that slid by one message every turn would make every call pay in
full. Here the start of a window stays where it is while the window fits
its bound, and jumps forward by a ``step`` when it would not:

- by messages (bound ``B``, step ``S``, ``n`` stored): ``start = 0`` while
  ``n <= B``, else the smallest multiple of ``S`` with ``n - start <= B``,
  that is ``ceil((n - B) / S) * S``. It stays put for ``S`` appended
  messages, then jumps by ``S`` (the window then holds ``B - S + 1``);
- by tokens (bound ``B``, step ``S``): the same over the cumulative token
  counts: the first message at or after the smallest multiple of ``S``
  tokens with ``total - offset <= B``.

The start is then moved past any tool results it landed on, so a calling
turn is never split from its results (every process makes the same
adjustment). Each start is a pure function of the stored history and the
parameters: no state is kept between turns, so every worker computes the
same window. A message window needs only the stored count (which raf's
stores know: ``count_messages``) and the window itself, so a turn costs the
same over 100,000 stored messages as over 1,000. A token window counts the
messages from its first one: from the message window's start when there is
one, else from the history's first message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from raf._sessions.base import Session
from raf._sessions.cold import Cuts
from raf._sessions.tokens import approximate_tokens, message_units
from raf._sessions.waiting import waiting_turn
from raf._values.messages import ChatMessage

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__: list[str] = []

#: A token counter: the tokens one message costs.
TokenCounter = Callable[[ChatMessage], int]


def checked_bound(name: str, value: int | None) -> None:
    """A clear ``ValueError`` unless ``value`` is ``None`` or a positive int."""
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{name} must be None or a positive int, got {value!r}")


def checked_step(step: int | None, bound: int, name: str = "step") -> int:
    """``step`` checked against its ``bound`` (a clear ``ValueError``); by default four
    fifths of it (a fifth of the bound is kept right after a step).

    Each step re-bills what the window keeps once, so a window that steps
    further steps less often and bills less for each character it keeps on
    average (``benchmarks/bench_cache_peers.py``: against half the bound, 9 to
    11 % fewer billed units per character kept, even on large tool results by
    tokens). Four fifths puts raf's default windows on the frontier of every
    set-up measured, raf's and its peers'; a smaller step keeps more right
    after each step, for more units.
    """
    if step is None:
        return max(1, bound * 4 // 5)
    if type(step) is not int or not 1 <= step <= bound:
        raise ValueError(f"{name} must be an int from 1 to the bound ({bound}), got {step!r}")
    return step


def checked_counter(count_tokens: TokenCounter | None, name: str) -> TokenCounter | None:
    """``count_tokens`` if it is ``None`` or callable, else a clear ``TypeError``."""
    if count_tokens is not None and not callable(count_tokens):
        raise TypeError(f"{name} must be callable(message) -> int, got {count_tokens!r}")
    return count_tokens


def window_steps(
    max_messages: int | None, max_tokens: int | None, step: int | None
) -> tuple[int, int]:
    """Check a window's bounds and ``step``; the message step and the token step.

    ``step`` is in its bound's unit, so it cannot be given with both bounds
    (each then steps by four fifths of itself).
    """
    checked_bound("max_messages", max_messages)
    checked_bound("max_tokens", max_tokens)
    if step is not None and (max_messages is None) == (max_tokens is None):
        which = "both bounds" if max_messages is not None else "no bound"
        raise ValueError(f"step is in its bound's unit: give it with one bound, not {which}")
    return (
        checked_step(step, max_messages) if max_messages is not None else 1,
        checked_step(step, max_tokens) if max_tokens is not None else 1,
    )


def client_counter(agent: AgentLike | None) -> TokenCounter:
    """The agent's client's ``count_tokens(messages, tools)`` per message, if it has one;
    else :func:`raf.compression.approximate_tokens`."""
    count = getattr(getattr(agent, "chat_client", None), "count_tokens", None)
    if not callable(count):
        return approximate_tokens
    return lambda message: int(count((message,), ()))


def stepped_start(total: int, bound: int, step: int) -> int:
    """The first position of a window of ``bound`` over ``total`` that moves by ``step``.

    >>> [stepped_start(n, 6, 2) for n in range(5, 12)]
    [0, 0, 2, 2, 4, 4, 6]
    """
    if total <= bound:
        return 0
    return -((bound - total) // step) * step  # ceil((total - bound) / step) * step


def low_start(total: int, bound: int, step: int) -> int:
    """Where the window starts after its next cut: at most ``bound - step`` (its low mark).

    >>> [low_start(n, 6, 2) for n in range(3, 9)]
    [0, 0, 2, 2, 4, 4]
    """
    return min(total, stepped_start(total, bound - step, step))


#: ``cut(stepped, due_next, limit) -> start``: a view's start, given its stepped start and
#: the start of its next cut (see :meth:`raf._sessions.cold.Cuts.start`).
Cut = Callable[[int, int, int], int]


def past_results(messages: Sequence[ChatMessage], start: int) -> int:
    """``start`` moved past the tool results there: they belong to a turn before it."""
    while start < len(messages) and messages[start].role == "tool":
        start += 1
    return start


def token_start(
    messages: Sequence[ChatMessage],
    bound: int,
    step: int,
    count: TokenCounter,
    cut: Cut | None = None,
) -> int:
    """The index where the token window of ``messages`` starts (before :func:`past_results`);
    ``cut`` moves it (a floor kept with the session, a cold call)."""
    costs = [count(message) for message in messages]
    total = sum(costs)
    index = _index_at(costs, stepped_start(total, bound, step))
    if cut is None:
        return index
    return cut(index, _index_at(costs, low_start(total, bound, step)), len(messages))


def _index_at(costs: Sequence[int], offset: int) -> int:
    """The first message at or after ``offset`` tokens."""
    index, spent = 0, 0
    while spent < offset and index < len(costs):
        spent += costs[index]
        index += 1
    return index


def view_cut(cuts: Cuts | None, key: str, cold_after: float | None, offset: int) -> Cut | None:
    """The :data:`Cut` of the view ``key`` whose messages start at ``offset`` (stored)."""
    if cuts is None:
        return None
    return lambda stepped, due_next, limit: cuts.start(
        key, stepped, due_next, cold_after=cold_after, limit=limit, offset=offset
    )


def whole_units(tail: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """``tail`` without pieces a model refuses (orphan tool results, half-answered calls)."""
    for message in tail:
        if message.tool_calls or message.role == "tool":
            break
    else:
        return tuple(tail)  # no calls, no results: all whole units (a quarter of the time)
    units = message_units(tail)
    if sum(len(unit) for unit in units) == len(tail):
        return tuple(tail)
    return tuple(message for unit in units for message in unit)


async def read_window(
    session: Session,
    max_messages: int | None,
    max_tokens: int | None,
    count_tokens: TokenCounter = approximate_tokens,
    *,
    message_step: int = 1,
    token_step: int = 1,
    cuts: Cuts | None = None,
    cold_after: float | None = None,
) -> tuple[ChatMessage, ...]:
    """The window of ``session``: at most ``max_messages``, at most ``max_tokens``.

    The message window is cut first (read with the session's
    ``count_messages`` and ``get_last_messages``: raf's stores have them;
    another session is read whole), then the token window within it. With
    neither bound, the whole history. A last turn whose calls wait (for a
    decision, or for the client that runs them) stays in the window with the
    results it has: the run that answers it answers it there.

    ``cuts`` (see :mod:`raf._sessions.cold`) keeps each start at or after its
    floor, and moves it to its next cut when the call is cold by
    ``cold_after``; ``cuts.offset`` is then where the window starts in the
    stored history.
    """
    if max_messages is None and max_tokens is None:
        return await session.get_messages()
    if max_messages is None:
        window: Sequence[ChatMessage] = await session.get_messages()
        offset = 0
    else:
        window, offset = await _message_window(
            session, max_messages, message_step, view_cut(cuts, "messages", cold_after, 0)
        )
    if max_tokens is not None:
        cut = view_cut(cuts, "tokens", cold_after, offset)
        start = past_results(window, token_start(window, max_tokens, token_step, count_tokens, cut))
        window, offset = window[start:], offset + start
    if cuts is not None:
        cuts.offset = offset
    waiting = waiting_turn(window)
    if not waiting:
        return whole_units(window)
    return (*whole_units(window[: len(window) - len(waiting)]), *waiting)


async def _message_window(
    session: Session, bound: int, step: int, cut: Cut | None
) -> tuple[Sequence[ChatMessage], int]:
    """The message window, and where it starts in the stored history."""
    count = getattr(session, "count_messages", None)
    last = getattr(session, "get_last_messages", None)
    if count is None or last is None:
        history = await session.get_messages()
        start = _moved(cut, len(history), bound, step)
        start = past_results(history, start)
        return history[start:], start
    total: int = await count()
    start = _moved(cut, total, bound, step)
    tail: Sequence[ChatMessage] = await last(total - start)
    skip = past_results(tail, 0)
    return tail[skip:], start + skip


def _moved(cut: Cut | None, total: int, bound: int, step: int) -> int:
    start = stepped_start(total, bound, step)
    return start if cut is None else cut(start, low_start(total, bound, step), total)
