"""Which stored session a request names: its id, scoped to the caller's key."""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any, Protocol

import anyio
from starlette.types import Scope

from raf._middleware.spend import SERVED_KEY
from raf._sessions.base import Session
from raf._sessions.memory import InMemorySession, fork_into
from raf._values.messages import ChatMessage, OnUpdate
from raf._values.run import Run, key_scope
from raf.serve._http import HttpError, header
from raf.serve._wire import new_messages

__all__: list[str] = []

_MAX_ID = 200
#: The session /healthz reads: not printable, so no client can name it (see session_key).
HEALTH_ID = "\x1fraf-healthz"


class Store(Protocol):
    """A session store: ``await store.get(session_id)`` returns its :class:`raf.Session`."""

    async def get(self, session_id: str) -> Session: ...


#: The sessions the server named itself (a ``/v1/responses`` request's, for a
#: ``previous_response_id`` that may never come) kept in memory for each key: the least
#: recently used go.
MAX_UNNAMED = 1000


class MemoryStore:
    """Sessions kept in this process: what a served agent uses when given no store.

    A session a client named is kept for the life of the process; those the server
    named itself (``unnamed``), the last :data:`MAX_UNNAMED` used of each key's
    ``scope``, so that one key's requests never push out another key's sessions.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, InMemorySession] = {}
        # Each key scope's own ids, least recently used first.
        self._unnamed: dict[str, dict[str, None]] = {}
        self._max_unnamed = MAX_UNNAMED

    async def get(self, session_id: str, *, unnamed: bool = False, scope: str = "") -> Session:
        """The session ``session_id``, made when new (``unnamed``: the server named it,
        bounded within the key ``scope``)."""
        session = self._sessions.get(session_id)
        ids = self._unnamed.get(scope)
        if session is None:
            session = self._sessions[session_id] = InMemorySession(session_id)
            if unnamed:
                ids = self._unnamed.setdefault(scope, {})
                ids[session_id] = None
        if ids is not None and session_id in ids:  # used again: the last to go
            del ids[session_id]
            ids[session_id] = None
            while len(ids) > self._max_unnamed:
                oldest = next(iter(ids))
                del ids[oldest], self._sessions[oldest]
        return session

    async def fork(self, session_id: str, new_id: str, *, at: int | None = None) -> Session:
        """The fork of a kept session (see :meth:`raf.InMemorySessionStore.fork`), kept as a
        session a client named."""
        return fork_into(self._sessions, session_id, new_id, at, "the served agent's sessions")

    def find(self, session_id: str) -> Session:
        """The session ``session_id`` if kept, else an empty one that is not (a read keeps
        nothing: a client reading unknown ids cannot fill the process)."""
        session = self._sessions.get(session_id)
        return InMemorySession(session_id) if session is None else session


class Keys:
    """The accepted bearer keys; each caller's sessions live under a scope of its key."""

    def __init__(self, keys: tuple[str, ...] | None) -> None:
        # Checked by ServeOptions: non-empty strings, or None for no keys.
        self._keys = keys

    @property
    def keyed(self) -> bool:
        """Whether a key is needed (``api_keys`` were given)."""
        return self._keys is not None

    def scope(self, scope: Scope) -> str:
        """The caller's scope: ``""`` without keys, else a digest of its key; 401 if none fits."""
        if self._keys is None:
            return ""
        given = header(scope, b"authorization") or ""
        kind, _, key = given.partition(" ")
        if kind.lower() == "bearer" and key:
            for known in self._keys:
                if hmac.compare_digest(known.encode(), key.strip().encode()):
                    return key_scope(known)
        raise HttpError(
            401,
            "a valid key is needed: send 'Authorization: Bearer KEY'",
            "authentication_error",
            "invalid_api_key",
            {"WWW-Authenticate": "Bearer"},
        )


async def unheld(session: Session, given: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The new messages of a request (those after its last assistant message) that the
    stored history does not already hold.

    The messages the history holds after the request's last assistant message
    (all of it, when the request has none), but for assistant messages, are
    left out when the new messages begin with them: a client that stopped a
    stream, whose question and partial answer were stored, and that resends
    the conversation without the partial answer, does not send its question
    twice. Anything else is new, as before.
    """
    new = new_messages(given)
    anchor = len(given) - len(new) - 1  # the request's last assistant message, if any
    # What a stopped turn leaves (its question and partial answer) is near the end.
    stored, whole = await _recent(session, 4 * len(new) + 8)
    tail: Sequence[ChatMessage] = stored
    if anchor < 0 and not whole:  # without an anchor, only a whole history can match
        return new
    if anchor >= 0:
        known = _seen(given[anchor])
        at = next((i for i in range(len(stored) - 1, -1, -1) if _seen(stored[i]) == known), None)
        if at is None:
            return new
        tail = stored[at + 1 :]
    asked = [message for message in tail if message.role != "assistant"]
    if not asked or len(asked) > len(new):
        return new
    if all(_seen(a) == _seen(b) for a, b in zip(asked, new, strict=False)):
        return new[len(asked) :]
    return new


async def _recent(session: Session, count: int) -> tuple[tuple[ChatMessage, ...], bool]:
    """The last ``count`` messages, and whether they are the whole history (a store
    without tail reads is read whole)."""
    last = getattr(session, "get_last_messages", None)
    stored: tuple[ChatMessage, ...] = (
        await session.get_messages() if last is None else await last(count + 1)
    )
    return stored[-count:], len(stored) <= count


def _seen(message: ChatMessage) -> tuple[Any, ...]:
    """What a client sees of a message (and can send back)."""
    return (message.role, message.content or None, message.tool_call_id, message.tool_calls)


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


def keyed_run(key_scope: str, sink: OnUpdate | None = None) -> Run:
    """The :class:`raf.Run` of a served turn, carrying the caller's key scope (see
    :meth:`Keys.scope`): what a ``raf.Budget(..., scope="key")`` spends."""
    run = Run(sink)
    run.state[SERVED_KEY] = key_scope
    return run
