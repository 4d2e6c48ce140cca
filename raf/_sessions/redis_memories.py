"""RedisMemories: the long-term memories of a RedisSessionStore, on its server.

One hash per namespace, ``{prefix}:memories:{namespace}`` (no session key starts
so: theirs are ``{prefix}:{id}:...``): memory id -> the record as JSON, with the
order it was added in. Memories have no ttl: they stay until they are deleted.
Every write is one Lua script, atomic on the server: whole or absent.
"""

from __future__ import annotations

import json
import time
from typing import Any, Final

import anyio

from raf._sessions.memories import (
    MemoryRecord,
    MemoryWrite,
    checked_namespace,
    checked_write,
)
from raf._sessions.redis_connection import FAILURES, RedisConnection

__all__: list[str] = []

# Lua: KEYS[1] the namespace's hash; ARGV: the number of updates, then (id, JSON) of
# each, the number of deletions, then their ids, then (id, JSON) of each new record.
# An update keeps the order its record was added in: the stored JSON opens with it.
_WRITE: Final = """
local key = KEYS[1]
local found = 0
local i = 2
for _ = 1, tonumber(ARGV[1]) do
  local old = redis.call('HGET', key, ARGV[i])
  if old then
    local head = string.match(old, '^{"order": %[[^%]]*%], ') or '{'
    redis.call('HSET', key, ARGV[i], head .. string.sub(ARGV[i + 1], 2))
    found = found + 1
  end
  i = i + 2
end
local deletions = tonumber(ARGV[i])
i = i + 1
for _ = 1, deletions do
  found = found + redis.call('HDEL', key, ARGV[i])
  i = i + 1
end
while i <= #ARGV do
  redis.call('HSETNX', key, ARGV[i], ARGV[i + 1])
  i = i + 2
end
return found
"""


class RedisMemories:
    """The :class:`raf._sessions.memories.MemoryTable` of a :class:`raf.RedisSessionStore`
    (``store.memories()``): its calls go through the store's client."""

    def __init__(self, store: RedisConnection) -> None:
        self.store = store

    def key(self, namespace: str) -> str:
        """The hash that holds ``namespace``'s memories."""
        return f"{self.store.prefix}:memories:{namespace}"

    async def list(self, namespace: str) -> tuple[MemoryRecord, ...]:
        """The namespace's memories, oldest first."""
        checked_namespace(namespace)
        store = self.store
        client = store.client()
        try:
            with anyio.fail_after(store.timeout):
                entries: Any = await client.hgetall(self.key(namespace))
        except FAILURES as exc:
            store.fail(exc, "list memories", namespace)
        where = f"{store.where}, memories of {namespace!r}"
        kept: list[tuple[tuple[float, ...], MemoryRecord]] = []
        for value in entries.values():
            record = MemoryRecord.from_json(value, where)
            order = json.loads(value).get("order")
            order = tuple(order) if isinstance(order, list) else ()
            kept.append((order, record))
        kept.sort(key=lambda pair: pair[0])
        return tuple(record for _, record in kept)

    async def write(self, namespace: str, write: MemoryWrite) -> int:
        """Apply ``write`` in one script, atomic on the server."""
        checked_namespace(namespace)
        checked_write(write)
        if not write:
            return 0
        args = [str(len(write.update))]
        for record in write.update:
            args += [record.id, record.to_json()]
        args += [str(len(write.delete)), *write.delete]
        stamp = time.time()
        for index, record in enumerate(write.add):
            order = json.dumps([stamp, index])
            args += [record.id, f'{{"order": {order}, {record.to_json()[1:]}']
        store = self.store
        client = store.client()
        try:
            with anyio.fail_after(store.timeout):
                found = await store.run_script(client, _WRITE, [self.key(namespace)], args)
        except FAILURES as exc:
            store.fail(exc, "write memories", namespace, writing="it is stored whole or not at all")
        return int(found)

    def __repr__(self) -> str:
        return f"RedisMemories({self.store.where!r}, prefix={self.store.prefix!r})"
