"""The PostgreSQL connections of a session store: each call in a worker thread, within a timeout.

psycopg 3's synchronous connections, borrowed for one call at a time and kept
idle in between (at most ``max_connections`` in use, waited for in the event
loop through an anyio ``CapacityLimiter``, never in a thread). A call that
outlives the store's ``timeout``, or whose caller is cancelled, is left: its
connection's socket is shut down, which wakes the worker thread at once (and
makes the server roll back what was not committed), and the connection is
closed, never reused. psycopg's own async connections run on asyncio only.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import selectors
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final, NoReturn, Self, TypeVar, cast

import anyio
import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.pq import TransactionStatus

from raf.errors import SessionStoreError

__all__: list[str] = []

T = TypeVar("T")

#: Seconds a call waits for the server by default (connecting included).
DEFAULT_TIMEOUT: Final = 10.0
#: Connections a store holds at most (and calls it runs at once).
MAX_CONNECTIONS: Final = 10
#: The longest ``ttl``: PostgreSQL's timestamps end in the year 294276 (``None``: no expiry).
MAX_TTL: Final = 3_155_760_000
_PREFIX: Final = re.compile(r"[a-z_][a-z0-9_]{0,39}")


class Left(Exception):
    """Raised in a worker thread whose caller has gone: its transaction is rolled back."""


class Undo(Exception):
    """Raised by a write to roll its transaction back and return ``value``."""

    def __init__(self, value: object) -> None:
        super().__init__("undo")
        self.value = value


class _Failed(Exception):
    """A worker thread's failure, told to the event loop: ``kind`` says which."""

    def __init__(self, kind: str, exc: BaseException) -> None:
        super().__init__(kind)
        self.kind = kind
        self.exc = exc


class _Borrow:
    """One call's hold of a connection, shared by its worker thread and its caller."""

    __slots__ = ("abandoned", "conn", "connecting", "lock", "started")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.started = False  # False while the call waits for one of the store's connections
        self.connecting = True
        self.abandoned = False

    def abandon(self) -> None:
        """The caller has gone: wake the thread if it waits on the server."""
        with self.lock:  # the thread closes the connection only under this lock
            self.abandoned = True
            if self.conn is not None:
                _shut_down(self.conn)


def _quiet(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether an idle connection has nothing to read: else the server has ended it (a
    restart says goodbye, a killed server's kernel ends the stream), and a call on it fails."""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(conn.pgconn.socket, selectors.EVENT_READ)
            return not selector.select(0)
    except (OSError, ValueError, psycopg.Error):
        return False


def _shut_down(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    # Shut down, not closed: libpq keeps its descriptor (it closes it itself), and a
    # thread blocked on the socket wakes with an error instead of waiting for the server.
    try:
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, psycopg.Error):
        pass


class PostgresConnection:
    """A :class:`raf.PostgresSessionStore`'s connections: open, run a call, say what failed."""

    def __init__(
        self,
        dsn: str,
        *,
        prefix: str = "raf",
        ttl: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        name = "PostgresSessionStore"
        if type(dsn) is not str:
            raise ValueError(f"{name}: dsn must be a str, got {type(dsn).__name__}")
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            # libpq quotes the part it could not parse, which may be the password: not shown.
            problem = re.sub(r'"[^"]*"', '"..."', str(exc)).strip()
            raise ValueError(
                f"{name}: dsn is not a PostgreSQL connection string: {problem}"
            ) from None
        if type(prefix) is not str or not _PREFIX.fullmatch(prefix):
            raise ValueError(
                f"{name}: prefix must be 1 to 40 of a-z, 0-9 and _ (not first a digit), "
                f"got {prefix!r}"
            )
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL
        ):
            raise ValueError(
                f"{name}: ttl must be None or > 0 seconds, at most {MAX_TTL} (100 years), "
                f"got {ttl!r}"
            )
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < math.inf
        ):
            raise ValueError(f"{name}: timeout must be None or > 0 seconds, got {timeout!r}")
        if type(max_connections) is not int or max_connections < 1:
            raise ValueError(
                f"{name}: max_connections must be an int >= 1, got {max_connections!r}"
            )
        self.dsn = dsn
        self.prefix = prefix
        self.ttl = ttl
        self.timeout = timeout
        self.max_connections = max_connections
        self.where = f"PostgreSQL session store {redacted(dsn)}"
        self._connect_options: dict[str, object] = {"autocommit": True}
        if timeout is not None and "connect_timeout" not in params:
            # libpq's bound on connecting: ends a thread that connects to a frozen server
            # (the caller has its error at ``timeout`` already).
            self._connect_options["connect_timeout"] = max(2, math.ceil(timeout))
        self._idle: list[psycopg.Connection[tuple[object, ...]]] = []
        self._idle_lock = threading.Lock()
        self._limiter: anyio.CapacityLimiter | None = None
        self._opening: anyio.Event | None = None
        self._opened = False
        self._closed = False

    async def open(self) -> Self:
        """Connect, and create the tables under ``prefix`` when they are missing."""
        while not self._opened:
            if self._closed:
                raise SessionStoreError(f"{self.where}: the store is closed")
            if self._opening is not None:  # another task opens it: wait, then look again
                await self._opening.wait()
                continue
            self._opening = opening = anyio.Event()
            self._limiter = anyio.CapacityLimiter(self.max_connections)
            try:
                await self.call(self.on_open, "open the store", None)
                self._opened = True
            except BaseException:
                self._limiter = None
                raise
            finally:
                self._opening = None
                opening.set()
        if self._closed:
            raise SessionStoreError(f"{self.where}: the store is closed")
        return self

    def on_open(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        """What opening runs on the first connection (the store creates its tables here)."""

    def create(self, conn: psycopg.Connection[tuple[object, ...]], statements: list[str]) -> None:
        """Run ``statements`` once, under a lock of the prefix: stores that open at the same
        moment in several processes do not race to create the same tables."""
        key = int.from_bytes(hashlib.sha256(f"raf:{self.prefix}".encode()).digest()[:8], "big")
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key - (1 << 63),))
            for statement in statements:
                conn.execute(statement.encode())

    async def aclose(self) -> None:
        """Close the connections; the store cannot be used afterwards."""
        self._closed = True
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            await anyio.to_thread.run_sync(conn.close)

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def call(
        self,
        work: Callable[[psycopg.Connection[tuple[object, ...]]], T],
        what: str,
        session_id: str | None,
        *,
        write: bool = False,
        writing: str = "",
    ) -> T:
        """``work(connection)`` in a worker thread (in one transaction if ``write``), within
        ``timeout``; every failure a :class:`raf.errors.SessionStoreError` saying what
        ``what`` met."""
        if self._closed or self._limiter is None:
            state = "closed" if self._closed else "not open: use `async with` or `await open()`"
            raise SessionStoreError(f"{self.where}: the store is {state}")
        borrow = _Borrow()
        try:
            with anyio.fail_after(self.timeout):
                return await anyio.to_thread.run_sync(
                    self._run, work, borrow, write, abandon_on_cancel=True, limiter=self._limiter
                )
        except BaseException as exc:
            borrow.abandon()  # nothing, if the thread ended
            if isinstance(exc, _Failed):
                self._fail(exc.kind, exc.exc, what, session_id, writing)
            if isinstance(exc, TimeoutError):
                kind = (
                    "busy"
                    if not borrow.started
                    else "unreachable"
                    if borrow.connecting
                    else "timeout"
                )
                self._fail(kind, exc, what, session_id, writing)
            raise

    def _run(
        self,
        work: Callable[[psycopg.Connection[tuple[object, ...]]], T],
        borrow: _Borrow,
        write: bool,
    ) -> T:
        """In the worker thread: borrow a connection, run ``work``, give the connection back."""
        borrow.started = True
        conn = self._take_idle()
        if conn is None:
            try:
                conn = psycopg.connect(self.dsn, **self._connect_options)  # type: ignore[arg-type]
            except psycopg.Error as exc:
                raise _Failed("unreachable", exc) from exc
        with borrow.lock:
            if borrow.abandoned:
                conn.close()
                raise Left
            borrow.conn, borrow.connecting = conn, False
        kept = False
        try:
            if write:
                try:
                    with conn.transaction():
                        result = work(conn)
                        if borrow.abandoned:
                            raise Left  # the caller has gone: roll back, do not commit
                except Undo as undo:
                    result = cast(T, undo.value)
            else:
                result = work(conn)
            kept = True
            return result
        except psycopg.Error as exc:
            kept = not conn.broken
            raise _Failed("broken" if conn.broken else "error", exc) from exc
        except SessionStoreError:
            kept = True
            raise
        finally:
            self._give_back(borrow, kept)

    def _take_idle(self) -> psycopg.Connection[tuple[object, ...]] | None:
        while True:
            with self._idle_lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if _quiet(conn):
                return conn
            conn.close()  # ended by the server while idle: another, or a new one

    def _give_back(self, borrow: _Borrow, kept: bool) -> None:
        with borrow.lock:
            conn, borrow.conn = borrow.conn, None
            abandoned = borrow.abandoned
            kept = kept and not abandoned
        if conn is None:
            return
        if kept and not self._closed and conn.info.transaction_status == TransactionStatus.IDLE:
            with self._idle_lock:
                self._idle.append(conn)
            return
        conn.close()
        if conn.broken and not abandoned:  # the server went away: the idle ones went with it
            with self._idle_lock:
                idle, self._idle = self._idle, []
            for other in idle:
                other.close()

    def _fail(
        self, kind: str, exc: BaseException, what: str, session_id: str | None, writing: str
    ) -> NoReturn:
        where = self.where if session_id is None else f"{self.where}, session {session_id!r}"
        outcome = f"; {writing}" if writing else ""
        if kind == "unreachable":
            problem = (
                f"it did not answer within timeout={self.timeout} s"
                if isinstance(exc, TimeoutError)
                else reason(exc)
            )
            message = f"{where}: cannot reach the server to {what}: {problem}"
        elif kind == "busy":
            message = (
                f"{where}: cannot {what}: none of the store's max_connections="
                f"{self.max_connections} came free within timeout={self.timeout} s (all busy "
                "with calls the server has not answered yet)"
            )
        elif kind == "timeout":
            message = (
                f"{where}: cannot {what}: the server did not answer within "
                f"timeout={self.timeout} s{outcome}"
            )
        elif kind == "broken":
            message = (
                f"{where}: the connection failed while trying to {what}: {reason(exc)}{outcome}"
            )
        else:
            message = f"{where}: cannot {what}: {reason(exc)}"
        raise SessionStoreError(message) from exc


def reason(exc: BaseException) -> str:
    """The exception's type and text, on one line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def redacted(dsn: str) -> str:
    """The connection string without its password, for messages and reprs.

    >>> redacted("postgresql://ann:secret@db:5432/app")
    'postgresql://ann:***@db:5432/app'
    >>> redacted("postgresql://ann:se/cret@db/app")
    'postgresql://ann:***@db/app'
    >>> redacted("host=db password='s e' dbname=app")
    'host=db password=*** dbname=app'
    """
    if "://" not in dsn:
        return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\.)+)", r"\1***", dsn)
    # user:password@ as libpq reads it: up to the last @ before the first / (# and ? too).
    shown = re.sub(r"^([^:/]+://[^:/@]*:)[^/]*@", r"\1***@", dsn)
    if shown == dsn:
        # A password holding a / (a driver, a pooler, a person reads it up to the last @):
        # hidden up to the last @ after a user: (more than the password, when in doubt).
        scheme, _, rest = dsn.partition("://")
        at = rest.rfind("@")
        user = re.match(r"[^:/@]*:", rest)
        if user is not None and at > user.end():
            shown = f"{scheme}://{rest[: user.end()]}***{rest[at:]}"
    return re.sub(r"([?&]password=)[^&]*", r"\1***", shown)
