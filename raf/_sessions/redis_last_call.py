"""The Redis store's record of a session's last model call (a hash per session).

Key ``{prefix}:{{id}}:last_call``: field ``at`` the time of the last model
call, one field ``cut:<key>`` per bounded view's start
(:class:`raf._sessions.cold.LastModelCall`). A write is one Lua script (the
fields, then the store's ttl again), so a view's start written by another
provider is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import anyio

from raf._sessions.cold import LastModelCall
from raf._sessions.redis_connection import FAILURES
from raf.errors import SessionStoreError

if TYPE_CHECKING:
    from raf._sessions.redis_connection import RedisConnection

__all__: list[str] = []

# Lua: KEYS[1] the record; ARGV[1] the ttl ("0": none), ARGV[2..] field, value, ...
_RECORD: Final = """
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
local ttl = tonumber(ARGV[1])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return 1
"""


def record_key(prefix: str, session_id: str) -> str:
    """The session's record key (in its hash slot, beside its other keys)."""
    return f"{prefix}:{{{session_id}}}:last_call"


async def read_last_call(store: RedisConnection, session_id: str) -> LastModelCall | None:
    """The session's record, or ``None`` when none was written."""
    key = record_key(store.prefix, session_id)
    try:
        with anyio.fail_after(store.timeout):
            fields = await store.client().hgetall(key)
    except FAILURES as exc:
        store.fail(exc, "read the last model call", session_id)
    if not fields:
        return None
    text = {_text(k): _text(v) for k, v in fields.items()}
    try:
        cuts = {k[4:]: int(v) for k, v in text.items() if k.startswith("cut:")}
        return LastModelCall(float(text["at"]), cuts)
    except (KeyError, ValueError) as exc:
        raise SessionStoreError(
            f"{store.where}, session {session_id!r}: {key} is not raf's record of the last "
            f"model call ({exc!r}); it was left as it is"
        ) from None


async def write_last_call(
    store: RedisConnection, session_id: str, at: float, cuts: Mapping[str, int]
) -> None:
    """Record ``at`` and ``cuts`` (over the fields there) and put the ttl again."""
    args = [store.ttl_arg, "at", repr(at)]
    for name, start in cuts.items():
        args += [f"cut:{name}", str(start)]
    try:
        with anyio.fail_after(store.timeout):
            key = record_key(store.prefix, session_id)
            await store.run_script(store.client(), _RECORD, (key,), args)
    except FAILURES as exc:
        store.fail(exc, "record the last model call", session_id, writing="it may not be kept")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
