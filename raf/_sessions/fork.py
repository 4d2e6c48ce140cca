"""What every store's ``fork`` shares: where a session's first turns end, and its checks.

A turn is a user message and everything after it up to the next user message;
what comes before the first user message (a system message a program stored)
goes with every fork. Stores only ever append, so the first turns of a session
read once stay what they were while the fork is written. The full results
:class:`raf.ToolOutputLimit` spilled for the copied turns go with the fork, so
its model reads them back as the original's could.
"""

from __future__ import annotations

from collections.abc import Sequence

from raf._sessions.base import checked_session_id, keeps_spills
from raf._values.messages import ChatMessage
from raf._values.spill import parse_cut

__all__: list[str] = []


def checked_fork(session_id: str, new_id: str, at: object) -> int | None:
    """``fork``'s arguments checked: two different session ids, ``at`` ``None`` or an int.

    >>> checked_fork("a", "a", None)
    Traceback (most recent call last):
    ValueError: fork: new_id is the session itself ('a'); a fork needs an id of its own
    """
    checked_session_id(session_id)
    checked_session_id(new_id)
    if session_id == new_id:
        raise ValueError(
            f"fork: new_id is the session itself ({new_id!r}); a fork needs an id of its own"
        )
    if at is not None and type(at) is not int:
        raise ValueError(f"fork(at=...) must be an int (a number of turns) or None, got {at!r}")
    return at


def turn_starts(messages: Sequence[ChatMessage]) -> list[int]:
    """Where each turn starts: the index of each user message.

    >>> turn_starts([ChatMessage.user("a"), ChatMessage.assistant("b"), ChatMessage.user("c")])
    [0, 2]
    """
    return [index for index, message in enumerate(messages) if message.role == "user"]


def first_turns(
    messages: Sequence[ChatMessage], session_id: str, at: int | None
) -> tuple[ChatMessage, ...]:
    """The messages of ``messages``' first ``at`` turns (all of them when ``at`` is ``None``).

    A session that holds no messages has nothing to fork, and an ``at`` below 0
    or past the last turn is a ``ValueError`` that says how many turns there are.

    >>> history = [ChatMessage.user("a"), ChatMessage.assistant("b"), ChatMessage.user("c")]
    >>> [m.content for m in first_turns(history, "s", 1)]
    ['a', 'b']
    >>> first_turns(history, "s", 3)
    Traceback (most recent call last):
    ValueError: fork(at=3): session 's' has 2 turns; at must be 0 to 2
    """
    if not messages:
        raise ValueError(f"fork: session {session_id!r} holds no messages: nothing to fork")
    if at is None:
        return tuple(messages)
    starts = turn_starts(messages)
    if at < 0 or at > len(starts):
        raise ValueError(
            f"fork(at={at}): session {session_id!r} has {len(starts)} "
            f"turn{'s' if len(starts) != 1 else ''}; at must be 0 to {len(starts)}"
        )
    end = starts[at] if at < len(starts) else len(messages)
    return tuple(messages[:end])


def spilled_ids(messages: Sequence[ChatMessage]) -> tuple[str, ...]:
    """The call ids whose full results the cut tool results in ``messages`` point at, each once.

    >>> from raf._values.spill import cut_marker
    >>> cut = ChatMessage.tool("c1", "ab" + cut_marker("c1", 9, 2, 9))
    >>> spilled_ids([cut, ChatMessage.user("x")])
    ('c1',)
    """
    found: dict[str, None] = {}
    for message in messages:
        cut = parse_cut(message.content) if message.role == "tool" else None
        if cut is not None and cut.call_id is not None:
            found[cut.call_id] = None
    return tuple(found)


async def carry_spilled(source: object, target: object, messages: Sequence[ChatMessage]) -> None:
    """Keep with ``target`` (a fork just written, a forked child agent's session) the full
    results ``source`` keeps for the cut results in ``messages`` (what it copied): its model
    reads them back as ``source``'s could. A store's fork writes them after the fork, never
    before: a refused fork touches no other session."""
    if not (keeps_spills(source) and keeps_spills(target)):
        return
    for call_id in spilled_ids(messages):
        text = await source.spilled_tool_result(call_id)
        if text is not None:
            await target.spill_tool_result(call_id, text)
