"""memory_table: where a session store keeps long-term memories (a module per store)."""

from __future__ import annotations

import sys
from typing import Any

from raf._sessions.memories import MemoryTable
from raf._sessions.sqlite_connection import SqliteConnection
from raf._sessions.sqlite_memories import SqliteMemories

__all__: list[str] = []


def memory_table(store: object) -> MemoryTable | None:
    """The memory table of ``store``: its own ``memories()`` (an in-memory store, one of
    yours), the table of a SQLite, Redis or PostgreSQL store, or ``None`` for anything
    else.

    The Redis and PostgreSQL tables load with their store's module (an optional extra's):
    a store of theirs means the module is there.
    """
    own: Any = getattr(store, "memories", None)
    if callable(own):
        table: MemoryTable = own()
        return table
    if isinstance(store, SqliteConnection):
        return SqliteMemories(store)
    redis = sys.modules.get("raf._sessions.redis_connection")
    if redis is not None and isinstance(store, redis.RedisConnection):
        from raf._sessions.redis_memories import RedisMemories  # the extra is loaded

        return RedisMemories(store)
    postgres = sys.modules.get("raf._sessions.postgres_connection")
    if postgres is not None and isinstance(store, postgres.PostgresConnection):
        from raf._sessions.postgres_memories import PostgresMemories  # the extra is loaded

        return PostgresMemories(store)
    return None
