"""Long-term memories as the stores keep them: the record, the table protocol, in memory.

A memory is one fact an agent keeps across sessions, in a *namespace* (a user,
a team): its id, its text, and where it came from (the session that wrote it,
when). Every store keeps them in a table of its own (:class:`MemoryTable`):
this module's :class:`InMemoryMemories` in this process, the SQLite, Redis and
PostgreSQL ones in a module each, reached with ``store.memories()``. One
namespace never reads or changes another's.
"""

from __future__ import annotations

import json
from typing import Any, Final, Protocol, runtime_checkable

import attrs

from raf.errors import SessionStoreError

__all__ = ["InMemoryMemories"]

#: The longest namespace a store keeps, in characters.
MAX_NAMESPACE: Final = 512


@attrs.frozen(slots=True)
class MemoryRecord:
    """One remembered fact: its ``id`` (unique in its namespace), its ``text``, and its
    provenance: the ``session_id`` that wrote it last (``None``: written outside a
    session) and ``created_at``, when it was written (seconds since the epoch, UTC)."""

    id: str
    text: str
    session_id: str | None
    created_at: float

    def to_json(self) -> str:
        """The record as one JSON object (how Redis keeps it)."""
        return json.dumps(
            {
                "id": self.id,
                "text": self.text,
                "session_id": self.session_id,
                "created_at": self.created_at,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> MemoryRecord:
        """A record back from :meth:`to_json`; a :class:`raf.errors.SessionStoreError`
        naming ``where`` when it is not one."""
        try:
            data = json.loads(text)
            return record_of(data["id"], data["text"], data["session_id"], data["created_at"])
        except (ValueError, TypeError, KeyError) as exc:
            raise SessionStoreError(f"{where}: a stored memory is not raf's ({exc})") from exc


def record_of(id: Any, text: Any, session_id: Any, created_at: Any) -> MemoryRecord:
    """A record from a stored row, each field checked (``TypeError`` when one is foreign)."""
    if type(id) is not str or type(text) is not str:
        raise TypeError(f"a memory's id and text must be str, got {id!r}, {text!r:.40}")
    if session_id is not None and type(session_id) is not str:
        raise TypeError(f"a memory's session_id must be a str or None, got {session_id!r}")
    if type(created_at) not in (int, float):
        raise TypeError(f"a memory's created_at must be a number, got {created_at!r}")
    return MemoryRecord(id, text, session_id, float(created_at))


@attrs.frozen(slots=True)
class MemoryWrite:
    """What one write does to a namespace, all of it or nothing: ``add`` new records,
    ``update`` records by id (their text and provenance replaced; an id no longer
    there is skipped), ``delete`` ids (an id not there is skipped)."""

    add: tuple[MemoryRecord, ...] = ()
    update: tuple[MemoryRecord, ...] = ()
    delete: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.update or self.delete)


@runtime_checkable
class MemoryTable(Protocol):
    """Where a store keeps long-term memories, by namespace."""

    async def list(self, namespace: str) -> tuple[MemoryRecord, ...]:
        """The namespace's memories, oldest first."""
        ...

    async def write(self, namespace: str, write: MemoryWrite) -> int:
        """Apply ``write`` in one step (atomic); how many of its updates and deletions
        found their record."""
        ...


def checked_namespace(namespace: object) -> str:
    """``namespace`` if a store can keep it: a non-empty str of at most
    :data:`MAX_NAMESPACE` characters, without NUL, that UTF-8 can encode.

    >>> checked_namespace("")
    Traceback (most recent call last):
    ValueError: a memory namespace must be a non-empty str, got ''
    """
    if type(namespace) is not str or not namespace:
        raise ValueError(f"a memory namespace must be a non-empty str, got {namespace!r:.80}")
    if len(namespace) > MAX_NAMESPACE or "\x00" in namespace:
        raise ValueError(
            f"a memory namespace must be at most {MAX_NAMESPACE} characters, without NUL: "
            f"{namespace!r:.80}"
        )
    try:
        namespace.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"a memory namespace must be text UTF-8 can encode: {namespace!r:.80}"
        ) from None
    return namespace


def checked_write(write: object) -> MemoryWrite:
    """``write`` if it is a :class:`MemoryWrite` of records and ids a store can keep."""
    if not isinstance(write, MemoryWrite):
        raise TypeError(f"a memory write must be a MemoryWrite, got {type(write).__name__}")
    for record in (*write.add, *write.update):
        if not isinstance(record, MemoryRecord):
            raise TypeError(f"a memory write holds {type(record).__name__}, not a MemoryRecord")
        for text in (record.id, record.text, record.session_id or ""):
            if "\x00" in text:
                raise ValueError(f"a memory cannot hold NUL (\\x00): {text!r:.80}")
    return write


class InMemoryMemories:
    """Memories kept in this process (lost when it ends): for tests and one-process agents.

    >>> import anyio
    >>> table = InMemoryMemories()
    >>> tea = MemoryRecord("m1", "likes tea", None, 0.0)
    >>> anyio.run(table.write, "alice", MemoryWrite(add=(tea,)))
    0
    >>> [m.text for m in anyio.run(table.list, "alice")], anyio.run(table.list, "bob")
    (['likes tea'], ())
    """

    def __init__(self) -> None:
        # namespace -> id -> record, in the order added (an update keeps its place).
        self._namespaces: dict[str, dict[str, MemoryRecord]] = {}

    async def list(self, namespace: str) -> tuple[MemoryRecord, ...]:
        """The namespace's memories, oldest first."""
        return tuple(self._namespaces.get(checked_namespace(namespace), {}).values())

    async def write(self, namespace: str, write: MemoryWrite) -> int:
        """Apply ``write`` (no await in between: atomic within the event loop)."""
        checked_namespace(namespace)
        checked_write(write)
        kept = self._namespaces.setdefault(namespace, {})
        found = 0
        for record in write.update:
            if record.id in kept:
                kept[record.id] = record
                found += 1
        for id in write.delete:
            found += kept.pop(id, None) is not None
        for record in write.add:
            kept.setdefault(record.id, record)
        if not kept:
            del self._namespaces[namespace]
        return found

    def __repr__(self) -> str:
        return f"InMemoryMemories(namespaces={len(self._namespaces)})"

