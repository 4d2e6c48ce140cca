"""PostgresSessionStore: sessions in PostgreSQL, shared by any number of processes and machines.

Needs the optional extra ``raf-agents[postgres]`` (psycopg 3). ``import raf``
does not import this module; ``raf.PostgresSessionStore`` does, on first use.

Tables, created on first use (``{p}`` is the store's ``prefix``):

- ``{p}_sessions``: one row per session: ``length`` (its messages, numbered
  1 to length), ``gen`` (a new number when the session is stored anew, after it
  expired or was deleted), ``writes`` (a counter that orders its request
  digests and pending calls), ``expires_at`` (with a ``ttl``);
- ``{p}_messages``: ``(session_id, seq)`` -> the message as raf's JSON;
- ``{p}_requests``, ``{p}_pending``, ``{p}_once``: the request digests, the
  tool calls that wait for approval, the keys of the writes done once;
- ``{p}_spilled``: the full results ``raf.ToolOutputLimit`` cut (created on the
  first, :mod:`raf._sessions.postgres_spill`).

Every write is one transaction that first updates the session's row, so the
writes of one session are serialized by its row lock, whichever process
makes them: a batch gets the next numbers, and it is committed before the
next batch of the session can be numbered. A reader therefore always sees
the messages 1 to ``length``, never a gap, and reads only those after the
last one it has.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs
import psycopg

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
from raf._sessions.postgres_connection import (
    DEFAULT_TIMEOUT,
    MAX_CONNECTIONS,
    PostgresConnection,
    Undo,
    redacted,
)
from raf._sessions.postgres_fork import write_fork
from raf._sessions.postgres_last_call import ensure_table, read_last_call, write_last_call
from raf._sessions.postgres_spill import read_spilled, write_spilled
from raf._sessions.postgres_sql import SCHEMA, STATEMENTS
from raf._values.messages import ChatMessage, PendingCall
from raf.errors import SessionStoreError

__all__ = ["PostgresSessionStore"]

#: How many messages a store keeps decoded, across its sessions (as the Redis store).
CACHE_MESSAGES: Final = 200_000
#: Seconds between two sweeps of the expired sessions (made by a write, with a ttl).
SWEEP_EVERY: Final = 60.0
_ALL: Final = 1 << 62  # "every message": more than any session holds

Conn = psycopg.Connection[tuple[Any, ...]]


@attrs.frozen(slots=True)
class _Cached:
    """What a store has read of one session: ``messages`` are numbers ``first`` to
    ``end - 1`` of the session stored as generation ``gen``."""

    gen: int
    first: int
    messages: tuple[ChatMessage, ...]

    @property
    def end(self) -> int:
        return self.first + len(self.messages)


class PostgresSessionStore(PostgresConnection):
    """Sessions in one PostgreSQL database, shared by every process that opens it.

    Open it with ``async with`` (or ``await store.open()``, later
    ``await store.aclose()``), then ``await store.get(session_id)``. Its
    tables, named after ``prefix``, are created on first use. ``ttl``
    (seconds) is put again on a session by every write; a session nobody
    wrote to for ``ttl`` seconds is gone (``None``: sessions never expire).

    psycopg 3's synchronous driver, each call in a worker thread: the store
    runs on asyncio and trio alike (psycopg's async driver runs on asyncio
    only). ``timeout`` (seconds, default 10; ``None``: no bound) bounds each
    call, connecting included: a server that does not answer in time is a
    :class:`raf.errors.SessionStoreError`, never a hang, and a write that timed out
    or whose caller was cancelled is rolled back, unless its commit was
    already on its way (then it is whole: never a part).
    ``max_connections`` bounds the connections (and calls at once).

    Reads are incremental: the store keeps what it decoded of each session
    (up to ``cache_messages`` messages in all, the least recently used
    sessions forgotten first) and reads only the messages after the last it
    has, in one query that also says whether the session was stored anew.
    """

    def __init__(
        self,
        dsn: str,
        *,
        prefix: str = "raf",
        ttl: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
        cache_messages: int = CACHE_MESSAGES,
    ) -> None:
        if type(cache_messages) is not int or cache_messages < 0:
            raise ValueError(
                f"PostgresSessionStore: cache_messages must be an int >= 0, got {cache_messages!r}"
            )
        super().__init__(
            dsn, prefix=prefix, ttl=ttl, timeout=timeout, max_connections=max_connections
        )
        self.cache_messages = cache_messages
        self._cache: dict[str, _Cached] = {}
        self._cached_count = 0
        self._swept = time.monotonic()
        self.sql = {name: text.replace("{p}", prefix) for name, text in STATEMENTS.items()}

    def on_open(self, conn: Conn) -> None:
        """Create the tables when missing; sweep the sessions that expired."""
        found = conn.execute("SELECT to_regclass(%s)", (f"{self.prefix}_once",)).fetchone()
        if found is None or found[0] is None:
            self.create(conn, [statement.replace("{p}", self.prefix) for statement in SCHEMA])
        ensure_table(self, conn)
        if self.ttl is not None:
            conn.execute(self.sql["sweep"].encode())

    async def get(self, session_id: str) -> PostgresSession:
        """The session ``session_id`` (opening the store on first use; nothing is written)."""
        checked_session_id(session_id)
        if "\x00" in session_id:
            raise ValueError(f"a PostgreSQL session id cannot hold NUL (\\x00): {session_id!r}")
        await self.open()
        return PostgresSession(self, session_id)

    async def session_ids(self) -> list[str]:
        """The ids of every stored session (those written to), oldest first."""
        rows = await self.call(
            lambda conn: conn.execute(self.sql["ids"].encode()).fetchall(), "list sessions", None
        )
        return [str(row[0]) for row in rows]

    async def fork(self, session_id: str, new_id: str, *, at: int | None = None) -> PostgresSession:
        """Copy the first ``at`` turns of ``session_id`` (all without ``at``) into the new session
        ``new_id`` and return it, as :meth:`raf.SqliteSessionStore.fork`; the check and the copy
        are one transaction holding the new session's row lock."""
        at = checked_fork(session_id, new_id, at)
        target = await self.get(new_id)  # checks the id as every session's
        original = await self.get(session_id)
        copied = first_turns(await original.get_messages(), session_id, at)
        await write_fork(self, self.sql, new_id, copied)
        await carry_spilled(original, target, copied)
        return target

    def __repr__(self) -> str:
        return (
            f"PostgresSessionStore({redacted(self.dsn)!r}, prefix={self.prefix!r}, "
            f"ttl={self.ttl!r}, timeout={self.timeout!r})"
        )

    def remember(self, session_id: str, cached: _Cached | None) -> None:
        """Keep ``cached`` as what was read of ``session_id``, most recently used."""
        old = self._cache.pop(session_id, None)
        if old is not None:
            self._cached_count -= len(old.messages)
        if cached is None:
            return
        self._cache[session_id] = cached
        self._cached_count += len(cached.messages)
        while self._cached_count > self.cache_messages and len(self._cache) > 1:
            forgotten = self._cache.pop(next(iter(self._cache)))
            self._cached_count -= len(forgotten.messages)

    def swept(self) -> bool:
        """Whether a write may skip the sweep of expired sessions (one ran lately)."""
        if self.ttl is None or time.monotonic() - self._swept < SWEEP_EVERY:
            return True
        self._swept = time.monotonic()
        return False


class PostgresSession:
    """One session of a :class:`PostgresSessionStore` (get it with ``store.get``).

    Every write is one transaction that locks the session's row first: of two
    claims of one pending call, one takes it and the other finds it gone.
    """

    __slots__ = ("_id", "_store")

    def __init__(self, store: PostgresSessionStore, id: str) -> None:
        self._store = store
        self._id = id

    @property
    def id(self) -> str:
        """The session's id."""
        return self._id

    @property
    def store(self) -> PostgresSessionStore:
        """The store the session lives in."""
        return self._store

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        """The history, oldest first (one query: only the messages not read before)."""
        cached = self._store._cache.get(self._id)
        return (await self._read(cached if cached and cached.first == 1 else None, _ALL)).messages

    async def get_last_messages(self, count: int) -> tuple[ChatMessage, ...]:
        """The newest ``count`` messages (all when fewer), oldest first, reading no older one."""
        if checked_count(count) == 0:
            return ()
        read = await self._read(self._store._cache.get(self._id), count)
        if read.first > 1 and len(read.messages) < count:
            read = await self._read(None, count)  # what was kept starts too late
        if len(read.messages) <= count:
            return read.messages
        tail = read.messages[-count:]
        if read.first > 1:
            # Kept only for windows (a whole read starts at 1): keep the window, not every
            # message read since, or each append would copy what past turns added.
            self._store.remember(self._id, _Cached(read.gen, read.end - count, tail))
        return tail

    async def count_messages(self) -> int:
        """How many messages the session holds (its row's ``length``: no message is read)."""
        sql = self._store.sql["length"].encode()

        def count(conn: Conn) -> int:
            row = conn.execute(sql, {"id": self._id}).fetchone()
            return 0 if row is None else int(row[0])

        return await self._store.call(count, "count the messages", self._id)

    async def _read(self, cached: _Cached | None, keep: int) -> _Cached:
        store = self._store
        sql = store.sql["read"].encode()
        args = {
            "id": self._id,
            "gen": None if cached is None else cached.gen,
            "after": 0 if cached is None else cached.end - 1,
            "keep": keep,
        }

        def read(conn: Conn) -> _Cached | None:
            rows = conn.execute(sql, args).fetchall()
            if not rows:
                return None  # not stored (or expired)
            gen, length = rows[0][0], rows[0][1]
            new = tuple([self._decode(seq, text) for _, _, seq, text in rows if seq is not None])
            first = rows[0][2] if new else length + 1
            if cached is not None and cached.gen == gen and first == cached.end:
                found = _Cached(gen, cached.first, cached.messages + new)
            else:
                found = _Cached(gen, first, new)
            if found.end != length + 1:  # the query's own view: cannot differ
                raise SessionStoreError(
                    f"{store.where}, session {self._id!r}: read messages {found.first} to "
                    f"{found.end - 1} of a session of {length}"
                )
            return found

        found = await store.call(read, "read the messages", self._id)
        store.remember(self._id, found)
        return found if found is not None else _Cached(0, 1, ())

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages`` in one transaction; a bad item rejects the whole call."""
        batch = checked_batch(messages)
        if batch:
            await self._write(batch, (), None)

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None:
        """Append ``messages`` and record ``pending`` in one transaction."""
        new, calls = checked_pending(messages, pending)
        if new or calls:
            await self._write(new, calls, None)

    async def add_once(
        self, key: str, messages: Iterable[ChatMessage], pending: Iterable[PendingCall] = ()
    ) -> bool:
        """:meth:`record_pending`, unless ``key`` was written to this session before (then
        nothing; ``False``): the key, the messages and the calls in one transaction."""
        key = checked_key(key)
        if "\x00" in key:
            raise ValueError(f"a PostgreSQL idempotency key cannot hold NUL (\\x00): {key!r}")
        new, calls = checked_pending(messages, pending)
        return await self._write(new, calls, key)

    async def _write(
        self, batch: tuple[ChatMessage, ...], calls: tuple[PendingCall, ...], key: str | None
    ) -> bool:
        store = self._store
        sql = store.sql
        sweep = not store.swept()
        encoded = [_json(message.to_dict()) for message in batch]
        by_token = {call.token: _json(call.to_dict()) for call in calls}  # the last one wins
        now = time.time()

        def write(conn: Conn) -> tuple[int, int] | None:
            session = {"id": self._id, "ttl": store.ttl}
            # An expired session (any store's ttl) is stored anew, not extended.
            conn.execute(sql["expired"].encode(), session)
            row = conn.execute(sql["upsert"].encode(), {**session, "n": len(batch), "now": now})
            gen, length, writes = row.fetchone() or (0, 0, 0)
            if (
                key is not None
                and not conn.execute(sql["once"].encode(), {**session, "key": key}).rowcount
            ):
                raise Undo(None)
            if encoded:
                first = length - len(encoded) + 1
                conn.execute(
                    sql["append"].encode(), {**session, "first": first, "messages": encoded}
                )
            if by_token:
                tokens, texts = list(by_token), list(by_token.values())
                args = {**session, "turn": writes, "tokens": tokens, "calls": texts}
                conn.execute(sql["record"].encode(), args)
            if sweep:
                conn.execute(sql["sweep"].encode())
            return gen, length

        count = len(batch)
        what = f"append {count} message{'s' if count != 1 else ''}"
        if calls:
            what += f" and record {len(calls)} pending call{'s' if len(calls) != 1 else ''}"
        done = await store.call(
            write, what, self._id, write=True, writing="nothing or everything of it is stored"
        )
        if done is None:
            return False
        gen, length = done
        cached = store._cache.get(self._id)
        first = length - count + 1
        if cached is not None and cached.gen == gen and cached.end == first:
            # Nobody else appended since our last read: extend what is kept, no read back.
            store.remember(self._id, _Cached(gen, cached.first, cached.messages + batch))
        elif first == 1:
            store.remember(self._id, _Cached(gen, 1, batch))  # the whole session
        return True

    async def list_pending(self) -> tuple[PendingCall, ...]:
        """The calls that wait for approval, in the order recorded (nothing is written)."""
        sql = self._store.sql["pending"].encode()

        def look(conn: Conn) -> tuple[PendingCall, ...]:
            return tuple(self._pending(conn.execute(sql, {"id": self._id}).fetchall()))

        return await self._store.call(look, "list the pending calls", self._id)

    async def claim_pending(self, tokens: Sequence[str]) -> Claimed | None:
        """Remove and return the pending calls of ``tokens``, all of them or none (``None``)."""
        wanted = checked_tokens(tokens)
        if len(set(wanted)) != len(wanted) or any("\x00" in token for token in wanted):
            return None  # given twice, or no token PostgreSQL could hold: not all pending
        return await self._claim(wanted)

    async def claim_all_pending(self) -> tuple[PendingCall, ...]:
        """Remove and return every pending call."""
        claimed = await self._claim(None)
        return claimed[0] if claimed is not None else ()

    async def _claim(self, tokens: tuple[str, ...] | None) -> Claimed | None:
        store = self._store
        sql = store.sql

        def claim(conn: Conn) -> Claimed | None:
            session = {"id": self._id, "ttl": store.ttl}
            if conn.execute(sql["lock"].encode(), session).fetchone() is None:
                return None if tokens else ((), ())  # not stored: nothing waits
            waiting = self._pending(conn.execute(sql["pending"].encode(), session).fetchall())
            by_token = {call.token: call for call in waiting}
            if tokens is None:
                claimed = tuple(waiting)
            elif all(token in by_token for token in tokens):
                claimed = tuple(by_token[token] for token in tokens)
            else:
                return None
            taken = {call.token for call in claimed}
            conn.execute(sql["claim"].encode(), {**session, "tokens": list(taken)})
            return claimed, tuple(call for call in waiting if call.token not in taken)

        return await store.call(claim, "claim pending calls", self._id, write=True)

    def _pending(self, rows: list[tuple[Any, ...]]) -> list[PendingCall]:
        calls = []
        for token, text in rows:
            try:
                calls.append(PendingCall.from_dict(json.loads(text)))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise SessionStoreError(
                    f"{self._store.where}, session {self._id!r}: the pending call {token!r} "
                    f"is not a stored PendingCall ({type(exc).__name__}: {exc})"
                ) from exc
        return calls

    async def spill_tool_result(self, call_id: str, text: str) -> None:
        """Keep the full result of tool call ``call_id`` (table ``{prefix}_spilled``)."""
        await write_spilled(self._store, self._store.sql, self._id, *checked_spill(call_id, text))

    async def spilled_tool_result(self, call_id: str) -> str | None:
        """The full result kept for ``call_id``, or ``None`` when none is kept."""
        return await read_spilled(self._store, self._id, checked_call_id(call_id))

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
        """Record the request's digest with the time; say whether it was recorded before."""
        digest = request_hash(messages)
        store = self._store
        sql = store.sql
        now = time.time()

        def touch(conn: Conn) -> bool:
            session = {"id": self._id, "ttl": store.ttl, "hash": digest}
            conn.execute(sql["expired"].encode(), session)
            row = conn.execute(sql["upsert"].encode(), {**session, "n": 0, "now": now}).fetchone()
            seen = conn.execute(sql["seen"].encode(), session).fetchone() is not None
            turn = row[2] if row else 0
            conn.execute(sql["touch"].encode(), {**session, "seen_at": now, "turn": turn})
            conn.execute(sql["trim"].encode(), {**session, "limit": REQUEST_HASH_LIMIT})
            return seen

        repeated = await store.call(touch, "record the request hash", self._id, write=True)
        return RequestHash(digest, repeated)

    async def request_hashes(self) -> dict[str, float]:
        """The recorded digests with the time each was last seen, oldest first."""
        sql = self._store.sql["hashes"].encode()
        rows = await self._store.call(
            lambda conn: conn.execute(sql, {"id": self._id}).fetchall(),
            "read the request hashes",
            self._id,
        )
        return {str(digest): float(seen_at) for digest, seen_at in rows}  # type: ignore[arg-type]

    async def last_model_call(self) -> LastModelCall | None:
        """When the session's last model call ended, and where its bounded views began."""
        return await read_last_call(self._store, self._id)

    async def record_model_call(self, at: float, cuts: Mapping[str, int]) -> None:
        """Record ``at`` as the last model call's time, ``cuts`` over the kept ones."""
        await write_last_call(self._store, self._store.sql, self._id, at, cuts)

    def _decode(self, seq: int, text: object) -> ChatMessage:
        where = f"{self._store.where}, session {self._id!r}: message {seq}"
        try:
            data = json.loads(text)  # type: ignore[arg-type]
            if type(data) is not dict:
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            return ChatMessage.from_dict(data)
        except RecursionError:
            raise SessionStoreError(f"{where} is nested too deeply to read") from None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SessionStoreError(
                f"{where} is not a stored ChatMessage ({type(exc).__name__}: {exc}); "
                "it was left as it is"
            ) from exc

    def __repr__(self) -> str:
        return f"PostgresSession(id={self._id!r}, store={redacted(self._store.dsn)!r})"


def _json(data: object) -> str:
    # The same JSON as the other stores: to_dict, UTF-8 kept, no spaces.
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
