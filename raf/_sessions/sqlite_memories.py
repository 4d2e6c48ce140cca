"""SqliteMemories: the long-term memories of a SqliteSessionStore, in its file.

One table, ``raf_memories``, created with the first write (a file made before it
is read as it is): a row per memory, its namespace, id, text and provenance.
Every write is one ``BEGIN IMMEDIATE`` transaction, so it is whole or absent,
in every process that shares the file.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from raf._sessions.memories import (
    MemoryRecord,
    MemoryWrite,
    checked_namespace,
    checked_write,
    record_of,
)
from raf._sessions.sqlite_connection import SqliteConnection
from raf.errors import SessionStoreError

__all__: list[str] = []

_TABLE: Final = """
CREATE TABLE IF NOT EXISTS raf_memories (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    text TEXT NOT NULL,
    session_id TEXT,
    created_at REAL NOT NULL,
    UNIQUE (namespace, id)
)
"""


class SqliteMemories:
    """The :class:`raf._sessions.memories.MemoryTable` of a :class:`raf.SqliteSessionStore`
    (``store.memories()``): its calls go through the store's one connection."""

    def __init__(self, store: SqliteConnection) -> None:
        self.store = store

    async def list(self, namespace: str) -> tuple[MemoryRecord, ...]:
        """The namespace's memories, oldest first (a read: no write lock)."""
        checked_namespace(namespace)

        def read(db: sqlite3.Connection) -> list[tuple[object, ...]]:
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'raf_memories'"
            ).fetchone()
            if not found:
                return []
            return db.execute(
                "SELECT id, text, session_id, created_at FROM raf_memories "
                "WHERE namespace = ? ORDER BY seq",
                (namespace,),
            ).fetchall()

        rows = await self.store.with_connection(read)
        try:
            return tuple(record_of(*row) for row in rows)
        except TypeError as exc:
            raise SessionStoreError(
                f"session store {self.store.path}: a memory of namespace {namespace!r} "
                f"is not raf's ({exc})"
            ) from exc

    async def write(self, namespace: str, write: MemoryWrite) -> int:
        """Apply ``write`` in one transaction."""
        checked_namespace(namespace)
        checked_write(write)

        def apply(db: sqlite3.Connection) -> int:
            db.execute("BEGIN IMMEDIATE")
            db.execute(_TABLE)
            found = 0
            for record in write.update:
                found += db.execute(
                    "UPDATE raf_memories SET text = ?, session_id = ?, created_at = ? "
                    "WHERE namespace = ? AND id = ?",
                    (record.text, record.session_id, record.created_at, namespace, record.id),
                ).rowcount
            for id in write.delete:
                found += db.execute(
                    "DELETE FROM raf_memories WHERE namespace = ? AND id = ?", (namespace, id)
                ).rowcount
            db.executemany(
                "INSERT OR IGNORE INTO raf_memories (namespace, id, text, session_id, created_at)"
                " VALUES (?, ?, ?, ?, ?)",
                [(namespace, r.id, r.text, r.session_id, r.created_at) for r in write.add],
            )
            self.store.commit(db)
            return found

        return await self.store.with_connection(apply) if write else 0

    def __repr__(self) -> str:
        return f"SqliteMemories({str(self.store.path)!r})"
