"""RedisSessionStore: sessions in Redis, shared by any number of processes and machines.

Needs the optional extra ``raf-agents[redis]`` (the ``coredis`` client, which runs on
anyio: asyncio and trio alike). ``import raf`` does not import this module;
``raf.RedisSessionStore`` does, on first use.

Layout in Redis, per session (``{id}`` is a hash tag, so both keys of a
session live in one cluster slot):

- ``{prefix}:{id}:messages``: a list, one entry per message, raf's JSON
  (``ChatMessage.to_dict``), oldest first;
- ``{prefix}:{id}:requests``: a sorted set, request digest -> last time seen,
  the last :data:`REQUEST_HASH_LIMIT` digests;
- ``{prefix}:{id}:pending``: a hash, the tool calls that wait for approval
  (see :mod:`raf._sessions.redis_pending`).

Every write is one command or one Lua script, so it is atomic on the server:
it appends the whole batch (or records the digest) and puts the ``ttl`` on
both keys again, and it fails before it changes anything when a key holds
another type of value. Without a ttl, an append is a single ``RPUSH``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Final, NoReturn
from urllib.parse import urlsplit, urlunsplit

import anyio
import attrs
import coredis
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import NoScriptError, RedisError, WrongTypeError
from coredis.retry import NoRetryPolicy

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
from raf._sessions.once import redis_add_once
from raf._sessions.redis_pending import RedisPending
from raf._values.messages import ChatMessage, PendingCall

__all__ = ["RedisSessionStore"]


DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
#: Seconds a store waits for the server by default: on opening (the connect and the
#: PING) and on each call. Past it the call is a SessionStoreError, never a hang.
DEFAULT_TIMEOUT: Final = 10.0

# Both scripts write nothing before they know every write will succeed: the first
# command that writes fails on a key of another type before it changes anything
# (WRONGTYPE), and the other key, which gets only the ttl, is checked first, so a
# key that is not ours never gets one. A script runs atomically: no other client's
# command runs between its commands.
_CHECK_OTHER_KEY: Final = """
local ttl = tonumber(ARGV[1])
if ttl > 0 then
  local kind = redis.call('TYPE', KEYS[2])['ok']
  if kind ~= 'none' and kind ~= '%s' then
    return redis.error_reply(
      'WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. kind .. ', not a %s')
  end
end
"""

# Lua: KEYS[1] the message list, KEYS[2] the request-hash record;
# ARGV[1] the ttl in seconds ("0": none), ARGV[2..] the messages as raf's JSON.
# RPUSH takes the batch in slices because Lua's unpack() is limited to a few
# thousand values; the script is atomic, so the slices are contiguous anyway.
_APPEND: Final = (
    _CHECK_OTHER_KEY % ("zset", "zset")
    + """
local length = 0
for first = 2, #ARGV, 1000 do
  length = redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, #ARGV)))
end
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
return length
"""
)

# Lua: KEYS[1] the request-hash record, KEYS[2] the message list;
# ARGV[1] the ttl, ARGV[2] the digest, ARGV[3] the time, ARGV[4] how many digests to keep.
# Returns 1 when the digest was already recorded (a repeated request), else 0.
_TOUCH: Final = (
    _CHECK_OTHER_KEY % ("list", "list")
    + """
local seen = redis.call('ZSCORE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[4]) + 1))
if ttl > 0 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('EXPIRE', KEYS[2], ttl)
end
if seen then return 1 end
return 0
"""
)


# Lua: KEYS[1] the message list; ARGV[1] how many entries the reader's cache covers (from
# the list's start; 0: none), ARGV[2] the SHA1 of the last of them, ARGV[3] how many of the
# newest entries to read when the cache cannot be extended (-1: all).
# Returns {length, first index read, entries}: the entries after the cache when its last
# entry is still where it was (the list only grew since), else the newest ARGV[3] entries.
_READ: Final = """
local length = redis.call('LLEN', KEYS[1])
local cached = tonumber(ARGV[1])
if cached > 0 and cached <= length then
  -- Counted from the end: LINDEX walks the list from the end its index counts from.
  local last = redis.call('LINDEX', KEYS[1], cached - length - 1)
  if last and redis.sha1hex(last) == ARGV[2] then
    return {length, cached, redis.call('LRANGE', KEYS[1], cached, -1)}
  end
end
local first = 0
if tonumber(ARGV[3]) >= 0 then first = math.max(0, length - tonumber(ARGV[3])) end
return {length, first, redis.call('LRANGE', KEYS[1], first, -1)}
"""

#: How many messages a store keeps decoded, across its sessions, before it forgets the
#: least recently used session (the one in use is always kept).
CACHE_MESSAGES: Final = 200_000


@attrs.frozen(slots=True)
class _Cached:
    """What a store has read of one session's list: ``messages`` are entries
    ``first`` to ``first + len(messages) - 1``; ``sha`` is the SHA1 of the last one's bytes."""

    first: int
    messages: tuple[ChatMessage, ...]
    sha: str

    @property
    def end(self) -> int:
        return self.first + len(self.messages)


# A dropped connection shows as coredis's ConnectionError, an OSError, or an anyio
# stream error, depending on where the client was when it dropped.
_CONNECTION_FAILURES: Final = (
    RedisConnectionError,
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)
# TimeoutError: the call's own deadline (the store's timeout), or coredis's stream timeout.
_FAILURES: Final = (RedisError, TimeoutError, *_CONNECTION_FAILURES)

_SHA1: Final = {
    script: hashlib.sha1(script.encode()).hexdigest() for script in (_APPEND, _TOUCH, _READ)
}


class RedisSessionStore:
    """Sessions in one Redis database, shared by every process that opens it.

    Open it with ``async with`` (or ``await store.open()``, then
    ``await store.aclose()`` in the same task: the client keeps its
    connections in a task group), then ``await store.get(session_id)``. A
    session is one Redis list; ``add_messages`` appends a batch with one
    ``RPUSH`` (with a ttl: one Lua script that also puts the expiry again),
    so it is atomic and contiguous however many processes write to the
    session at once. ``ttl`` (seconds) is put again on every key of a
    session on every write; ``None`` means the keys never expire.

    ``timeout`` (seconds, default 10; ``None``: no bound) bounds opening (the
    connect and the ``PING``) and every call: a server that does not answer
    in time (frozen, overloaded, a peer that accepts connections and never
    replies) is a :class:`raf.SessionStoreError` that says so, never
    a hang; a write that timed out is stored whole or not at all.

    Every failure is a :class:`raf.SessionStoreError` that names the
    server and says what happened: a server that does not answer (on
    opening), a connection dropped during a call, a key of the session
    holding another type of value, a stored entry that is not raf's JSON.
    Nothing already stored is changed by a failed call.

    Reads are incremental: the store keeps what it decoded of each session
    (up to ``cache_messages`` messages in all, least recently used sessions
    forgotten first) and a read sends one script that checks the list only
    grew since (its length, and the SHA1 of the last entry read) and returns
    only the new entries; otherwise, or for another session, it reads
    afresh. ``get_last_messages(count)`` on a session not read yet reads
    only the newest ``count`` entries, and a session that is only read by
    its tail keeps only the newest ``count`` (plus what was appended since).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        prefix: str = "raf",
        ttl: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        cache_messages: int = CACHE_MESSAGES,
    ) -> None:
        if type(url) is not str or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"RedisSessionStore: url must be a redis:// URL, got {url!r}")
        if type(prefix) is not str or not prefix:
            raise ValueError(f"RedisSessionStore: prefix must be a non-empty str, got {prefix!r}")
        if ttl is not None and (isinstance(ttl, bool) or not ttl > 0):
            raise ValueError(f"RedisSessionStore: ttl must be None or > 0 seconds, got {ttl!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ValueError(
                f"RedisSessionStore: timeout must be None or > 0 seconds, got {timeout!r}"
            )
        if type(cache_messages) is not int or cache_messages < 0:
            raise ValueError(
                f"RedisSessionStore: cache_messages must be an int >= 0, got {cache_messages!r}"
            )
        self.url = url
        self.prefix = prefix
        self.cache_messages = cache_messages
        # Session id -> what was read of it; insertion order is recency (least recent first).
        self._cache: dict[str, _Cached] = {}
        self._cached_count = 0
        self.ttl = ttl
        self.timeout = timeout
        # EXPIRE takes whole seconds; a part of a second is rounded up, never down to 0.
        self._ttl_arg = "0" if ttl is None else str(max(1, -int(-ttl // 1)))
        self._where = f"Redis session store {_redacted(url)}"
        self._client: coredis.Redis[bytes] | None = None
        self._exit = AsyncExitStack()
        self._closed = False

    async def open(self) -> RedisSessionStore:
        """Connect and check that the server answers (``async with`` calls it)."""
        if self._closed:
            raise SessionStoreError(f"{self._where}: the store is closed")
        if self._client is not None:
            return self
        await self._check_answers()
        # No automatic retries: resending a write whose reply was lost could store it twice.
        # stream_timeout: coredis's own bound on each reply (opening included), under the
        # calls' deadlines (a cancel scope cannot enclose the client's task group).
        client: coredis.Redis[bytes] = coredis.Redis.from_url(
            self.url,
            decode_responses=False,
            retry_policy=NoRetryPolicy(),
            stream_timeout=self.timeout,
        )
        exit = AsyncExitStack()
        try:
            await exit.enter_async_context(client)
            await client.ping()
        except BaseException as exc:
            await exit.aclose()
            if isinstance(exc, TimeoutError):
                problem = f"the server did not answer within timeout={self.timeout} s"
            elif isinstance(exc, _CONNECTION_FAILURES):
                problem = "cannot reach the server"
            elif isinstance(exc, RedisError):
                problem = "the server does not answer as Redis does"
            else:
                raise
            raise SessionStoreError(f"{self._where}: {problem}: {_reason(exc)}") from exc
        self._client, self._exit = client, exit
        return self

    async def _check_answers(self) -> None:
        """Connect and send a PING over plain TCP, within ``timeout``: a server that is
        down, frozen or silent fails here, before coredis (which leaves a failed
        connection's streams unclosed, and whose opening no deadline of ours can enclose).
        Any reply will do (``-NOAUTH`` too): the client's PING then checks it is Redis.
        """
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            return
        try:
            with anyio.fail_after(self.timeout):
                stream = await anyio.connect_tcp(parts.hostname or "127.0.0.1", parts.port or 6379)
                async with stream:
                    if parts.scheme == "redis":  # a TLS server waits for its handshake
                        await stream.send(b"PING\r\n")
                        await stream.receive(1)
        except TimeoutError as exc:
            raise SessionStoreError(
                f"{self._where}: cannot reach the server: it did not answer within "
                f"timeout={self.timeout} s"
            ) from exc
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            raise SessionStoreError(
                f"{self._where}: cannot reach the server: {_reason(exc)}"
            ) from exc

    async def get(self, session_id: str) -> RedisSession:
        """The session ``session_id`` (created by its first write; no round trip here)."""
        checked_session_id(session_id)
        self._require()
        return RedisSession(self, session_id)

    async def aclose(self) -> None:
        """Close the connections; the store cannot be used afterwards."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await self._exit.aclose()

    async def __aenter__(self) -> RedisSessionStore:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"RedisSessionStore({_redacted(self.url)!r}, prefix={self.prefix!r}, "
            f"ttl={self.ttl!r}, timeout={self.timeout!r})"
        )

    def _require(self) -> coredis.Redis[bytes]:
        if self._client is None:
            state = "closed" if self._closed else "not open: use `async with` or `await open()`"
            raise SessionStoreError(f"{self._where}: the store is {state}")
        return self._client

    async def _run(
        self, client: coredis.Redis[bytes], script: str, keys: Sequence[str], args: list[str]
    ) -> Any:
        """Run a Lua script by its SHA1, loading it first if the server does not have it."""
        # EVALSHA directly: coredis's Script wrapper costs a tenth of an append.
        sha = _SHA1[script]
        try:
            return await client.evalsha(sha, keys=keys, args=args)
        except NoScriptError:
            # The server never ran the command (a restart or SCRIPT FLUSH dropped the
            # script): load it and send the command again, once.
            await client.script_load(script)
            return await client.evalsha(sha, keys=keys, args=args)

    def _remember(self, session_id: str, cached: _Cached) -> None:
        """Keep ``cached`` as what was read of ``session_id``, most recently used."""
        old = self._cache.pop(session_id, None)
        if old is not None:
            self._cached_count -= len(old.messages)
        self._cache[session_id] = cached
        self._cached_count += len(cached.messages)
        while self._cached_count > self.cache_messages and len(self._cache) > 1:
            forgotten = self._cache.pop(next(iter(self._cache)))
            self._cached_count -= len(forgotten.messages)

    def _fail(
        self, exc: BaseException, what: str, session_id: str, *, writing: str = ""
    ) -> NoReturn:
        """Raise the SessionStoreError that says what ``exc`` means for this call."""
        where = f"{self._where}, session {session_id!r}"
        if isinstance(exc, TimeoutError):
            outcome = f"; {writing}" if writing else ""
            raise SessionStoreError(
                f"{where}: cannot {what}: the server did not answer within "
                f"timeout={self.timeout} s{outcome}"
            ) from exc
        if isinstance(exc, WrongTypeError) or "WRONGTYPE" in str(exc):
            raise SessionStoreError(
                f"{where}: cannot {what}: a key of the session holds another type of value "
                f"({_reason(exc)}); it was left as it is"
            ) from exc
        if isinstance(exc, _CONNECTION_FAILURES):
            outcome = f"; {writing}" if writing else ""
            raise SessionStoreError(
                f"{where}: the connection failed while trying to {what}: {_reason(exc)}{outcome}"
            ) from exc
        raise SessionStoreError(f"{where}: cannot {what}: {_reason(exc)}") from exc


class RedisSession(RedisPending):
    """One session of a :class:`RedisSessionStore` (get it with ``store.get``).

    Its pending tool calls (``record_pending``, ``claim_pending``) are in
    :mod:`raf._sessions.redis_pending`.
    """

    __slots__ = ("_id", "_messages_key", "_requests_key", "_store")

    def __init__(self, store: RedisSessionStore, id: str) -> None:
        self._store = store
        self._id = id
        base = f"{store.prefix}:{{{id}}}"
        self._messages_key = f"{base}:messages"
        self._requests_key = f"{base}:requests"

    @property
    def id(self) -> str:
        """The session's id."""
        return self._id

    @property
    def store(self) -> RedisSessionStore:
        """The store the session lives in."""
        return self._store

    @property
    def keys(self) -> tuple[str, str]:
        """The session's Redis keys: its message list and its request-hash record."""
        return self._messages_key, self._requests_key

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        """The history, oldest first (one script: only the entries not read before)."""
        cached = self._store._cache.get(self._id)
        return (await self._read(cached if cached and cached.first == 0 else None, -1)).messages

    async def get_last_messages(self, count: int) -> tuple[ChatMessage, ...]:
        """The newest ``count`` messages (all when fewer), oldest first, reading no older entry."""
        checked_count(count)
        read = await self._read(self._store._cache.get(self._id), count)
        if read.first > 0 and len(read.messages) < count:
            read = await self._read(None, count)  # what was kept starts too late
        if len(read.messages) <= count:
            return read.messages
        if not count:
            return ()
        tail = read.messages[-count:]
        if read.first > 0:
            # Kept only for windows (a whole read starts at 0): keep the window, not every
            # message read since, or each append would copy what past turns added.
            self._store._remember(self._id, _Cached(read.end - count, tail, read.sha))
        return tail

    async def _read(self, cached: _Cached | None, count: int) -> _Cached:
        store = self._store
        client = store._require()
        args = (
            ["0", "", str(count)] if cached is None else [str(cached.end), cached.sha, str(count)]
        )
        try:
            with anyio.fail_after(store.timeout):
                length, first, entries = await store._run(
                    client, _READ, (self._messages_key,), args
                )
        except _FAILURES as exc:
            store._fail(exc, "read the messages", self._id)
        new = tuple([self._decode(first + index, entry) for index, entry in enumerate(entries)])
        if cached is not None and first == cached.end:
            if not new:
                store._remember(self._id, cached)
                return cached
            read = _Cached(cached.first, cached.messages + new, _sha(entries[-1]))
        else:
            read = _Cached(first, new, _sha(entries[-1]) if entries else "")
        if read.end != length:  # the script's own view: cannot differ unless the server lies
            raise SessionStoreError(
                f"{store._where}, session {self._id!r}: read {read.end} entries of "
                f"{self._messages_key}, which holds {length}"
            )
        store._remember(self._id, read)
        return read

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages`` atomically and contiguously; a bad item rejects the whole call."""
        batch = checked_batch(messages)
        if not batch:
            return
        encoded = [_encode(message) for message in batch]
        store = self._store
        client = store._require()
        try:
            with anyio.fail_after(store.timeout):
                if store.ttl is None:
                    # One RPUSH of many values is atomic and contiguous by itself, and on a
                    # key of another type it fails before writing: no script needed.
                    length = await client.rpush(self._messages_key, encoded)
                else:
                    length = await store._run(
                        client, _APPEND, self.keys, [store._ttl_arg, *encoded]
                    )
        except _FAILURES as exc:
            store._fail(
                exc,
                f"append {len(batch)} message{'s' if len(batch) != 1 else ''}",
                self._id,
                writing="the batch is stored whole or not at all: read the session "
                "before sending it again",
            )
        cached = store._cache.get(self._id)
        if cached is not None and cached.end == int(length) - len(batch):
            # Nobody else appended since our last read: extend what is kept, no read back.
            store._remember(
                self._id, _Cached(cached.first, cached.messages + batch, _sha(encoded[-1]))
            )

    async def add_messages_once(
        self, key: str, messages: Iterable[ChatMessage], pending: Iterable[PendingCall] = ()
    ) -> bool:
        """:meth:`add_messages` (with :meth:`record_pending` when ``pending`` is given), unless
        ``key`` was written before (then nothing; ``False``)."""
        return await redis_add_once(self, key, messages, pending)

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
        """Record the request's digest with the time; say whether it was recorded before."""
        digest = request_hash(messages)
        store = self._store
        client = store._require()
        args = [store._ttl_arg, digest, repr(time.time()), str(REQUEST_HASH_LIMIT)]
        try:
            with anyio.fail_after(store.timeout):
                keys = (self._requests_key, self._messages_key)
                seen = await store._run(client, _TOUCH, keys, args)
        except _FAILURES as exc:
            store._fail(exc, "record the request hash", self._id)
        return RequestHash(digest, bool(seen))

    async def request_hashes(self) -> dict[str, float]:
        """The recorded digests with the time each was last seen, oldest first."""
        client = self._store._require()
        try:
            with anyio.fail_after(self._store.timeout):
                pairs = await client.zrange(self._requests_key, 0, -1, withscores=True)
        except _FAILURES as exc:
            self._store._fail(exc, "read the request hashes", self._id)
        return {_text(member): float(score) for member, score in pairs}

    def _decode(self, index: int, entry: bytes | str) -> ChatMessage:
        try:
            return ChatMessage.from_dict(json.loads(entry))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SessionStoreError(
                f"{self._store._where}, session {self._id!r}: entry {index} of "
                f"{self._messages_key} is not a stored ChatMessage ({exc}); it was left as it is"
            ) from exc

    def __repr__(self) -> str:
        return f"RedisSession(id={self._id!r}, store={_redacted(self._store.url)!r})"


CHECKED_SESSION_TYPES.add(RedisSession)


def _sha(entry: bytes | str) -> str:
    """The SHA1 of an entry's bytes, as Lua's ``redis.sha1hex`` gives it."""
    return hashlib.sha1(entry if isinstance(entry, bytes) else entry.encode()).hexdigest()


def _encode(message: ChatMessage) -> str:
    # The same JSON as the SQLite store: to_dict, UTF-8 kept, no spaces.
    return json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _redacted(url: str) -> str:
    """The URL without its password, for messages and reprs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))
