"""Where spending budgets keep their counts: the protocol, the in-memory counts, and the
counts of a session store (SQLite, Redis, PostgreSQL), each in a module of its own.

A count is a key (a budget's scope and window) and the nano-dollars spent or
held in it; it expires when its window ends. Every backend does the two
steps of :class:`SpendCounts` atomically: of two processes that reserve the
last cent, one is refused.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from raf._sessions.spend_sqlite import SqliteSpendCounts
from raf._sessions.sqlite import SqliteSessionStore

__all__: list[str] = []


class SpendCounts(Protocol):
    """The counts of spending budgets, kept atomically."""

    async def reserve(
        self, keys: Sequence[str], limits: Sequence[int], amount: int, expires: Sequence[float]
    ) -> list[int] | None:
        """Add ``amount`` to every count of ``keys``, unless one would pass its limit: then
        add nothing. ``None`` when added, else what each count held (each ``expires`` at
        that Unix time: a count past it starts again from 0)."""
        ...

    async def settle(self, keys: Sequence[str], delta: int, expires: Sequence[float]) -> None:
        """Add ``delta`` (less than 0: give back) to every count of ``keys``."""
        ...

    async def aclose(self) -> None:
        """Let go of what the counts hold open (the counts themselves stay)."""
        ...


class MemorySpendCounts:
    """Counts in this process's memory, behind a lock (threads share them too)."""

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, float]] = {}
        self._lock = threading.Lock()

    async def reserve(
        self, keys: Sequence[str], limits: Sequence[int], amount: int, expires: Sequence[float]
    ) -> list[int] | None:
        now = time.time()
        with self._lock:
            if len(self._counts) > 4 * len(keys) + 1024:  # counts of ended windows go
                self._counts = {k: v for k, v in self._counts.items() if v[1] > now}
            held = [self._held(key, now) for key in keys]
            if any(h + amount > limit for h, limit in zip(held, limits, strict=True)):
                return held
            for key, h, end in zip(keys, held, expires, strict=True):
                self._counts[key] = (h + amount, end)
            return None

    async def settle(self, keys: Sequence[str], delta: int, expires: Sequence[float]) -> None:
        now = time.time()
        with self._lock:
            for key, end in zip(keys, expires, strict=True):
                self._counts[key] = (max(0, self._held(key, now) + delta), end)

    def _held(self, key: str, now: float) -> int:
        count = self._counts.get(key)
        return 0 if count is None or count[1] <= now else count[0]

    async def aclose(self) -> None:
        """Nothing to let go of."""


def spend_counts(store: object) -> SpendCounts:
    """The counts kept in ``store``, an open session store of raf's (SQLite, Redis,
    PostgreSQL); a ``TypeError`` for anything else."""
    if isinstance(store, SqliteSessionStore):
        return SqliteSpendCounts(store)
    # Only when the extra is there: a store of theirs means their module is loaded.
    redis = sys.modules.get("raf._sessions.redis")
    if redis is not None and isinstance(store, redis.RedisSessionStore):
        from raf._sessions.spend_redis import RedisSpendCounts  # Local: coredis is an extra.

        return RedisSpendCounts(store)
    postgres = sys.modules.get("raf._sessions.postgres")
    if postgres is not None and isinstance(store, postgres.PostgresSessionStore):
        from raf._sessions.spend_postgres import PostgresSpendCounts  # Local: psycopg, too.

        return PostgresSpendCounts(store)
    raise TypeError(
        "SpendLimits: store must be None (this process's memory), a session store's URL or "
        f"path, or a SqliteSessionStore, RedisSessionStore or PostgresSessionStore; got {store!r}"
    )
