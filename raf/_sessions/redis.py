"""RedisSessionStore: sessions in Redis, shared by any number of processes and machines.

Needs the optional extra ``raf-agents[redis]`` (the ``coredis`` client, which runs on
anyio: asyncio and trio alike). ``import raf`` does not import this module;
``raf.RedisSessionStore`` does, on first use.

Layout in Redis, per session (``{id}`` is a hash tag, so the keys of a
session live in one cluster slot):

- ``{prefix}:{id}:messages``: a list, one entry per message, raf's JSON
  (``ChatMessage.to_dict``), oldest first;
- ``{prefix}:{id}:requests``: a sorted set, request digest -> last time seen,
  the last :data:`REQUEST_HASH_LIMIT` digests;
- ``{prefix}:{id}:pending``: a hash, token -> the tool call that waits for
  approval as JSON (with the order it was recorded in);
- ``{prefix}:{id}:once``: a set, the keys of the writes done once
  (``add_once``: a replayed durable run does not store its turn twice);
- ``{prefix}:{id}:spilled``: a hash, call id -> a tool result's full text
  (``raf.ToolOutputLimit``; :mod:`raf._sessions.redis_spill`).

Every write is one command or one Lua script, so it is atomic on the server:
it appends the whole batch (or records the digest) and puts the ``ttl`` on
both keys again, and it fails before it changes anything when a key holds
another type of value. Without a ttl, an append is a single ``RPUSH``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import anyio
import attrs

from raf._sessions import redis_scripts as scripts
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
from raf._sessions.redis_connection import (
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    FAILURES,
    RedisConnection,
    redacted,
)
from raf._sessions.redis_fork import write_fork
from raf._sessions.redis_last_call import read_last_call, write_last_call
from raf._sessions.redis_spill import read_spilled, spilled_key, write_spilled
from raf._values.messages import ChatMessage, PendingCall
from raf.errors import SessionStoreError

__all__ = ["RedisSessionStore"]

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


class RedisSessionStore(RedisConnection):
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
    replies) is a :class:`raf.errors.SessionStoreError` that says so, never
    a hang; a write that timed out is stored whole or not at all.

    Every failure is a :class:`raf.errors.SessionStoreError` that names the
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
        if type(cache_messages) is not int or cache_messages < 0:
            raise ValueError(
                f"RedisSessionStore: cache_messages must be an int >= 0, got {cache_messages!r}"
            )
        super().__init__(url, prefix=prefix, ttl=ttl, timeout=timeout)
        self.cache_messages = cache_messages
        # Session id -> what was read of it; insertion order is recency (least recent first).
        self._cache: dict[str, _Cached] = {}
        self._cached_count = 0

    async def get(self, session_id: str) -> RedisSession:
        """The session ``session_id`` (created by its first write; no round trip here)."""
        checked_session_id(session_id)
        self.client()
        return RedisSession(self, session_id)

    async def fork(self, session_id: str, new_id: str, *, at: int | None = None) -> RedisSession:
        """Copy the first ``at`` turns of ``session_id`` (all without ``at``) into the new session
        ``new_id`` and return it, as :meth:`raf.SqliteSessionStore.fork`; the check and the copy
        are one script on the new session's list (one key: a cluster takes it)."""
        at = checked_fork(session_id, new_id, at)
        copied = first_turns(await (await self.get(session_id)).get_messages(), session_id, at)
        target = await self.get(new_id)
        await write_fork(self, target.keys[0], new_id, copied)
        await carry_spilled(await self.get(session_id), target, copied)  # no round trip to get
        return target

    def __repr__(self) -> str:
        return (
            f"RedisSessionStore({redacted(self.url)!r}, prefix={self.prefix!r}, "
            f"ttl={self.ttl!r}, timeout={self.timeout!r})"
        )

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


class RedisSession:
    """One session of a :class:`RedisSessionStore` (get it with ``store.get``).

    Its pending tool calls wait in the session's ``pending`` hash; every
    pending operation is one Lua script, atomic on the server: of two claims
    of one token, one takes it and the other finds it gone.
    """

    __slots__ = ("_id", "_messages_key", "_once_key", "_pending_key", "_requests_key", "_store")

    def __init__(self, store: RedisSessionStore, id: str) -> None:
        self._store = store
        self._id = id
        base = f"{store.prefix}:{{{id}}}"
        self._messages_key = f"{base}:messages"
        self._requests_key = f"{base}:requests"
        self._pending_key = f"{base}:pending"
        self._once_key = f"{base}:once"

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

    async def count_messages(self) -> int:
        """How many messages the session holds (``LLEN``: no entry is read)."""
        client = self._store.client()
        try:
            with anyio.fail_after(self._store.timeout):
                return int(await client.llen(self._messages_key))
        except FAILURES as exc:
            self._store.fail(exc, "count the messages", self._id)

    async def _read(self, cached: _Cached | None, count: int) -> _Cached:
        store = self._store
        client = store.client()
        args = (
            ["0", "", str(count)] if cached is None else [str(cached.end), cached.sha, str(count)]
        )
        try:
            with anyio.fail_after(store.timeout):
                length, first, entries = await store.run_script(
                    client, scripts.READ, (self._messages_key,), args
                )
        except FAILURES as exc:
            store.fail(exc, "read the messages", self._id)
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
                f"{store.where}, session {self._id!r}: read {read.end} entries of "
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
        client = store.client()
        try:
            with anyio.fail_after(store.timeout):
                if store.ttl is None:
                    # One RPUSH of many values is atomic and contiguous by itself, and on a
                    # key of another type it fails before writing: no script needed.
                    length = await client.rpush(self._messages_key, encoded)
                else:
                    length = await store.run_script(
                        client, scripts.APPEND, self.keys, [store.ttl_arg, *encoded]
                    )
        except FAILURES as exc:
            store.fail(
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

    async def add_once(
        self, key: str, messages: Iterable[ChatMessage], pending: Iterable[PendingCall] = ()
    ) -> bool:
        """:meth:`record_pending`, unless ``key`` was written to this session before (then
        nothing; ``False``): one script, atomic on the server."""
        key = checked_key(key)
        new, calls = checked_pending(messages, pending)
        args = [self._store.ttl_arg, key, str(len(new)), *(_encode(m) for m in new)]
        args += self._encoded_calls(calls)
        keys = [self._messages_key, self._once_key, self._pending_key]
        written = await self._script(scripts.ONCE, keys, args, f"append {len(new)} messages once")
        return bool(written)

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None:
        """Append ``messages`` and record ``pending`` in one atomic script."""
        new, calls = checked_pending(messages, pending)
        if new or calls:
            args = [self._store.ttl_arg, str(len(new)), *(_encode(m) for m in new)]
            args += self._encoded_calls(calls)
            what = f"record {len(calls)} pending call(s)"
            await self._script(scripts.RECORD, self._pending_keys, args, what)

    async def list_pending(self) -> tuple[PendingCall, ...]:
        """The calls that wait for approval, in the order recorded (nothing is written)."""
        listed = await self._claim("look")
        return listed[1] if listed is not None else ()

    async def claim_pending(self, tokens: Sequence[str]) -> Claimed | None:
        """Remove and return the pending calls of ``tokens``, all of them or none (``None``)."""
        wanted = checked_tokens(tokens)
        if len(set(wanted)) != len(wanted):
            return None
        return await self._claim("some", wanted)

    async def claim_all_pending(self) -> tuple[PendingCall, ...]:
        """Remove and return every pending call."""
        claimed = await self._claim("all")
        return claimed[0] if claimed is not None else ()

    @property
    def _pending_keys(self) -> list[str]:
        return [self._messages_key, self._pending_key, self._requests_key]

    def _encoded_calls(self, calls: Sequence[PendingCall]) -> list[str]:
        stamp = time.time()  # ordered as recorded: the hash itself keeps no order
        encoded: list[str] = []
        for index, call in enumerate(calls):
            encoded += [call.token, _json({**call.to_dict(), "order": [stamp, index]})]
        return encoded

    async def _claim(self, mode: str, tokens: Sequence[str] = ()) -> Claimed | None:
        args = [self._store.ttl_arg, mode, *tokens]
        reply = await self._script(scripts.CLAIM, self._pending_keys, args, "claim pending calls")
        if reply is None:
            return None
        claimed, left = (self._pending_decode(entries) for entries in reply)
        if mode == "all":
            claimed.sort(key=lambda pair: pair[0])
        left.sort(key=lambda pair: pair[0])
        return tuple(call for _, call in claimed), tuple(call for _, call in left)

    async def _script(self, script: str, keys: list[str], args: list[str], what: str) -> Any:
        store = self._store
        client = store.client()
        try:
            with anyio.fail_after(store.timeout):
                return await store.run_script(client, script, keys, args)
        except FAILURES as exc:
            store.fail(exc, what, self._id)

    def _pending_decode(self, entries: Sequence[Any]) -> list[tuple[Any, PendingCall]]:
        decoded: list[tuple[Any, PendingCall]] = []
        for entry in entries:
            try:
                data = json.loads(entry)
                decoded.append((tuple(data.get("order", ())), PendingCall.from_dict(data)))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise SessionStoreError(
                    f"{self._store.where}, session {self._id!r}: an entry of "
                    f"{self._pending_key} is not a stored PendingCall ({exc})"
                ) from exc
        return decoded

    async def spill_tool_result(self, call_id: str, text: str) -> None:
        """Keep the full result of tool call ``call_id`` (the session's ``spilled`` hash)."""
        await write_spilled(self._store, self._id, *checked_spill(call_id, text))

    async def spilled_tool_result(self, call_id: str) -> str | None:
        """The full result kept for ``call_id``, or ``None`` when none is kept."""
        return await read_spilled(self._store, self._id, checked_call_id(call_id))

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
        """Record the request's digest with the time; say whether it was recorded before."""
        digest = request_hash(messages)
        store = self._store
        client = store.client()
        args = [store.ttl_arg, digest, repr(time.time()), str(REQUEST_HASH_LIMIT)]
        try:
            with anyio.fail_after(store.timeout):
                spilled = spilled_key(store.prefix, self._id)
                keys = (self._requests_key, self._messages_key, spilled)
                seen = await store.run_script(client, scripts.TOUCH, keys, args)
        except FAILURES as exc:
            store.fail(exc, "record the request hash", self._id)
        return RequestHash(digest, bool(seen))

    async def request_hashes(self) -> dict[str, float]:
        """The recorded digests with the time each was last seen, oldest first."""
        client = self._store.client()
        try:
            with anyio.fail_after(self._store.timeout):
                pairs = await client.zrange(self._requests_key, 0, -1, withscores=True)
        except FAILURES as exc:
            self._store.fail(exc, "read the request hashes", self._id)
        return {_text(member): float(score) for member, score in pairs}

    async def last_model_call(self) -> LastModelCall | None:
        """When the session's last model call ended, and where its bounded views began."""
        return await read_last_call(self._store, self._id)

    async def record_model_call(self, at: float, cuts: Mapping[str, int]) -> None:
        """Record ``at`` as the last model call's time, ``cuts`` over the kept ones."""
        await write_last_call(self._store, self._id, at, cuts)

    def _decode(self, index: int, entry: bytes | str) -> ChatMessage:
        try:
            return ChatMessage.from_dict(json.loads(entry))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SessionStoreError(
                f"{self._store.where}, session {self._id!r}: entry {index} of "
                f"{self._messages_key} is not a stored ChatMessage ({exc}); it was left as it is"
            ) from exc

    def __repr__(self) -> str:
        return f"RedisSession(id={self._id!r}, store={redacted(self._store.url)!r})"


def _sha(entry: bytes | str) -> str:
    """The SHA1 of an entry's bytes, as Lua's ``redis.sha1hex`` gives it."""
    return hashlib.sha1(entry if isinstance(entry, bytes) else entry.encode()).hexdigest()


def _encode(message: ChatMessage) -> str:
    # The same JSON as the SQLite store: to_dict, UTF-8 kept, no spaces.
    return json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":"))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _json(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
