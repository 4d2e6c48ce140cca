"""The pending tool calls of a SQLite session: recorded with their turn, claimed once.

A table of its own, ``raf_pending`` (created on first use, so files made
before it are read as they are): one row per call that waits for approval.
Each operation is one write transaction (``BEGIN IMMEDIATE``), so a claim is
atomic across every connection and process that shares the file: of two
claims of one token, one finds the row and the other finds it gone.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from raf._errors import SessionStoreError
from raf._sessions.base import Claimed, checked_pending, checked_tokens
from raf._values.messages import ChatMessage, PendingCall

if TYPE_CHECKING:
    from raf._sessions.sqlite import SqliteSessionStore

__all__: list[str] = []

_TABLE: Final = """
CREATE TABLE IF NOT EXISTS raf_pending (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    token TEXT NOT NULL,
    call TEXT NOT NULL,
    UNIQUE (session_id, token)
)
"""


class SqlitePending:
    """``record_pending`` and ``claim_pending`` of :class:`raf.SqliteSessionStore` sessions."""

    __slots__ = ()

    _store: SqliteSessionStore
    _id: str

    def _ensure_row(self, db: sqlite3.Connection) -> None: ...  # pragma: no cover

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None:
        """Append ``messages`` and record ``pending`` in one transaction."""
        batch, calls = checked_pending(messages, pending)
        if batch or calls:
            await self._store.with_connection(lambda db: self._pending_record(db, batch, calls))

    async def claim_pending(self, tokens: Sequence[str] | None) -> Claimed | None:
        """Remove and return the pending calls of ``tokens``, all of them or none (``None``)."""
        wanted = checked_tokens(tokens)
        return await self._store.with_connection(lambda db: self._pending_claim(db, wanted))

    def _pending_record(
        self,
        db: sqlite3.Connection,
        messages: tuple[ChatMessage, ...],
        calls: tuple[PendingCall, ...],
    ) -> None:
        rows = [(self._id, _encode(m.to_dict())) for m in messages]
        pending = [(self._id, call.token, _encode(call.to_dict())) for call in calls]
        db.execute("BEGIN IMMEDIATE")
        db.execute(_TABLE)
        self._ensure_row(db)
        # The session's own read path picks these rows up by their seq, as any append.
        db.executemany("INSERT INTO raf_messages (session_id, message) VALUES (?, ?)", rows)
        db.executemany(
            "INSERT OR REPLACE INTO raf_pending (session_id, token, call) VALUES (?, ?, ?)",
            pending,
        )
        self._store.commit(db)

    def _pending_claim(
        self, db: sqlite3.Connection, tokens: tuple[str, ...] | None
    ) -> Claimed | None:
        if tokens == ():  # a look, not a claim: no write lock, and no table is no call
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'raf_pending'"
            ).fetchone()
            return ((), self._pending_rows(db)) if found else ((), ())
        db.execute("BEGIN IMMEDIATE")
        db.execute(_TABLE)
        waiting = self._pending_rows(db)
        if tokens is None:
            claimed = waiting
        else:
            by_token = {call.token: call for call in waiting}
            if len(set(tokens)) != len(tokens) or not all(t in by_token for t in tokens):
                db.rollback()
                return None
            claimed = tuple(by_token[token] for token in tokens)
        db.executemany(
            "DELETE FROM raf_pending WHERE session_id = ? AND token = ?",
            [(self._id, call.token) for call in claimed],
        )
        self._store.commit(db)
        taken = {call.token for call in claimed}
        return claimed, tuple(call for call in waiting if call.token not in taken)

    def _pending_rows(self, db: sqlite3.Connection) -> tuple[PendingCall, ...]:
        rows = db.execute(
            "SELECT seq, call FROM raf_pending WHERE session_id = ? ORDER BY seq", (self._id,)
        ).fetchall()
        return tuple(self._pending_decode(seq, text) for seq, text in rows)

    def _pending_decode(self, seq: int, text: Any) -> PendingCall:
        try:
            return PendingCall.from_dict(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SessionStoreError(
                f"session store {self._store.path}: pending row {seq} of session {self._id!r} "
                f"is not a stored PendingCall ({type(exc).__name__}: {exc})"
            ) from exc


def _encode(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
