"""Forking a session of a SqliteSessionStore: the copy of its first turns, in one transaction."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence

from raf._sessions.sqlite_connection import SqliteConnection
from raf._values.messages import ChatMessage
from raf.errors import SessionExistsError

__all__: list[str] = []


def write_fork(
    store: SqliteConnection, db: sqlite3.Connection, new_id: str, messages: Sequence[ChatMessage]
) -> None:
    """Within one ``BEGIN IMMEDIATE`` transaction (the file's write lock, across processes):
    refuse ``new_id`` when it holds messages, else store ``messages`` as its history."""
    encoded = [
        (new_id, json.dumps(m.to_dict(), ensure_ascii=False, separators=(",", ":")))
        for m in messages
    ]
    db.execute("BEGIN IMMEDIATE")
    (held,) = db.execute(
        "SELECT count(*) FROM raf_messages WHERE session_id = ?", (new_id,)
    ).fetchone()
    if held:
        db.rollback()
        raise SessionExistsError(new_id, int(held), f"session store {store.path}")
    db.execute(
        "INSERT OR IGNORE INTO raf_sessions (id, created_at) VALUES (?, ?)", (new_id, time.time())
    )
    db.executemany("INSERT INTO raf_messages (session_id, message) VALUES (?, ?)", encoded)
    store.commit(db)
