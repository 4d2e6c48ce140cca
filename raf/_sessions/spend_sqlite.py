"""Spending budgets' counts in a SqliteSessionStore's file: one table, one transaction a step."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Final

from raf._sessions.sqlite import SqliteSessionStore

__all__: list[str] = []

_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS raf_spend "
    "(key TEXT PRIMARY KEY, spent INTEGER NOT NULL, expires REAL NOT NULL)"
)


class SqliteSpendCounts:
    """The counts in table ``raf_spend`` of the store's file (made on first use).

    Each step is one ``BEGIN IMMEDIATE`` transaction, so it is atomic across
    every process that shares the file.
    """

    def __init__(self, store: SqliteSessionStore) -> None:
        self.store = store

    async def reserve(
        self, keys: Sequence[str], limits: Sequence[int], amount: int, expires: Sequence[float]
    ) -> list[int] | None:
        now = time.time()

        def reserve(db: sqlite3.Connection) -> list[int] | None:
            db.execute("BEGIN IMMEDIATE")
            held = _held(db, keys, now)
            if any(h + amount > limit for h, limit in zip(held, limits, strict=True)):
                db.rollback()
                return held
            _write(db, keys, [h + amount for h in held], expires)
            self.store.commit(db)
            return None

        return await self.store.with_connection(reserve)

    async def settle(self, keys: Sequence[str], delta: int, expires: Sequence[float]) -> None:
        now = time.time()

        def settle(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            held = _held(db, keys, now)
            _write(db, keys, [max(0, h + delta) for h in held], expires)
            self.store.commit(db)

        await self.store.with_connection(settle)

    async def aclose(self) -> None:
        """The store is its owner's to close."""


def _held(db: sqlite3.Connection, keys: Sequence[str], now: float) -> list[int]:
    db.execute(_TABLE)
    db.execute("DELETE FROM raf_spend WHERE expires <= ?", (now,))  # windows that ended
    rows = dict(
        db.execute(
            f"SELECT key, spent FROM raf_spend WHERE key IN ({','.join('?' * len(keys))})",
            tuple(keys),
        ).fetchall()
    )
    return [int(rows.get(key, 0)) for key in keys]


def _write(
    db: sqlite3.Connection, keys: Sequence[str], spent: Sequence[int], expires: Sequence[float]
) -> None:
    db.executemany(
        "INSERT INTO raf_spend (key, spent, expires) VALUES (?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET spent = excluded.spent, expires = excluded.expires",
        list(zip(keys, spent, expires, strict=True)),
    )
