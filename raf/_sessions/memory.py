"""InMemorySession, the default session, and InMemorySessionStore: sessions kept in this process."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from raf._sessions.base import (
    REQUEST_HASH_LIMIT,
    Claimed,
    RequestHash,
    checked_batch,
    checked_call_id,
    checked_count,
    checked_key,
    checked_pending,
    checked_session_id,
    checked_spill,
    checked_tokens,
    request_hash,
)
from raf._sessions.cold import LastModelCall
from raf._sessions.fork import checked_fork, first_turns, spilled_ids
from raf._values.messages import ChatMessage, PendingCall
from raf.errors import SessionExistsError

__all__ = ["InMemorySession", "InMemorySessionStore"]


class InMemorySession:
    """A session kept in memory; what ``Agent.run(session=None)`` uses.

    The history is one list: ``add_messages`` extends it (the cost of the
    new messages only), ``get_last_messages`` copies the newest few, and
    ``get_messages`` hands out a tuple snapshot, made again only after the
    history grew.

    >>> import anyio
    >>> session = InMemorySession("demo")
    >>> anyio.run(session.add_messages, [ChatMessage.user("hi")])
    >>> len(anyio.run(session.get_messages))
    1
    """

    __slots__ = (
        "_hashes",
        "_id",
        "_last_call",
        "_messages",
        "_once",
        "_pending",
        "_snapshot",
        "_spilled",
    )

    def __init__(self, id: str | None = None) -> None:
        self._id = id  # drawn on first use: uuid4 costs a quarter of a bare run
        self._messages: list[ChatMessage] = []
        self._snapshot: tuple[ChatMessage, ...] | None = ()  # tuple(_messages), when made
        # Digest -> time last seen; insertion order is recency (a touch moves it to the end).
        self._hashes: dict[str, float] = {}
        self._pending: dict[str, PendingCall] = {}  # token -> call, in the order recorded
        self._once: set[str] = set()  # the keys add_once wrote
        self._spilled: dict[str, str] = {}  # call id -> the full result ToolOutputLimit cut
        self._last_call: LastModelCall | None = None

    @property
    def id(self) -> str:
        """The session's id (a uuid4 hex unless one was given)."""
        if self._id is None:
            import uuid  # here: `import raf` does not import it

            self._id = uuid.uuid4().hex
        return self._id

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        """The history, oldest first."""
        if self._snapshot is None:
            self._snapshot = tuple(self._messages)
        return self._snapshot

    async def get_last_messages(self, count: int) -> tuple[ChatMessage, ...]:
        """The newest ``count`` messages (all when fewer), oldest first."""
        if checked_count(count) >= len(self._messages):
            return await self.get_messages()
        return tuple(self._messages[-count:]) if count else ()

    async def count_messages(self) -> int:
        """How many messages the session holds."""
        return len(self._messages)

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages``; a non-``ChatMessage`` item rejects the whole call."""
        new = checked_batch(messages)
        if new:
            self._messages += new
            self._snapshot = None

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
        """Record the request messages' hash with the time; say whether it was there."""
        digest = request_hash(messages)
        # No await between the check and the record: atomic within the event loop.
        repeated = self._hashes.pop(digest, None) is not None
        self._hashes[digest] = time.time()
        if len(self._hashes) > REQUEST_HASH_LIMIT:
            del self._hashes[next(iter(self._hashes))]
        return RequestHash(digest, repeated)

    async def request_hashes(self) -> dict[str, float]:
        """The recorded digests with the time each was last seen, oldest first."""
        return dict(self._hashes)

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None:
        """Append ``messages`` and record ``pending`` in one step (no await in between)."""
        new, calls = checked_pending(messages, pending)
        if new:
            self._messages += new
            self._snapshot = None
        for call in calls:
            self._pending[call.token] = call

    async def list_pending(self) -> tuple[PendingCall, ...]:
        """The calls that wait for approval, in the order recorded."""
        return tuple(self._pending.values())

    async def claim_pending(self, tokens: Sequence[str]) -> Claimed | None:
        """Remove and return the pending calls of ``tokens``: all of them, or ``None``."""
        wanted = checked_tokens(tokens)
        if len(set(wanted)) != len(wanted) or not all(t in self._pending for t in wanted):
            return None
        taken = tuple(self._pending.pop(token) for token in wanted)
        return taken, tuple(self._pending.values())

    async def claim_all_pending(self) -> tuple[PendingCall, ...]:
        """Remove and return every pending call."""
        claimed, self._pending = tuple(self._pending.values()), {}
        return claimed

    async def add_once(
        self, key: str, messages: Iterable[ChatMessage], pending: Iterable[PendingCall] = ()
    ) -> bool:
        """:meth:`record_pending`, unless ``key`` was written before (then nothing; ``False``)."""
        checked_key(key)
        new, calls = checked_pending(messages, pending)
        if key in self._once:
            return False
        self._once.add(key)
        await self.record_pending(new, calls)
        return True

    async def spill_tool_result(self, call_id: str, text: str) -> None:
        """Keep the full result of tool call ``call_id`` (see :class:`raf.ToolOutputLimit`)."""
        call_id, text = checked_spill(call_id, text)
        self._spilled[call_id] = text

    async def spilled_tool_result(self, call_id: str) -> str | None:
        """The full result kept for ``call_id``, or ``None`` when none is kept."""
        return self._spilled.get(checked_call_id(call_id))

    async def last_model_call(self) -> LastModelCall | None:
        """When the session's last model call ended, and where its bounded views began."""
        return self._last_call

    async def record_model_call(self, at: float, cuts: Mapping[str, int]) -> None:
        """Record ``at`` as the last model call's time, ``cuts`` over the kept ones."""
        last = self._last_call
        self._last_call = LastModelCall(at, dict(cuts)) if last is None else last.merged(at, cuts)

    def __repr__(self) -> str:
        return f"InMemorySession(id={self.id!r}, messages={len(self._messages)})"


class InMemorySessionStore:
    """Sessions kept in this process, by id: a store without a file or a server.

    ``await store.get(session_id)`` returns the same :class:`InMemorySession`
    for an id every time; ``fork`` copies a session's first turns into a new
    one. Nothing outlives the process: for tests, notebooks and trying a stack.

    >>> import anyio
    >>> async def demo():
    ...     store = InMemorySessionStore()
    ...     await (await store.get("a")).add_messages([ChatMessage.user("hi")])
    ...     fork = await store.fork("a", "b")
    ...     return [m.content for m in await fork.get_messages()]
    >>> anyio.run(demo)
    ['hi']
    """

    __slots__ = ("_memories", "_sessions")

    def __init__(self) -> None:
        self._sessions: dict[str, InMemorySession] = {}
        self._memories: Any = None  # the long-term memories, made on first use

    def memories(self) -> Any:
        """The long-term memories kept with these sessions (see :class:`raf.LongTermMemory`)."""
        if self._memories is None:
            # Here: `import raf` loads this module, and need not load the memories'.
            from raf._sessions.memories import InMemoryMemories

            self._memories = InMemoryMemories()
        return self._memories

    async def get(self, session_id: str) -> InMemorySession:
        """The session ``session_id``, made empty on first use."""
        checked_session_id(session_id)
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = InMemorySession(session_id)
        return session

    async def session_ids(self) -> list[str]:
        """The ids of every session that holds messages, oldest first."""
        return [key for key, session in self._sessions.items() if session._messages]

    async def fork(self, session_id: str, new_id: str, *, at: int | None = None) -> InMemorySession:
        """Copy the first ``at`` turns of ``session_id`` (all without ``at``) into the new
        session ``new_id`` and return it; calls waiting for approval are not carried.

        ``at`` below 0 or past the last turn, or a session that holds no
        messages, is a ``ValueError``; a ``new_id`` that holds messages is a
        :class:`raf.errors.SessionExistsError`, and nothing is written. Atomic
        within the event loop: no await between the check and the copy.
        """
        return fork_into(self._sessions, session_id, new_id, at, "InMemorySessionStore")

    async def aclose(self) -> None:
        """Nothing to close: for symmetry with the other stores."""

    async def __aenter__(self) -> InMemorySessionStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"InMemorySessionStore(sessions={len(self._sessions)})"


def fork_into(
    sessions: dict[str, InMemorySession],
    session_id: str,
    new_id: str,
    at: int | None,
    where: str,
) -> InMemorySession:
    """The fork of ``sessions[session_id]`` as ``sessions[new_id]`` (see
    :meth:`InMemorySessionStore.fork`); also what a served agent's own store uses."""
    at = checked_fork(session_id, new_id, at)
    source = sessions.get(session_id)
    copied = first_turns(source._messages if source is not None else (), session_id, at)
    target = sessions.get(new_id)
    if target is not None and target._messages:
        raise SessionExistsError(new_id, len(target._messages), where)
    if target is None:
        target = sessions[new_id] = InMemorySession(new_id)
    # A list of its own: the messages are frozen, the list is what a session writes.
    target._messages = list(copied)
    target._snapshot = None
    kept = source._spilled if source is not None else {}
    # The full results of the copied cut ones (see raf._sessions.fork.carry_spilled).
    target._spilled.update({i: kept[i] for i in spilled_ids(copied) if i in kept})
    return target
