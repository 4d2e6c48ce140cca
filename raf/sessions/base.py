"""The Session protocol and the request hash every session records."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Final, Protocol, runtime_checkable

import attrs

from raf.messages import ChatMessage, messages_to_json

__all__ = ["REQUEST_HASH_LIMIT", "RequestHash", "Session", "request_hash"]

#: How many request digests a session keeps (the most recent ones).
REQUEST_HASH_LIMIT: Final = 64


@attrs.frozen(slots=True)
class RequestHash:
    """What ``Session.touch_request_hash`` returns: the request's digest, and whether
    this session had already recorded it (a client retrying a turn, for example)."""

    digest: str
    repeated: bool


@runtime_checkable
class Session(Protocol):
    """Where a conversation lives between runs.

    ``get_messages`` returns the stored history, oldest first (raf's stores
    return a tuple);
    ``add_messages`` appends messages in one step, all or nothing;
    ``touch_request_hash`` records the hash of a run's request messages with
    the time, and returns it.
    """

    @property
    def id(self) -> str: ...

    async def get_messages(self) -> Sequence[ChatMessage]: ...

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None: ...

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash: ...

    async def request_hashes(self) -> dict[str, float]: ...


def request_hash(messages: Iterable[ChatMessage]) -> str:
    """SHA-256 hex digest of the messages' canonical JSON (stable across processes).

    >>> request_hash([]) == request_hash(())
    True
    """
    return hashlib.sha256(messages_to_json(messages).encode()).hexdigest()
