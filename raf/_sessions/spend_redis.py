"""Spending budgets' counts in a RedisSessionStore's server: one Lua script a step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import anyio

from raf._sessions.redis import RedisSessionStore
from raf._sessions.redis_connection import FAILURES

__all__: list[str] = []

# KEYS: the counts; ARGV: the amount, each count's limit, each count's end (Unix ms).
# All are read before any is written: a script runs alone on the server, so the check
# and the write are one step for every client.
_RESERVE: Final = """
local n = #KEYS
local amount = tonumber(ARGV[1])
local held = {}
local refused = false
for i = 1, n do
  held[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
  if held[i] + amount > tonumber(ARGV[1 + i]) then refused = true end
end
if refused then
  table.insert(held, 1, 0)
  return held
end
for i = 1, n do
  redis.call('INCRBY', KEYS[i], ARGV[1])
  redis.call('PEXPIREAT', KEYS[i], ARGV[1 + n + i])
end
return {1}
"""
# KEYS: the counts; ARGV: the change, each count's end (Unix ms). Never below 0.
_SETTLE: Final = """
for i = 1, #KEYS do
  if redis.call('INCRBY', KEYS[i], ARGV[1]) < 0 then redis.call('SET', KEYS[i], 0) end
  redis.call('PEXPIREAT', KEYS[i], ARGV[1 + i])
end
return 1
"""


class RedisSpendCounts:
    """The counts under ``{prefix}:{spend}:`` on the store's server, each expiring with its
    window (``{spend}`` is a hash tag: a cluster keeps them on one node, as one script
    needs)."""

    def __init__(self, store: RedisSessionStore) -> None:
        self.store = store

    def _keys(self, keys: Sequence[str]) -> list[str]:
        return [f"{self.store.prefix}:{{spend}}:{key}" for key in keys]

    async def reserve(
        self, keys: Sequence[str], limits: Sequence[int], amount: int, expires: Sequence[float]
    ) -> list[int] | None:
        store = self.store
        args = [str(amount), *map(str, limits), *(str(int(end * 1000)) for end in expires)]
        try:
            with anyio.fail_after(store.timeout):
                answer = await store.run_script(store.client(), _RESERVE, self._keys(keys), args)
        except FAILURES as exc:
            store.fail(exc, "reserve from a spending budget", keys[0])
        if int(answer[0]) == 1:
            return None
        return [int(held) for held in answer[1:]]

    async def settle(self, keys: Sequence[str], delta: int, expires: Sequence[float]) -> None:
        store = self.store
        args = [str(delta), *(str(int(end * 1000)) for end in expires)]
        try:
            with anyio.fail_after(store.timeout):
                await store.run_script(store.client(), _SETTLE, self._keys(keys), args)
        except FAILURES as exc:
            store.fail(exc, "settle a call with a spending budget", keys[0])

    async def aclose(self) -> None:
        """The store is its owner's to close."""
