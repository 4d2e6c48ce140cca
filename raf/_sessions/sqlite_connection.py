"""One SQLite connection used from worker threads, one call at a time, bounded and cancellable.

Calls queue for the connection in their event loop on a ``CapacityLimiter(1)``
(``anyio.to_thread.run_sync(..., limiter=...)``), so a queue of writes holds no
threads and a queued call can be cancelled. A cancelled caller stops waiting
for its thread at once (``abandon_on_cancel``); that thread keeps a
``threading.Lock`` until it really ends and rolls its write back, so the next
call's thread waits for it, boundedly.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from raf._sessions.sqlite_file import _BUSY, _CORRUPT, _NOTADB, _READONLY, _code, _open
from raf.errors import SessionStoreError

__all__: list[str] = []

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


class SqliteConnection:
    """The connection of a :class:`raf.SqliteSessionStore`, and how work reaches it."""

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
        # Per event loop: a limiter belongs to the loop it was first used in.
        self._limiter: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
            f"raf._sessions.sqlite.limiter.{id(self)}"
        )
        self._connection: sqlite3.Connection | None = None
        self._current: _Call | None = None  # the call whose thread holds self._lock
        self._closed = False
        self._broken: str | None = None  # set once the file is known to be corrupt

    async def with_connection(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``work(connection)`` in a worker thread, with the store's connection to itself.

        Sessions use it for every database call; it opens the file on first
        use. ``work`` must only read, or be one transaction that ends with
        :meth:`commit`: when another connection holds the write lock, it is
        rolled back and run again, until the caller's deadline or the store's
        ``timeout``.
        """
        try:
            limiter = self._limiter.get()
        except LookupError:
            limiter = anyio.CapacityLimiter(1)
            self._limiter.set(limiter)
        left = anyio.current_effective_deadline() - anyio.current_time()
        call = _Call(work, time.monotonic() + min(left, self.timeout))
        try:
            result: T = await anyio.to_thread.run_sync(
                self._in_thread, call, abandon_on_cancel=True, limiter=limiter
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
