"""The spilled tool results of a Redis session: the hash ``{prefix}:{id}:spilled``.

:class:`raf.ToolOutputLimit` keeps the full text of a result it cut with the
session: one field per call id. With a ``ttl``, the hash gets it again when
a result is spilled or read, and with every run's request hash (the same
script that puts it on the session's other keys), so it lives as long as
the session it belongs to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import anyio

from raf._sessions.redis_connection import FAILURES
from raf.errors import SessionStoreError

if TYPE_CHECKING:
    from raf._sessions.redis_connection import RedisConnection

__all__: list[str] = []

# Lua: KEYS[1] the spilled hash; ARGV[1] the ttl ("0": none), ARGV[2] the call id, ARGV[3]
# the text. HSET fails on a key of another type before it writes.
_WRITE: Final = """
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
local ttl = tonumber(ARGV[1])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return 1
"""
# Lua: KEYS[1] the spilled hash; ARGV[1] the ttl, ARGV[2] the call id.
_READ: Final = """
local text = redis.call('HGET', KEYS[1], ARGV[2])
local ttl = tonumber(ARGV[1])
if text and ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return text
"""


def spilled_key(prefix: str, session_id: str) -> str:
    """The session's hash of spilled results (in the session's cluster slot)."""
    return f"{prefix}:{{{session_id}}}:spilled"


async def write_spilled(store: RedisConnection, session_id: str, call_id: str, text: str) -> None:
    """Keep ``text`` as the full result of ``call_id`` (replacing one kept before)."""
    key = spilled_key(store.prefix, session_id)
    client = store.client()
    try:
        with anyio.fail_after(store.timeout):
            await store.run_script(client, _WRITE, (key,), [store.ttl_arg, call_id, text])
    except FAILURES as exc:
        store.fail(exc, f"keep the full result of tool call {call_id!r}", session_id)


async def read_spilled(store: RedisConnection, session_id: str, call_id: str) -> str | None:
    """The full result kept for ``call_id``, or ``None``."""
    key = spilled_key(store.prefix, session_id)
    client = store.client()
    try:
        with anyio.fail_after(store.timeout):
            text = await store.run_script(client, _READ, (key,), [store.ttl_arg, call_id])
    except FAILURES as exc:
        store.fail(exc, f"read the full result of tool call {call_id!r}", session_id)
    if text is None:
        return None
    try:
        return text.decode() if isinstance(text, bytes) else str(text)
    except UnicodeDecodeError as exc:
        raise SessionStoreError(
            f"{store.where}, session {session_id!r}: the spilled result of call {call_id!r} "
            f"in {key} is not UTF-8 ({exc})"
        ) from exc
