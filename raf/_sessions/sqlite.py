"""SqliteSessionStore: durable sessions in one SQLite file (stdlib sqlite3, WAL).

Each session keeps its history, its request hashes, its pending tool calls
(table ``raf_pending``) and the keys of its once-only writes (table
``raf_once``); the last two tables are created on first use, so files made
before them are read as they are. Every write is one ``BEGIN IMMEDIATE``
transaction, so a claim is atomic across every process that shares the
file: of two claims of one token, one finds the row and the other finds it gone.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Final

from raf._sessions.base import (
    REQUEST_HASH_LIMIT,
    Claimed,
    RequestHash,
    checked_batch,
    checked_call_id,
    checked_count,
    checked_key,
    checked_pending,
    checked_session_id,
    checked_spill,
    checked_tokens,
    request_hash,
)
from raf._sessions.cold import LastModelCall
from raf._sessions.fork import carry_spilled, checked_fork, first_turns
from raf._sessions.sqlite_connection import SqliteConnection
from raf._sessions.sqlite_fork import write_fork
from raf._sessions.sqlite_last_call import read_last_call, write_last_call
from raf._sessions.sqlite_spill import read_spilled, write_spilled
from raf._values.messages import ChatMessage, PendingCall
from raf.errors import SessionStoreError

__all__ = ["SqliteSessionStore"]

_PENDING: Final = """
CREATE TABLE IF NOT EXISTS raf_pending (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    token TEXT NOT NULL,
    call TEXT NOT NULL,
    UNIQUE (session_id, token)
)
"""
_ONCE: Final = (
    "CREATE TABLE IF NOT EXISTS raf_once "
    "(session_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (session_id, key))"
)


class SqliteSessionStore(SqliteConnection):
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
    writes then raise :class:`raf.errors.SessionStoreError`.

    A file that is not a SQLite database, a database raf did not create, or
    a corrupt one (checked with ``PRAGMA quick_check`` on open and on every
    ``SQLITE_CORRUPT``) raises :class:`raf.errors.SessionStoreError` naming
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
        super().__init__(path, timeout=timeout, read_only=read_only)
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

    async def fork(self, session_id: str, new_id: str, *, at: int | None = None) -> SqliteSession:
        """Copy the first ``at`` turns of ``session_id`` (all without ``at``) into the new
        session ``new_id`` and return it; calls waiting for approval are not carried.

        ``at`` below 0 or past the last turn, or a session that holds no
        messages, is a ``ValueError``; a ``new_id`` that holds messages is a
        :class:`raf.errors.SessionExistsError`. The check and the copy are one
        ``BEGIN IMMEDIATE`` transaction: of two forks into one id, across
        processes, one writes and the other is refused.
        """
        at = checked_fork(session_id, new_id, at)
        original = await self.get(session_id)
        copied = first_turns(await original.get_messages(), session_id, at)
        await self.with_connection(lambda db: write_fork(self, db, new_id, copied))
        target = await self.get(new_id)
        await carry_spilled(original, target, copied)
        return target

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
    since, so a turn reads what is new, not the whole conversation, and
    messages written by another process or store still show up.
    ``get_last_messages(count)`` on a session not read yet reads only its
    newest ``count`` rows (one indexed query), and keeps them as the start
    of what it has loaded.
    """

    __slots__ = (
        "__weakref__",
        "_before",
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
        self._before: int | None = None  # how many stored messages come before _history
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

    async def count_messages(self) -> int:
        """How many messages the session holds.

        Counted once per session object (an indexed count, some 12 ms over
        100,000 rows); after that, from what the object reads and writes.
        """
        return await self._store.with_connection(self._count)

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages`` in one transaction; a bad item rejects the whole call."""
        new = checked_batch(messages)
        if new:
            await self._store.with_connection(lambda db: self._append(db, new))

    async def add_once(
        self, key: str, messages: Iterable[ChatMessage], pending: Iterable[PendingCall] = ()
    ) -> bool:
        """:meth:`record_pending`, unless ``key`` was written to this session before (then
        nothing; ``False``): the key, the messages and the calls in one transaction."""
        key = checked_key(key)
        new, calls = checked_pending(messages, pending)

        def append(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            db.execute(_ONCE)
            if not db.execute(
                "INSERT OR IGNORE INTO raf_once (session_id, key) VALUES (?, ?)", (self._id, key)
            ).rowcount:
                db.rollback()
                return False
            self._write_pending(db, new, calls)
            return True

        return await self._store.with_connection(append)

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None:
        """Append ``messages`` and record ``pending`` in one transaction."""
        new, calls = checked_pending(messages, pending)
        if new or calls:

            def record(db: sqlite3.Connection) -> None:
                db.execute("BEGIN IMMEDIATE")
                self._write_pending(db, new, calls)

            await self._store.with_connection(record)

    async def list_pending(self) -> tuple[PendingCall, ...]:
        """The calls that wait for approval, in the order recorded (a read: no write lock)."""

        def look(db: sqlite3.Connection) -> tuple[PendingCall, ...]:
            found = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'raf_pending'"
            ).fetchone()
            return self._pending_rows(db) if found else ()

        return await self._store.with_connection(look)

    async def claim_pending(self, tokens: Sequence[str]) -> Claimed | None:
        """Remove and return the pending calls of ``tokens``, all of them or none (``None``)."""
        wanted = checked_tokens(tokens)
        return await self._store.with_connection(lambda db: self._claim(db, wanted))

    async def claim_all_pending(self) -> tuple[PendingCall, ...]:
        """Remove and return every pending call."""
        claimed = await self._store.with_connection(lambda db: self._claim(db, None))
        return claimed[0] if claimed is not None else ()

    async def spill_tool_result(self, call_id: str, text: str) -> None:
        """Keep the full result of tool call ``call_id`` (table ``raf_spilled``)."""
        call_id, text = checked_spill(call_id, text)
        commit = self._store.commit
        await self._store.with_connection(
            lambda db: write_spilled(db, self._id, call_id, text, commit)
        )

    async def spilled_tool_result(self, call_id: str) -> str | None:
        """The full result kept for ``call_id``, or ``None`` when none is kept."""
        call_id, where = checked_call_id(call_id), f"session store {self._store.path}"
        return await self._store.with_connection(
            lambda db: read_spilled(db, self._id, call_id, where)
        )

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

    async def last_model_call(self) -> LastModelCall | None:
        """When the session's last model call ended, and where its bounded views began."""
        path = str(self._store.path)
        return await self._store.with_connection(lambda db: read_last_call(db, self._id, path))

    async def record_model_call(self, at: float, cuts: Mapping[str, int]) -> None:
        """Record ``at`` as the last model call's time, ``cuts`` over the kept ones."""
        path = str(self._store.path)

        def write(db: sqlite3.Connection) -> None:
            write_last_call(db, self._id, at, cuts, path)
            self._store.commit(db)

        await self._store.with_connection(write)

    def _ensure_row(self, db: sqlite3.Connection) -> None:
        # A session is stored with its first write, so that reading needs no write access.
        if not self._stored:
            db.execute(
                "INSERT OR IGNORE INTO raf_sessions (id, created_at) VALUES (?, ?)",
                (self._id, time.time()),
            )

    def _refresh(self, db: sqlite3.Connection) -> tuple[ChatMessage, ...]:
        if not self._complete:
            self._history, self._last_seq, self._complete, self._before = [], 0, True, 0
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
        self._before = 0 if self._complete else None
        self._last_seq = rows[-1][0] if rows else 0
        return tuple(self._history)

    def _count(self, db: sqlite3.Connection) -> int:
        if not self._history and not self._complete:  # nothing read yet: count, keep nothing
            (stored,) = db.execute(
                "SELECT count(*) FROM raf_messages WHERE session_id = ?", (self._id,)
            ).fetchone()
            return int(stored)
        self._read_new(db)
        if self._complete:
            self._before = 0
        if self._before is None:
            (stored,) = db.execute(
                "SELECT count(*) FROM raf_messages WHERE session_id = ? AND seq <= ?",
                (self._id, self._last_seq),
            ).fetchone()
            self._before = stored - len(self._history)
        return self._before + len(self._history)

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

    def _write_pending(
        self,
        db: sqlite3.Connection,
        messages: tuple[ChatMessage, ...],
        calls: tuple[PendingCall, ...],
    ) -> None:
        """Within a write transaction: append ``messages``, record ``calls``, commit."""
        self._ensure_row(db)
        # The session's own read path picks these rows up by their seq, as any append.
        db.executemany(
            "INSERT INTO raf_messages (session_id, message) VALUES (?, ?)",
            [(self._id, _encode(m)) for m in messages],
        )
        if calls:
            db.execute(_PENDING)
            db.executemany(
                "INSERT OR REPLACE INTO raf_pending (session_id, token, call) VALUES (?, ?, ?)",
                [(self._id, call.token, _json(call.to_dict())) for call in calls],
            )
        self._store.commit(db)
        self._stored = True

    def _claim(self, db: sqlite3.Connection, tokens: tuple[str, ...] | None) -> Claimed | None:
        db.execute("BEGIN IMMEDIATE")
        db.execute(_PENDING)
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

    def __repr__(self) -> str:
        return f"SqliteSession(id={self._id!r}, store={str(self._store.path)!r})"


def _nothing(db: sqlite3.Connection) -> None:
    return None


def _encode(message: ChatMessage) -> str:
    return _json(message.to_dict())


def _json(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
