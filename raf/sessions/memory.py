"""InMemorySession: the default session, a list in this process."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence

from raf.messages import ChatMessage, Messages, trusted_messages
from raf.sessions.base import request_hash

__all__ = ["InMemorySession"]


class InMemorySession:
    """A session kept in memory; what ``Agent.run(session=None)`` uses.

    History is append-only, so ``get_messages`` hands out one shared
    immutable snapshot until the next ``add_messages``: reading the history
    of a long conversation every turn copies it at most once per turn.

    >>> import anyio
    >>> session = InMemorySession("demo")
    >>> anyio.run(session.add_messages, [ChatMessage.user("hi")])
    >>> len(anyio.run(session.get_messages))
    1
    """

    __slots__ = ("_id", "_messages", "_snapshot", "request_hashes")

    def __init__(self, id: str | None = None) -> None:
        self._id = id  # drawn on first use: uuid4 costs a quarter of a bare run
        self._messages: list[ChatMessage] = []
        self._snapshot: Messages | None = trusted_messages(())
        #: Each request hash recorded, with the wall-clock time it was last seen.
        self.request_hashes: dict[str, float] = {}

    @property
    def id(self) -> str:
        """The session's id (a uuid4 hex unless one was given)."""
        if self._id is None:
            self._id = uuid.uuid4().hex
        return self._id

    async def get_messages(self) -> Messages:
        """The history, oldest first."""
        snapshot = self._snapshot
        if snapshot is None:
            snapshot = self._snapshot = trusted_messages(self._messages)
        return snapshot

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages``; a non-``ChatMessage`` item rejects the whole call."""
        new = messages if type(messages) is Messages else Messages(messages)
        if new:
            self._messages.extend(new)
            self._snapshot = None

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> str:
        """Record and return the request messages' hash."""
        digest = request_hash(messages)
        self.request_hashes[digest] = time.time()
        return digest

    def __repr__(self) -> str:
        return f"InMemorySession(id={self.id!r}, messages={len(self._messages)})"
