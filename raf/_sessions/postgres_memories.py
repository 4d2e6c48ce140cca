"""PostgresMemories: the long-term memories of a PostgresSessionStore, in its database.

One table, ``{p}_memories`` (``{p}`` the store's prefix), created on first use under
the store's lock of the prefix: a row per memory, its namespace, id, text and
provenance. Memories have no ttl: they stay until they are deleted. Every write is
one transaction, whole or absent.
"""

from __future__ import annotations

from typing import Final

import psycopg

from raf._sessions.memories import (
    MemoryRecord,
    MemoryWrite,
    checked_namespace,
    checked_write,
    record_of,
)
from raf._sessions.postgres_connection import PostgresConnection
from raf.errors import SessionStoreError

__all__: list[str] = []

Conn = psycopg.Connection[tuple[object, ...]]

_TABLE: Final = """
CREATE TABLE IF NOT EXISTS {p}_memories (
    seq BIGSERIAL PRIMARY KEY,
    namespace TEXT NOT NULL,
    id TEXT NOT NULL,
    text TEXT NOT NULL,
    session_id TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (namespace, id)
)
"""
_LIST: Final = (
    "SELECT id, text, session_id, created_at FROM {p}_memories WHERE namespace = %s ORDER BY seq"
)
_UPDATE: Final = (
    "UPDATE {p}_memories SET text = %s, session_id = %s, created_at = %s "
    "WHERE namespace = %s AND id = %s"
)
_DELETE: Final = "DELETE FROM {p}_memories WHERE namespace = %s AND id = %s"
_ADD: Final = (
    "INSERT INTO {p}_memories (namespace, id, text, session_id, created_at) "
    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (namespace, id) DO NOTHING"
)


class PostgresMemories:
    """The :class:`raf._sessions.memories.MemoryTable` of a :class:`raf.PostgresSessionStore`
    (``store.memories()``): its calls go through the store's connections."""

    def __init__(self, store: PostgresConnection) -> None:
        self.store = store
        self._sql = {
            name: text.replace("{p}", store.prefix).encode()
            for name, text in (("list", _LIST), ("update", _UPDATE), ("delete", _DELETE))
        }
        self._sql["add"] = _ADD.replace("{p}", store.prefix).encode()
        self._ready = False  # the table is known to be there

    async def _table(self) -> None:
        if not self._ready:
            await self.store.open()
            statement = _TABLE.replace("{p}", self.store.prefix)

            def create(conn: Conn) -> None:
                found = conn.execute(
                    "SELECT to_regclass(%s)", (f"{self.store.prefix}_memories",)
                ).fetchone()
                if found is None or found[0] is None:
                    self.store.create(conn, [statement])

            await self.store.call(create, "create the memories table", None)
            self._ready = True

    async def list(self, namespace: str) -> tuple[MemoryRecord, ...]:
        """The namespace's memories, oldest first."""
        checked_namespace(namespace)
        await self._table()
        sql = self._sql["list"]
        rows = await self.store.call(
            lambda conn: conn.execute(sql, (namespace,)).fetchall(), "list memories", None
        )
        try:
            return tuple(record_of(*row) for row in rows)
        except TypeError as exc:
            raise SessionStoreError(
                f"{self.store.where}: a memory of namespace {namespace!r} is not raf's ({exc})"
            ) from exc

    async def write(self, namespace: str, write: MemoryWrite) -> int:
        """Apply ``write`` in one transaction."""
        checked_namespace(namespace)
        checked_write(write)
        if not write:
            return 0
        await self._table()
        sql = self._sql

        def apply(conn: Conn) -> int:
            found = 0
            for r in write.update:
                row = (r.text, r.session_id, r.created_at, namespace, r.id)
                found += conn.execute(sql["update"], row).rowcount
            for id in write.delete:
                found += conn.execute(sql["delete"], (namespace, id)).rowcount
            for r in write.add:
                conn.execute(sql["add"], (namespace, r.id, r.text, r.session_id, r.created_at))
            return found

        what = f"write memories ({len(write.add)} new)"
        return await self.store.call(
            apply, what, None, write=True, writing="nothing or everything of it is stored"
        )

    def __repr__(self) -> str:
        return f"PostgresMemories({self.store.where!r})"
