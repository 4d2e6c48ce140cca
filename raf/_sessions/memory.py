"""InMemorySession: the default session, kept in this process."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from raf._sessions.base import (
    REQUEST_HASH_LIMIT,
    Claimed,
    RequestHash,
    checked_batch,
    checked_count,
    checked_key,
    checked_pending,
    checked_tokens,
    request_hash,
)
from raf._sessions.cold import LastModelCall
from raf._values.messages import ChatMessage, PendingCall

__all__ = ["InMemorySession"]


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

    __slots__ = ("_hashes", "_id", "_last_call", "_messages", "_once", "_pending", "_snapshot")

    def __init__(self, id: str | None = None) -> None:
        self._id = id  # drawn on first use: uuid4 costs a quarter of a bare run
        self._messages: list[ChatMessage] = []
        self._snapshot: tuple[ChatMessage, ...] | None = ()  # tuple(_messages), when made
        # Digest -> time last seen; insertion order is recency (a touch moves it to the end).
        self._hashes: dict[str, float] = {}
        self._pending: dict[str, PendingCall] = {}  # token -> call, in the order recorded
        self._once: set[str] = set()  # the keys add_once wrote
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

    async def last_model_call(self) -> LastModelCall | None:
        """When the session's last model call ended, and where its bounded views began."""
        return self._last_call

    async def record_model_call(self, at: float, cuts: Mapping[str, int]) -> None:
        """Record ``at`` as the last model call's time, ``cuts`` over the kept ones."""
        last = self._last_call
        self._last_call = LastModelCall(at, dict(cuts)) if last is None else last.merged(at, cuts)

    def __repr__(self) -> str:
        return f"InMemorySession(id={self.id!r}, messages={len(self._messages)})"
