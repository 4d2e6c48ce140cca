"""Spending budgets' counts in a PostgresSessionStore's database: one transaction a step."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import anyio
import psycopg

from raf._sessions.postgres import PostgresSessionStore

__all__: list[str] = []

Conn = psycopg.Connection[tuple[Any, ...]]

_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS {p}_spend "
    "(key text PRIMARY KEY, spent bigint NOT NULL, expires double precision NOT NULL)"
)


class PostgresSpendCounts:
    """The counts in table ``{prefix}_spend`` (made on first use).

    A step locks its rows (``SELECT ... FOR UPDATE``, in the keys' order, so
    two steps never wait on each other in a circle), checks and writes in one
    transaction: of two processes that reserve the last cent, the second
    waits for the first and then finds no room.
    """

    def __init__(self, store: PostgresSessionStore) -> None:
        self.store = store
        self._table = f"{store.prefix}_spend"
        self._made = False
        self._making = anyio.Lock()

    async def _make(self) -> None:
        async with self._making:
            if not self._made:
                statement = _TABLE.replace("{p}", self.store.prefix)
                await self.store.call(
                    lambda conn: self.store.create(conn, [statement]),
                    "create the table of spending budgets",
                    None,
                )
                self._made = True

    async def reserve(
        self, keys: Sequence[str], limits: Sequence[int], amount: int, expires: Sequence[float]
    ) -> list[int] | None:
        await self._make()
        order = sorted(range(len(keys)), key=keys.__getitem__)
        now = time.time()

        def reserve(conn: Conn) -> list[int] | None:
            held = self._lock_rows(conn, keys, expires, order, now)
            if any(h + amount > limit for h, limit in zip(held, limits, strict=True)):
                return held  # nothing written but rows of 0: they are no one's spending
            self._write(conn, keys, [h + amount for h in held], expires)
            return None

        return await self.store.call(reserve, "reserve from a spending budget", keys[0], write=True)

    async def settle(self, keys: Sequence[str], delta: int, expires: Sequence[float]) -> None:
        await self._make()
        order = sorted(range(len(keys)), key=keys.__getitem__)
        now = time.time()

        def settle(conn: Conn) -> None:
            held = self._lock_rows(conn, keys, expires, order, now)
            self._write(conn, keys, [max(0, h + delta) for h in held], expires)

        await self.store.call(settle, "settle a call with a spending budget", keys[0], write=True)

    def _lock_rows(
        self,
        conn: Conn,
        keys: Sequence[str],
        expires: Sequence[float],
        order: Sequence[int],
        now: float,
    ) -> list[int]:
        """Each key's count, its row made if missing and locked; a count whose window
        ended is 0."""
        table = self._table
        held = [0] * len(keys)
        for index in order:
            conn.execute(
                f"INSERT INTO {table} (key, spent, expires) VALUES (%s, 0, %s) "
                "ON CONFLICT (key) DO NOTHING".encode(),
                (keys[index], expires[index]),
            )
            row = conn.execute(
                f"SELECT spent, expires FROM {table} WHERE key = %s FOR UPDATE".encode(),
                (keys[index],),
            ).fetchone()
            if row is not None and float(row[1]) > now:
                held[index] = int(row[0])
        # Counts of ended windows go, but those another step holds (SKIP LOCKED: never a
        # wait, so never a deadlock) and this step's own, which it is about to write.
        conn.execute(
            f"DELETE FROM {table} WHERE key IN (SELECT key FROM {table} WHERE expires <= %s "
            "AND NOT key = ANY(%s) FOR UPDATE SKIP LOCKED)".encode(),
            (now, list(keys)),
        )
        return held

    def _write(
        self, conn: Conn, keys: Sequence[str], spent: Sequence[int], expires: Sequence[float]
    ) -> None:
        for key, value, end in zip(keys, spent, expires, strict=True):
            conn.execute(
                f"UPDATE {self._table} SET spent = %s, expires = %s WHERE key = %s".encode(),
                (value, end, key),
            )

    async def aclose(self) -> None:
        """The store is its owner's to close."""
