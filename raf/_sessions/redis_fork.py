"""Forking a session of a RedisSessionStore: one script writes the copy, only into an empty list."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import anyio

from raf._sessions.redis_connection import FAILURES, RedisConnection
from raf._values.messages import ChatMessage
from raf.errors import SessionExistsError

__all__: list[str] = []

# Lua: KEYS[1] the new session's message list; ARGV[1] the ttl ("0": none), ARGV[2..] the
# messages as raf's JSON. Returns minus the length when the list holds entries (nothing is
# written), else how many were written. LLEN fails with WRONGTYPE on a key of another type
# before anything is written. A script runs atomically: no write comes between the check
# and the copy.
_FORK: Final = """
local held = redis.call('LLEN', KEYS[1])
if held > 0 then return -held end
for first = 2, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
local ttl = tonumber(ARGV[1])
if ttl > 0 and #ARGV > 1 then redis.call('EXPIRE', KEYS[1], ttl) end
return #ARGV - 1
"""


async def write_fork(
    store: RedisConnection, messages_key: str, new_id: str, messages: Sequence[ChatMessage]
) -> None:
    """Store ``messages`` as the history of ``new_id`` (its list ``messages_key``), unless it
    holds messages: then a :class:`raf.errors.SessionExistsError`, and nothing is written."""
    encoded = [json.dumps(m.to_dict(), ensure_ascii=False, separators=(",", ":")) for m in messages]
    client = store.client()
    try:
        with anyio.fail_after(store.timeout):
            written = await store.run_script(
                client, _FORK, [messages_key], [store.ttl_arg, *encoded]
            )
    except FAILURES as exc:
        store.fail(
            exc,
            f"fork {len(encoded)} messages into it",
            new_id,
            writing="the copy is stored whole or not at all",
        )
    if int(written) < 0:
        raise SessionExistsError(new_id, -int(written), store.where)
