"""The spilled tool results of a SQLite session: the table ``raf_spilled``, written and read.

:class:`raf.ToolOutputLimit` keeps the full text of a result it cut with the
session; here it is one row per call, created on first use (files made
before the table are read as they are: nothing was spilled in them).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Final

from raf.errors import SessionStoreError

__all__: list[str] = []

_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS raf_spilled (session_id TEXT NOT NULL, call_id TEXT NOT NULL, "
    "result TEXT NOT NULL, PRIMARY KEY (session_id, call_id))"
)


def write_spilled(
    db: sqlite3.Connection,
    session_id: str,
    call_id: str,
    text: str,
    commit: Callable[[sqlite3.Connection], None],
) -> None:
    """Keep ``text`` as the full result of ``call_id`` (replacing one kept before), in one
    write transaction that also stores the session, when this is its first write."""
    db.execute("BEGIN IMMEDIATE")
    db.execute(_TABLE)
    db.execute(
        "INSERT OR IGNORE INTO raf_sessions (id, created_at) VALUES (?, ?)",
        (session_id, time.time()),
    )
    db.execute(
        "INSERT OR REPLACE INTO raf_spilled (session_id, call_id, result) VALUES (?, ?, ?)",
        (session_id, call_id, text),
    )
    commit(db)


def read_spilled(db: sqlite3.Connection, session_id: str, call_id: str, where: str) -> str | None:
    """The full result kept for ``call_id``, or ``None`` (a read: no write lock)."""
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'raf_spilled'"
    ).fetchone()
    if not found:
        return None
    row = db.execute(
        "SELECT result FROM raf_spilled WHERE session_id = ? AND call_id = ?",
        (session_id, call_id),
    ).fetchone()
    if row is None:
        return None
    if type(row[0]) is not str:
        raise SessionStoreError(
            f"{where}: the spilled result of call {call_id!r} of session {session_id!r} "
            f"is not text but {type(row[0]).__name__}"
        )
    return row[0]
