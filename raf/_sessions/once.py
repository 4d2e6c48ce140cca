"""Appends done once per key: a replayed durable run does not store its history twice."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from raf._messages import ChatMessage
from raf._sessions.base import checked_batch

if TYPE_CHECKING:
    from raf._sessions.redis import RedisSession
    from raf._sessions.sqlite import SqliteSession

__all__: list[str] = []

# Created on first use, inside the write transaction: stores made before it stay as they are.
_SQLITE_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS raf_once "
    "(session_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (session_id, key))"
)

# Lua: KEYS[1] the message list, KEYS[2] the session's set of keys written once;
# ARGV[1] the ttl ("0": none), ARGV[2] the key, ARGV[3..] the messages as raf's JSON.
# Returns 0 (and writes nothing) when the key was written before, else 1.
_REDIS_SCRIPT: Final = """
if redis.call('SADD', KEYS[2], ARGV[2]) == 0 then return 0 end
for first = 3, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
return 1
"""


def _checked_key(key: str) -> str:
    if type(key) is not str or not key:
        raise ValueError(f"an idempotency key must be a non-empty str, got {key!r}")
    return key


async def sqlite_add_once(
    session: SqliteSession, key: str, messages: Iterable[ChatMessage]
) -> bool:
    """Append ``messages`` unless ``key`` was written to this session before; say if it wrote."""
    from raf._sessions.sqlite import _encode

    key = _checked_key(key)
    new = checked_batch(messages)
    encoded = [(session.id, _encode(message)) for message in new]

    def append(db: sqlite3.Connection) -> bool:
        db.execute("BEGIN IMMEDIATE")  # the key and the messages in one write transaction
        db.execute(_SQLITE_TABLE)
        if not db.execute(
            "INSERT OR IGNORE INTO raf_once (session_id, key) VALUES (?, ?)", (session.id, key)
        ).rowcount:
            db.rollback()
            return False
        session._ensure_row(db)
        db.executemany("INSERT INTO raf_messages (session_id, message) VALUES (?, ?)", encoded)
        session.store.commit(db)
        session._stored = True
        return True

    return await session.store.with_connection(append)


async def redis_add_once(session: RedisSession, key: str, messages: Iterable[ChatMessage]) -> bool:
    """Append ``messages`` unless ``key`` was written to this session before; say if it wrote."""
    from raf._sessions.redis import _FAILURES, _encode

    key = _checked_key(key)
    encoded = [_encode(message) for message in checked_batch(messages)]
    store = session.store
    client = store._require()
    messages_key, _ = session.keys
    once_key = messages_key.removesuffix(":messages") + ":once"
    try:
        written: Any = await client.eval(
            _REDIS_SCRIPT, keys=[messages_key, once_key], args=[store._ttl_arg, key, *encoded]
        )
    except _FAILURES as exc:
        store._fail(exc, f"append {len(encoded)} messages once (key {key!r})", session.id)
    return bool(written)
