"""The SQLite store's record of a session's last model call (table ``raf_last_calls``).

One row per session: the time of its last model call and the starts of its
bounded views (:class:`raf._sessions.cold.LastModelCall`, as JSON). The table
is created on first write, so files made before it are read as they are.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Final

from raf._sessions.cold import LastModelCall
from raf.errors import SessionStoreError

__all__: list[str] = []

_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS raf_last_calls (session_id TEXT PRIMARY KEY, record TEXT NOT NULL)"
)


def read_last_call(db: sqlite3.Connection, session_id: str, path: str) -> LastModelCall | None:
    """The session's record, or ``None`` (none written, or no table yet)."""
    found = db.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'raf_last_calls'"
    ).fetchone()
    if not found:
        return None
    row = db.execute(
        "SELECT record FROM raf_last_calls WHERE session_id = ?", (session_id,)
    ).fetchone()
    return None if row is None else _decoded(row[0], session_id, path)


def write_last_call(
    db: sqlite3.Connection, session_id: str, at: float, cuts: Mapping[str, int], path: str
) -> None:
    """Record ``at`` and ``cuts`` over the session's record, in one write transaction."""
    db.execute("BEGIN IMMEDIATE")
    db.execute(_TABLE)
    last = read_last_call(db, session_id, path)
    record = LastModelCall(at, dict(cuts)) if last is None else last.merged(at, cuts)
    db.execute(
        "INSERT INTO raf_last_calls (session_id, record) VALUES (?, ?) "
        "ON CONFLICT (session_id) DO UPDATE SET record = excluded.record",
        (session_id, record.to_json()),
    )


def _decoded(text: object, session_id: str, path: str) -> LastModelCall:
    try:
        if type(text) is not str:
            raise TypeError(type(text).__name__)
        return LastModelCall.from_json(text)
    except (TypeError, ValueError, KeyError) as exc:
        raise SessionStoreError(
            f"session store {path}: the last-model-call row of session {session_id!r} "
            f"is not raf's ({exc})"
        ) from None
