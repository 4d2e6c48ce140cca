"""SqliteSessionStore: durable sessions in one SQLite file (stdlib sqlite3, WAL)."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, TypeVar

import anyio.to_thread

from raf.errors import SessionStoreError
from raf.messages import ChatMessage, checked_messages
from raf.sessions.base import RequestHash, request_hash

__all__ = ["SqliteSession", "SqliteSessionStore"]

T = TypeVar("T")

#: Written to ``raf_meta`` when a store is created; a file without it is not ours.
SCHEMA: Final = "raf.sessions/1"

_TABLES: Final = "SELECT name FROM sqlite_master WHERE type = 'table'"
_CREATE: Final = """
CREATE TABLE raf_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE raf_sessions (id TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE raf_messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX raf_messages_by_session ON raf_messages (session_id, seq);
CREATE TABLE raf_request_hashes (
    session_id TEXT NOT NULL,
    hash TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (session_id, hash)
);
"""


class SqliteSessionStore:
    """Sessions that outlive the process, in one SQLite file.

    ``await store.get(session_id)`` returns the :class:`raf.Session` with
    that id, creating it on first use. Every database call runs in a worker
    thread (``anyio.to_thread``), so the store works on asyncio and trio and
    never blocks the event loop; one lock serialises the store's connection,
    and the file is in WAL mode, so readers in other processes do not block
    it. Several processes may share a file: each write is one transaction,
    and a session picks up messages another process appended.

    A file that is not a SQLite database, or a database raf did not create,
    raises :class:`raf.errors.SessionStoreError` naming the file; it is never
    replaced. Close the store with ``await store.aclose()`` or ``async with``.

    >>> import anyio
    >>> async def demo():
    ...     async with SqliteSessionStore(":memory:") as store:
    ...         session = await store.get("alice")
    ...         await session.add_messages([ChatMessage.user("hi")])
    ...         return [m.content for m in await session.get_messages()]
    >>> anyio.run(demo)
    ['hi']
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 30.0) -> None:
        self.path = path if path == ":memory:" else Path(path)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._closed = False
        self._sessions: weakref.WeakValueDictionary[str, SqliteSession] = (
            weakref.WeakValueDictionary()
        )

    async def get(self, session_id: str) -> SqliteSession:
        """The session ``session_id``, created (and stored) if it does not exist yet."""
        if type(session_id) is not str or not session_id:
            raise ValueError(f"session id must be a non-empty str, got {session_id!r}")
        session = self._sessions.get(session_id)
        if session is None:
            await self.with_connection(lambda db: _create_session(db, session_id))
            session = self._sessions.setdefault(session_id, SqliteSession(self, session_id))
        return session

    async def session_ids(self) -> list[str]:
        """The ids of every stored session, oldest first."""
        rows = await self.with_connection(
            lambda db: db.execute("SELECT id FROM raf_sessions ORDER BY created_at, id").fetchall()
        )
        return [row[0] for row in rows]

    async def with_connection(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` in a worker thread, holding the store's lock.

        Sessions use it for every database call; it opens the file on first use.
        """
        return await anyio.to_thread.run_sync(self._locked, work)

    def _locked(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            if self._closed:
                raise SessionStoreError(f"session store {self.path}: the store is closed")
            if self._connection is None:
                self._connection = _open(self.path, self.timeout)
            try:
                return work(self._connection)
            except sqlite3.Error as exc:
                if self._connection.in_transaction:
                    self._connection.rollback()
                raise SessionStoreError(f"session store {self.path}: {exc}") from exc

    async def aclose(self) -> None:
        """Close the database connection; the store cannot be used afterwards."""
        await anyio.to_thread.run_sync(self.close)

    def close(self) -> None:
        """Close the database connection (blocking; prefer :meth:`aclose` in async code)."""
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    async def __aenter__(self) -> SqliteSessionStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"SqliteSessionStore({str(self.path)!r})"


class SqliteSession:
    """One session of a :class:`SqliteSessionStore` (get it with ``store.get``).

    The history loaded so far is kept with the session, with the row id of
    its last message: each ``get_messages`` reads only the rows appended
    since, so a turn costs what is new, not the size of the conversation, and
    messages written by another process or store still show up.
    """

    __slots__ = ("__weakref__", "_history", "_id", "_last_seq", "_store")

    def __init__(self, store: SqliteSessionStore, id: str) -> None:
        self._store = store
        self._id = id
        # What was read or written so far: a turn reads only the rows after it.
        self._history: tuple[ChatMessage, ...] = ()
        self._last_seq = 0

    @property
    def id(self) -> str:
        """The session's id."""
        return self._id

    @property
    def store(self) -> SqliteSessionStore:
        """The store the session lives in."""
        return self._store

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        """The history, oldest first."""
        return await self._store.with_connection(self._refresh)

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages`` in one transaction; a bad item rejects the whole call."""
        new = checked_messages(messages, "add_messages(messages)")
        if new:
            await self._store.with_connection(lambda db: self._append(db, new))

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
        """Record the request messages' hash with the time; say whether it had been seen."""
        digest = request_hash(messages)
        seen_at = time.time()

        def touch(db: sqlite3.Connection) -> bool:
            with db:
                seen = db.execute(
                    "SELECT 1 FROM raf_request_hashes WHERE session_id = ? AND hash = ?",
                    (self._id, digest),
                ).fetchone()
                db.execute(
                    "INSERT INTO raf_request_hashes (session_id, hash, seen_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (session_id, hash) DO UPDATE SET seen_at = excluded.seen_at",
                    (self._id, digest, seen_at),
                )
            return seen is not None

        return RequestHash(digest, await self._store.with_connection(touch))

    async def request_hashes(self) -> dict[str, float]:
        """Every request hash recorded on this session, with the time it was last seen."""
        rows = await self._store.with_connection(
            lambda db: db.execute(
                "SELECT hash, seen_at FROM raf_request_hashes WHERE session_id = ?", (self._id,)
            ).fetchall()
        )
        return dict(rows)

    def _refresh(self, db: sqlite3.Connection) -> tuple[ChatMessage, ...]:
        # Runs in the worker thread, under the store's lock, like every cache update.
        rows = db.execute(
            "SELECT seq, message FROM raf_messages WHERE session_id = ? AND seq > ? ORDER BY seq",
            (self._id, self._last_seq),
        ).fetchall()
        if rows:
            self._history = (*self._history, *(self._decode(seq, text) for seq, text in rows))
            self._last_seq = rows[-1][0]
        return self._history

    def _append(self, db: sqlite3.Connection, messages: tuple[ChatMessage, ...]) -> None:
        encoded = [(self._id, _encode(message)) for message in messages]
        db.execute("BEGIN IMMEDIATE")
        try:
            (newest,) = db.execute(
                "SELECT coalesce(max(seq), 0) FROM raf_messages WHERE session_id = ?", (self._id,)
            ).fetchone()
            db.executemany("INSERT INTO raf_messages (session_id, message) VALUES (?, ?)", encoded)
            (last,) = db.execute("SELECT last_insert_rowid()").fetchone()
            db.execute("COMMIT")
        except BaseException:
            db.rollback()
            raise
        if newest == self._last_seq:
            # Nobody else appended since our last read: extend the cache without reading back.
            self._history = (*self._history, *messages)
            self._last_seq = last

    def _decode(self, seq: int, text: str) -> ChatMessage:
        try:
            return ChatMessage.from_dict(json.loads(text))
        except (ValueError, TypeError, KeyError) as exc:
            raise SessionStoreError(
                f"session store {self._store.path}: message row {seq} of session "
                f"{self._id!r} is not a stored ChatMessage: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"SqliteSession(id={self._id!r}, store={str(self._store.path)!r})"


def _encode(message: ChatMessage) -> str:
    return json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":"))


def _create_session(db: sqlite3.Connection, session_id: str) -> None:
    with db:
        db.execute(
            "INSERT OR IGNORE INTO raf_sessions (id, created_at) VALUES (?, ?)",
            (session_id, time.time()),
        )


def _open(path: str | Path, timeout: float) -> sqlite3.Connection:
    """Open (or create) the store's file and check that it is a raf session store."""
    try:
        db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise SessionStoreError(f"session store {path}: cannot open the file: {exc}") from exc
    try:
        _prepare(db, path)
    except BaseException:
        db.close()
        raise
    return db


def _prepare(db: sqlite3.Connection, path: str | Path) -> None:
    try:
        tables = {row[0] for row in db.execute(_TABLES)}
        if not tables:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")
            # Another process may have created the store between our look and our lock.
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                # Not executescript: it would commit first, outside our transaction.
                for statement in _CREATE.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT INTO raf_meta (key, value) VALUES ('schema', ?)", (SCHEMA,))
            db.execute("COMMIT")
            tables = {row[0] for row in db.execute(_TABLES)}
        if "raf_meta" not in tables:
            raise SessionStoreError(
                f"session store {path}: the file is a SQLite database but not a raf session "
                f"store (tables: {', '.join(sorted(tables))}); refusing to touch it"
            )
        row = db.execute("SELECT value FROM raf_meta WHERE key = 'schema'").fetchone()
        if row is None or row[0] != SCHEMA:
            found = row[0] if row is not None else "none"
            raise SessionStoreError(
                f"session store {path}: unknown schema {found!r} (this raf reads {SCHEMA!r})"
            )
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.Error as exc:
        raise SessionStoreError(
            f"session store {path}: not a usable SQLite database ({exc}); "
            "check the path, the file is left as it is"
        ) from exc
