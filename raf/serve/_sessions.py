"""Which stored session a request names: its id, scoped to the caller's key."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Any, Protocol

import anyio
from starlette.types import Scope

from raf._errors import ConfigError
from raf._sessions.base import Session
from raf._sessions.memory import InMemorySession
from raf.serve._http import HttpError, header

__all__: list[str] = []

_MAX_ID = 200
#: The session /healthz reads: not printable, so no client can name it (see session_key).
HEALTH_ID = "\x1fraf-healthz"


class Store(Protocol):
    """A session store: ``await store.get(session_id)`` returns its :class:`raf.Session`."""

    async def get(self, session_id: str) -> Session: ...


class MemoryStore:
    """Sessions kept in this process: what a served agent uses when given no store."""

    def __init__(self) -> None:
        self._sessions: dict[str, InMemorySession] = {}

    async def get(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = InMemorySession(session_id)
        return session

    def find(self, session_id: str) -> Session:
        """The session ``session_id`` if kept, else an empty one that is not (a read keeps
        nothing: a client reading unknown ids cannot fill the process)."""
        session = self._sessions.get(session_id)
        return InMemorySession(session_id) if session is None else session


class Keys:
    """The accepted bearer keys; each caller's sessions live under a scope of its key."""

    def __init__(self, keys: Iterable[str] | None) -> None:
        if isinstance(keys, str):
            raise ConfigError("api_keys must be a list of keys, not one string")
        self._keys = tuple(keys) if keys is not None else None
        if self._keys is not None and (
            not self._keys or not all(isinstance(k, str) and k for k in self._keys)
        ):
            raise ConfigError("api_keys must be non-empty strings (or None for no keys)")

    def scope(self, scope: Scope) -> str:
        """The caller's scope: ``""`` without keys, else a digest of its key; 401 if none fits."""
        if self._keys is None:
            return ""
        given = header(scope, b"authorization") or ""
        kind, _, key = given.partition(" ")
        if kind.lower() == "bearer" and key:
            for known in self._keys:
                if hmac.compare_digest(known.encode(), key.strip().encode()):
                    return hashlib.sha256(known.encode()).hexdigest()[:24]
        raise HttpError(
            401,
            "a valid key is needed: send 'Authorization: Bearer KEY'",
            "authentication_error",
            "invalid_api_key",
            {"WWW-Authenticate": "Bearer"},
        )


def session_key(scope: str, session_id: str) -> str:
    """The stored id of a caller's session: two keys never share one."""
    if not session_id or len(session_id) > _MAX_ID or not session_id.isprintable():
        raise HttpError(
            400, f"a session id must be 1 to {_MAX_ID} printable characters", code="bad_session"
        )
    return f"{scope}:{session_id}" if scope else session_id


async def check_store(store: Any, within: float = 2.0) -> str | None:
    """``None`` when the store answers within ``within`` seconds, else why not."""
    try:
        with anyio.fail_after(within):
            session = await store.get(HEALTH_ID)
            await session.get_messages()
    except TimeoutError:
        return f"the session store did not answer within {within} s"
    except Exception as exc:
        return f"the session store failed: {type(exc).__name__}: {exc}"
    return None
