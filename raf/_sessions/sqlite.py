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
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from raf._errors import SessionStoreError
from raf._sessions.base import (
    CHECKED_SESSION_TYPES,
    REQUEST_HASH_LIMIT,
    RequestHash,
    checked_batch,
    checked_count,
    checked_session_id,
    request_hash,
)
from raf._sessions.once import sqlite_add_once
from raf._sessions.sqlite_file import _BUSY, _CORRUPT, _NOTADB, _READONLY, _code, _open
from raf._sessions.sqlite_pending import SqlitePending
from raf._values.messages import ChatMessage, PendingCall

__all__ = ["SqliteSessionStore"]

T = TypeVar("T")

#: How long a worker thread waits for the store's connection between two such checks.
_LOCK_SLICE: Final = 0.05


class _Abandoned(Exception):
    """The caller stopped waiting before its work started or committed; nobody sees this."""


class _Call:
    """One piece of work handed to a worker thread, with its caller's bound."""

    __slots__ = ("abandoned", "deadline", "work")

    def __init__(self, work: Callable[[sqlite3.Connection], Any], deadline: float) -> None:
        self.work = work
        self.deadline = deadline  # time.monotonic() based; inf when unbounded
        self.abandoned = False  # set by the caller when it stops waiting (a bool write is atomic)

    def expired(self) -> bool:
        return self.abandoned or time.monotonic() >= self.deadline


class SqliteSessionStore:
    """Sessions that outlive the process, in one SQLite file.

    ``await store.get(session_id)`` returns the :class:`raf.Session` with
    that id (a session is stored with its first write; getting one writes
    nothing). Every database call runs in a worker thread
    (``anyio.to_thread``), so the store works on asyncio and trio and never
    blocks the event loop. Calls queue for the store's one connection in the
    event loop, not in threads, so a queue of writes holds no threads and a
    queued call can be cancelled; a cancelled call returns at once, and a
    write whose caller has left is rolled back, not committed. The file
    is in WAL mode, so readers in other processes do not block it. Several
    processes may share a file: each write is one transaction, and a session
    picks up messages another process appended.

    ``timeout`` bounds how long a call waits for another connection's write
    lock (and never beyond the caller's own deadline, such as a post stage's
    ``post_timeout``). ``read_only=True`` opens an existing file for reading
    only (SQLite enforces it; the file is never created or changed); a file
    that cannot be written is also opened for reading on its own, and
    writes then raise :class:`raf.SessionStoreError`.

    A file that is not a SQLite database, a database raf did not create, or
    a corrupt one (checked with ``PRAGMA quick_check`` on open and on every
    ``SQLITE_CORRUPT``) raises :class:`raf.SessionStoreError` naming
    the file; it is never replaced. Close the store with
    ``await store.aclose()`` or ``async with``.

    >>> import anyio
    >>> async def demo():
    ...     async with SqliteSessionStore(":memory:") as store:
    ...         session = await store.get("alice")
    ...         await session.add_messages([ChatMessage.user("hi")])
    ...         return [m.content for m in await session.get_messages()]
    >>> anyio.run(demo)
    ['hi']
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 30.0, read_only: bool = False
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.path = path if path == ":memory:" else Path(path)
        self.timeout = timeout
        self.read_only = read_only
        # Held by the worker thread that uses the connection, until that thread really ends
        # (a cancelled caller stops waiting for its thread; the thread keeps the lock).
        self._lock = threading.Lock()
        # Callers queue here, in their event loop, before they take a thread. Per loop:
        # an anyio lock belongs to the event loop it was first used in.
        self._gate: anyio.lowlevel.RunVar[anyio.Lock] = anyio.lowlevel.RunVar(
            f"raf._sessions.sqlite.gate.{id(self)}"
        )
        self._connection: sqlite3.Connection | None = None
        self._current: _Call | None = None  # the call whose thread holds self._lock
        self._closed = False
        self._broken: str | None = None  # set once the file is known to be corrupt
        self._sessions: weakref.WeakValueDictionary[str, SqliteSession] = (
            weakref.WeakValueDictionary()
        )

    async def get(self, session_id: str) -> SqliteSession:
        """The session ``session_id`` (opening the file on first use; nothing is written)."""
        checked_session_id(session_id)
        session = self._sessions.get(session_id)
        if session is None:
            await self.with_connection(_nothing)  # a bad file is reported here, not later
            session = self._sessions.setdefault(session_id, SqliteSession(self, session_id))
        return session

    async def session_ids(self) -> list[str]:
        """The ids of every stored session (those written to), oldest first."""
        rows = await self.with_connection(
            lambda db: db.execute("SELECT id FROM raf_sessions ORDER BY created_at, id").fetchall()
        )
        return [row[0] for row in rows]

    async def with_connection(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` in a worker thread, with the store's connection to itself.

        Sessions use it for every database call; it opens the file on first
        use. ``work`` must only read, or be one transaction that ends with
        :meth:`commit`: when another connection holds the write lock, it is
        rolled back and run again, until the caller's deadline or the store's
        ``timeout``.
        """
        try:
            gate = self._gate.get()
        except LookupError:
            gate = anyio.Lock()
            self._gate.set(gate)
        async with gate:
            left = anyio.current_effective_deadline() - anyio.current_time()
            call = _Call(work, time.monotonic() + min(left, self.timeout))
            try:
                result: T = await anyio.to_thread.run_sync(
                    self._in_thread, call, abandon_on_cancel=True
                )
            except BaseException:
                call.abandoned = True  # its thread stops waiting for locks and gives up
                raise
            return result

    def _in_thread(self, call: _Call) -> Any:
        while not self._lock.acquire(timeout=_LOCK_SLICE):
            # Only after a cancelled caller left its thread running: wait for it, boundedly.
            if call.expired():
                raise self._gave_up(call, "the store's connection")
        self._current = call
        try:
            if call.abandoned:
                raise _Abandoned
            if self._closed:
                raise SessionStoreError(f"session store {self.path}: the store is closed")
            if self._broken is not None:
                raise SessionStoreError(self._broken)
            while True:
                try:
                    if self._connection is None:
                        self._connection = _open(self.path, self.read_only)
                    return call.work(self._connection)
                except sqlite3.Error as exc:
                    db = self._connection
                    if db is not None and db.in_transaction:
                        db.rollback()
                    if _code(exc) == _BUSY:
                        if not call.expired():
                            continue  # SQLite waited one slice; ours to decide whether to go on
                        raise self._gave_up(call, "another connection's write lock") from exc
                    raise self._error(exc) from exc
                except BaseException:
                    db = self._connection
                    if db is not None and db.in_transaction:
                        db.rollback()
                    raise
        finally:
            self._current = None
            self._lock.release()

    def commit(self, db: sqlite3.Connection) -> None:
        """Commit the transaction of the current call, unless its caller stopped waiting.

        Work run by :meth:`with_connection` ends its transaction with it: a
        caller cancelled before this point finds nothing written, so a
        cancelled write has either not happened or (when the cancellation
        came while committing) happened completely.
        """
        if self._current is not None and self._current.abandoned:
            raise _Abandoned  # rolled back by _in_thread
        db.execute("COMMIT")

    def _gave_up(self, call: _Call, what: str) -> SessionStoreError:
        why = "the caller stopped waiting" if call.abandoned else "the time ran out"
        return SessionStoreError(
            f"session store {self.path}: gave up waiting for {what} ({why}; timeout={self.timeout}s"
            " or the caller's deadline, whichever comes first); nothing was written"
        )

    def _error(self, exc: sqlite3.Error) -> SessionStoreError:
        code = _code(exc)
        if code in (_CORRUPT, _NOTADB):
            self._broken = (
                f"session store {self.path}: the database file is corrupt ({exc}); the store "
                "refuses to read a possibly short history. The file is left as it is: restore it "
                "from a backup (sqlite3's .recover can salvage what is readable)"
            )
            return SessionStoreError(self._broken)
        if code == _READONLY:
            how = "opened with read_only=True" if self.read_only else "it cannot be written here"
            return SessionStoreError(f"session store {self.path} is read-only ({how}): {exc}")
        return SessionStoreError(f"session store {self.path}: {exc}")

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


class SqliteSession(SqlitePending):
    """One session of a :class:`SqliteSessionStore` (get it with ``store.get``).

    Its pending tool calls (``record_pending``, ``claim_pending``) are in
    :mod:`raf._sessions.sqlite_pending`.

    The history loaded so far is kept with the session, with the row id of
    its last message: each ``get_messages`` reads only the rows appended
    since, so a turn reads what is new, not the whole conversation, and
    messages written by another process or store still show up.
    ``get_last_messages(count)`` on a session not read yet reads only its
    newest ``count`` rows (one indexed query), and keeps them as the start
    of what it has loaded.
    """

    __slots__ = (
        "__weakref__",
        "_complete",
        "_history",
        "_id",
        "_last_seq",
        "_snapshot",
        "_store",
        "_stored",
    )

    def __init__(self, store: SqliteSessionStore, id: str) -> None:
        self._store = store
        self._id = id
        # Changed only in the worker thread holding the store's lock, and only to agree with
        # what is committed: a cancelled caller's thread may still finish and update it.
        self._history: list[ChatMessage] = []  # the newest messages, contiguous, oldest first
        self._complete = False  # whether _history starts at the session's first message
        self._snapshot: tuple[ChatMessage, ...] | None = ()  # tuple(_history) when made
        self._last_seq = 0
        self._stored = False  # whether this object has seen the session's row written

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

    async def get_last_messages(self, count: int) -> tuple[ChatMessage, ...]:
        """The newest ``count`` messages (all when fewer), oldest first, reading no older rows."""
        if checked_count(count) == 0:
            return ()
        return await self._store.with_connection(lambda db: self._tail(db, count))

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages`` in one transaction; a bad item rejects the whole call."""
        new = checked_batch(messages)
        if new:
            await self._store.with_connection(lambda db: self._append(db, new))

    async def add_messages_once(
        self, key: str, messages: Iterable[ChatMessage], pending: Iterable[PendingCall] = ()
    ) -> bool:
        """:meth:`add_messages` (with :meth:`record_pending` when ``pending`` is given), unless
        ``key`` was written before (then nothing; ``False``)."""
        return await sqlite_add_once(self, key, messages, pending)

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
        """Record the request messages' hash with the time; say whether it was there."""
        digest = request_hash(messages)
        seen_at = time.time()

        def touch(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")  # the check and the record in one write transaction
            self._ensure_row(db)
            repeated = (
                db.execute(
                    "DELETE FROM raf_request_hashes WHERE session_id = ? AND hash = ?",
                    (self._id, digest),
                ).rowcount
                > 0
            )
            # Deleted and inserted again: the newest row has the highest rowid, so rowid
            # order is the order of last use, whatever the clock did.
            db.execute(
                "INSERT INTO raf_request_hashes (session_id, hash, seen_at) VALUES (?, ?, ?)",
                (self._id, digest, seen_at),
            )
            db.execute(
                "DELETE FROM raf_request_hashes WHERE session_id = ? AND rowid NOT IN "
                "(SELECT rowid FROM raf_request_hashes WHERE session_id = ? "
                "ORDER BY rowid DESC LIMIT ?)",
                (self._id, self._id, REQUEST_HASH_LIMIT),
            )
            self._store.commit(db)
            self._stored = True
            return repeated

        return RequestHash(digest, await self._store.with_connection(touch))

    async def request_hashes(self) -> dict[str, float]:
        """The recorded digests with the time each was last seen, oldest first."""
        rows = await self._store.with_connection(
            lambda db: db.execute(
                "SELECT hash, seen_at FROM raf_request_hashes WHERE session_id = ? "
                "ORDER BY rowid DESC LIMIT ?",
                (self._id, REQUEST_HASH_LIMIT),
            ).fetchall()
        )
        recorded: dict[str, float] = {}
        for digest, seen_at in reversed(rows):
            if type(digest) is not str or type(seen_at) not in (float, int):
                raise SessionStoreError(
                    f"session store {self._store.path}: a request-hash row of session "
                    f"{self._id!r} is not raf's ({digest!r}, {seen_at!r})"
                )
            recorded[digest] = float(seen_at)
        return recorded

    def _ensure_row(self, db: sqlite3.Connection) -> None:
        # A session is stored with its first write, so that reading needs no write access.
        if not self._stored:
            db.execute(
                "INSERT OR IGNORE INTO raf_sessions (id, created_at) VALUES (?, ?)",
                (self._id, time.time()),
            )

    def _refresh(self, db: sqlite3.Connection) -> tuple[ChatMessage, ...]:
        if not self._complete:
            self._history, self._last_seq, self._complete = [], 0, True
            self._snapshot = None
        self._read_new(db)
        if self._snapshot is None:
            self._snapshot = tuple(self._history)
        return self._snapshot

    def _tail(self, db: sqlite3.Connection, count: int) -> tuple[ChatMessage, ...]:
        if self._complete or len(self._history) >= count:
            self._read_new(db)
            if self._complete and len(self._history) <= count:
                return self._refresh(db)  # the whole history: the shared snapshot
            return tuple(self._history[-count:])
        rows = db.execute(
            "SELECT seq, message FROM raf_messages WHERE session_id = ? ORDER BY seq DESC LIMIT ?",
            (self._id, count),
        ).fetchall()
        rows.reverse()
        self._history = [self._decode(seq, text) for seq, text in rows]
        self._snapshot = None
        self._complete = len(rows) < count
        self._last_seq = rows[-1][0] if rows else 0
        return tuple(self._history)

    def _read_new(self, db: sqlite3.Connection) -> None:
        rows = db.execute(
            "SELECT seq, message FROM raf_messages WHERE session_id = ? AND seq > ? ORDER BY seq",
            (self._id, self._last_seq),
        ).fetchall()
        if rows:
            self._history += [self._decode(seq, text) for seq, text in rows]
            self._snapshot = None
            self._last_seq = rows[-1][0]

    def _append(self, db: sqlite3.Connection, messages: tuple[ChatMessage, ...]) -> None:
        encoded = [(self._id, _encode(message)) for message in messages]  # off the event loop
        db.execute("BEGIN IMMEDIATE")
        self._ensure_row(db)
        (newest,) = db.execute(
            "SELECT coalesce(max(seq), 0) FROM raf_messages WHERE session_id = ?", (self._id,)
        ).fetchone()
        db.executemany("INSERT INTO raf_messages (session_id, message) VALUES (?, ?)", encoded)
        (last,) = db.execute("SELECT last_insert_rowid()").fetchone()
        self._store.commit(db)
        self._stored = True
        if newest == self._last_seq:
            # Nobody else appended since our last read: extend the cache without reading back.
            # (An empty session read nothing yet: the cache is then its whole history.)
            self._complete = self._complete or newest == 0
            self._history += messages
            self._snapshot = None
            self._last_seq = last

    def _decode(self, seq: int, text: object) -> ChatMessage:
        where = f"session store {self._store.path}: message row {seq} of session {self._id!r}"
        if type(text) is not str:
            raise SessionStoreError(f"{where} is not text but {type(text).__name__}")
        try:
            data = json.loads(text)
        except RecursionError:
            raise SessionStoreError(f"{where} is JSON nested too deeply to read") from None
        except ValueError as exc:
            raise SessionStoreError(f"{where} is not JSON: {exc}") from exc
        if type(data) is not dict:
            raise SessionStoreError(
                f"{where} is not a stored ChatMessage: a JSON {type(data).__name__}, not an object"
            )
        try:
            return ChatMessage.from_dict(data)
        except RecursionError:
            raise SessionStoreError(f"{where} is nested too deeply to read") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SessionStoreError(
                f"{where} is not a stored ChatMessage: {type(exc).__name__}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"SqliteSession(id={self._id!r}, store={str(self._store.path)!r})"


CHECKED_SESSION_TYPES.add(SqliteSession)


def _nothing(db: sqlite3.Connection) -> None:
    return None


def _encode(message: ChatMessage) -> str:
    return json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":"))
