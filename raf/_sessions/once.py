"""Appends done once per key: a replayed durable run does not store its history twice.

An append may carry the tool calls that wait for approval (``pending``):
they are recorded in the same transaction as the messages, so a replayed
run neither stores its turn twice nor brings back a call someone decided.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from raf._sessions.base import checked_pending
from raf._values.messages import ChatMessage, PendingCall

if TYPE_CHECKING:
    from raf._sessions.redis import RedisSession
    from raf._sessions.sqlite import SqliteSession

__all__: list[str] = []

# Created on first use, inside the write transaction: stores made before it stay as they are.
_SQLITE_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS raf_once "
    "(session_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (session_id, key))"
)

# Lua: KEYS[1] the message list, KEYS[2] the session's set of keys written once, KEYS[3]
# the pending calls' hash; ARGV[1] the ttl ("0": none), ARGV[2] the key, ARGV[3] n, ARGV[4..n+3]
# the messages as raf's JSON, then token and JSON pairs of pending calls.
# Returns 0 (and writes nothing) when the key was written before, else 1.
_REDIS_SCRIPT: Final = """
if redis.call('SADD', KEYS[2], ARGV[2]) == 0 then return 0 end
local n = tonumber(ARGV[3])
for first = 4, n + 3, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, n + 3)))
end
for i = n + 4, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end
end
return 1
"""


def _checked_key(key: str) -> str:
    if type(key) is not str or not key:
        raise ValueError(f"an idempotency key must be a non-empty str, got {key!r}")
    return key


async def sqlite_add_once(
    session: SqliteSession,
    key: str,
    messages: Iterable[ChatMessage],
    pending: Iterable[PendingCall] = (),
) -> bool:
    """Append ``messages`` (and record ``pending``) unless ``key`` was written to this session
    before; say if it wrote."""
    from raf._sessions.sqlite import _encode
    from raf._sessions.sqlite_pending import _TABLE as _PENDING_TABLE
    from raf._sessions.sqlite_pending import _encode as _encode_call

    key = _checked_key(key)
    new, calls = checked_pending(messages, pending)
    encoded = [(session.id, _encode(message)) for message in new]
    waiting = [(session.id, call.token, _encode_call(call.to_dict())) for call in calls]

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
        if waiting:
            db.execute(_PENDING_TABLE)
            db.executemany(
                "INSERT OR REPLACE INTO raf_pending (session_id, token, call) VALUES (?, ?, ?)",
                waiting,
            )
        session.store.commit(db)
        session._stored = True
        return True

    return await session.store.with_connection(append)


async def redis_add_once(
    session: RedisSession,
    key: str,
    messages: Iterable[ChatMessage],
    pending: Iterable[PendingCall] = (),
) -> bool:
    """Append ``messages`` (and record ``pending``) unless ``key`` was written to this session
    before; say if it wrote."""
    from raf._sessions.redis import _FAILURES, _encode
    from raf._sessions.redis_pending import _encode as _encode_call

    key = _checked_key(key)
    new, calls = checked_pending(messages, pending)
    encoded = [_encode(message) for message in new]
    stamp = time.time()
    for index, call in enumerate(calls):  # ordered as record_pending orders them
        encoded += [call.token, _encode_call({**call.to_dict(), "order": [stamp, index]})]
    store = session.store
    client = store._require()
    messages_key, _ = session.keys
    base = messages_key.removesuffix(":messages")
    keys = [messages_key, base + ":once", base + ":pending"]
    try:
        written: Any = await client.eval(
            _REDIS_SCRIPT, keys=keys, args=[store._ttl_arg, key, str(len(new)), *encoded]
        )
    except _FAILURES as exc:
        store._fail(exc, f"append {len(encoded)} messages once (key {key!r})", session.id)
    return bool(written)
