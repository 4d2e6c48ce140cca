"""The pending tool calls of a Redis session: recorded with their turn, claimed once.

One more key per session, ``{prefix}:{id}:pending``: a hash, token -> the
:class:`raf.PendingCall` as JSON (with the order it was recorded in). Both
operations are one Lua script each, so they are atomic on the server: a
turn's messages and its pending calls are stored together, and of two
claims of one token, one takes it and the other finds it gone. Each puts the
session's ``ttl`` on its keys again, as every write does.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from raf._errors import SessionStoreError
from raf._sessions.base import Claimed, checked_pending, checked_tokens
from raf._values.messages import ChatMessage, PendingCall

if TYPE_CHECKING:
    from raf._sessions.redis import RedisSessionStore

__all__: list[str] = []

# Every key is checked before anything is written, so a key of another type
# fails the script with WRONGTYPE and nothing changes.
_CHECK: Final = """
local expected = {'list', 'hash', 'zset'}
for i = 1, 3 do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= expected[i] then
    return redis.error_reply(
      'WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. kind .. ', not a ' .. expected[i])
  end
end
local ttl = tonumber(ARGV[1])
"""

_EXPIRE: Final = """
if ttl > 0 then
  for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ttl) end
end
"""

# KEYS: messages, pending, requests. ARGV[1] ttl, ARGV[2] n, ARGV[3..n+2] the messages,
# then token and JSON pairs.
_RECORD: Final = (
    _CHECK
    + """
local n = tonumber(ARGV[2])
for first = 3, n + 2, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, first, math.min(first + 999, n + 2)))
end
for i = n + 3, #ARGV, 2 do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
end
"""
    + _EXPIRE
)

# KEYS: messages, pending, requests. ARGV[1] ttl, ARGV[2] 'all', 'some' or 'look',
# ARGV[3..] the tokens ('some'). Returns {claimed, still pending}, or nil when a token
# is not pending (nothing claimed).
_CLAIM: Final = (
    _CHECK
    + """
local claimed = {}
if ARGV[2] == 'all' then
  claimed = redis.call('HVALS', KEYS[2])
  redis.call('DEL', KEYS[2])
elseif ARGV[2] == 'some' then
  for i = 3, #ARGV do
    if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then return false end
  end
  for i = 3, #ARGV do
    claimed[#claimed + 1] = redis.call('HGET', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
  end
end
local left = redis.call('HVALS', KEYS[2])
if ARGV[2] ~= 'look' then
"""
    + _EXPIRE
    + """
end
return {claimed, left}
"""
)

_SHA1: Final = {script: hashlib.sha1(script.encode()).hexdigest() for script in (_RECORD, _CLAIM)}


class RedisPending:
    """``record_pending`` and ``claim_pending`` of :class:`raf.RedisSessionStore` sessions."""

    __slots__ = ()

    _store: RedisSessionStore
    _id: str
    _messages_key: str
    _requests_key: str

    @property
    def _pending_keys(self) -> list[str]:
        pending = self._messages_key[: -len("messages")] + "pending"
        return [self._messages_key, pending, self._requests_key]

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None:
        """Append ``messages`` and record ``pending`` in one atomic script."""
        batch, calls = checked_pending(messages, pending)
        if not batch and not calls:
            return
        stamp = time.time()
        args = [self._store._ttl_arg, str(len(batch)), *(_encode(m.to_dict()) for m in batch)]
        for index, call in enumerate(calls):
            args += [call.token, _encode({**call.to_dict(), "order": [stamp, index]})]
        await self._pending_script(_RECORD, args, f"record {len(calls)} pending call(s)")

    async def claim_pending(self, tokens: Sequence[str] | None) -> Claimed | None:
        """Remove and return the pending calls of ``tokens``, all of them or none (``None``)."""
        wanted = checked_tokens(tokens)
        if wanted is not None and len(set(wanted)) != len(wanted):
            return None
        mode = "all" if wanted is None else "some" if wanted else "look"
        args = [self._store._ttl_arg, mode, *(wanted or ())]
        reply = await self._pending_script(_CLAIM, args, "claim pending calls")
        if reply is None:
            return None
        claimed, left = (self._pending_decode(entries) for entries in reply)
        if wanted is None:
            claimed.sort(key=lambda pair: pair[0])
        left = sorted(left, key=lambda pair: pair[0])
        return tuple(call for _, call in claimed), tuple(call for _, call in left)

    async def _pending_script(self, script: str, args: list[str], what: str) -> Any:
        from raf._sessions.redis import _FAILURES

        store = self._store
        client = store._require()
        try:
            return await _run(client, script, self._pending_keys, args)
        except _FAILURES as exc:
            store._fail(exc, what, self._id)

    def _pending_decode(self, entries: Sequence[Any]) -> list[tuple[Any, PendingCall]]:
        decoded: list[tuple[Any, PendingCall]] = []
        for entry in entries:
            try:
                data = json.loads(entry)
                decoded.append((tuple(data.get("order", ())), PendingCall.from_dict(data)))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise SessionStoreError(
                    f"{self._store._where}, session {self._id!r}: an entry of "
                    f"{self._pending_keys[1]} is not a stored PendingCall ({exc})"
                ) from exc
        return decoded


async def _run(client: Any, script: str, keys: list[str], args: list[str]) -> Any:
    from coredis.exceptions import NoScriptError

    sha = _SHA1[script]
    try:
        return await client.evalsha(sha, keys=keys, args=args)
    except NoScriptError:  # a restart or SCRIPT FLUSH dropped it: load it, send again once
        await client.script_load(script)
        return await client.evalsha(sha, keys=keys, args=args)


def _encode(data: object) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
