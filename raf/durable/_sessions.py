"""A session as a reference another process can reopen, and as a durable run writes it: once."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
from dbos import DBOS
from dbos import error as dbos_errors

from raf._sessions.base import Claimed, Session
from raf._sessions.memory import InMemorySession
from raf._sessions.sqlite import SqliteSession, SqliteSessionStore
from raf._sessions.stores import server_store, server_store_of
from raf._values.messages import ChatMessage, PendingCall
from raf.errors import DurableError

__all__ = ["SessionRef"]


@attrs.frozen
class SessionRef:
    """Where a durable run's session lives: what crosses DBOS instead of the session.

    ``kind`` is ``"sqlite"`` (``location`` the file's path), ``"redis"``
    (``location`` the server's URL) or ``"postgres"`` (``location`` the
    connection string), the last two with the store's ``prefix`` and
    ``ttl``. A recovering worker opens that store and gets ``session_id``.
    """

    kind: Literal["sqlite", "redis", "postgres"]
    location: str
    session_id: str
    prefix: str | None = None
    ttl: float | None = None

    @classmethod
    def of(cls, session: Session) -> SessionRef:
        """The reference of ``session``; a session no other process can reopen is a DurableError."""
        if isinstance(session, SqliteSession):
            path = session.store.path
            if str(path) == ":memory:":
                raise DurableError(
                    f"session {session.id!r} lives in an in-memory SQLite store, which no other "
                    "process can reopen: a durable run needs a store on disk (or Redis, or "
                    "PostgreSQL)"
                )
            # Absolute: the recovering worker may start in another folder.
            return cls("sqlite", os.path.abspath(path), session.id)
        if isinstance(session, InMemorySession):
            raise DurableError(
                "an InMemorySession lives in one process and dies with it, so a durable run "
                "cannot use it: use a SqliteSessionStore, RedisSessionStore or "
                "PostgresSessionStore session (or none)"
            )
        server = server_store_of(session)
        if server is not None:
            kind, location, prefix, ttl = server
            return cls(kind, location, session.id, prefix, ttl)
        raise DurableError(
            f"a durable run cannot reopen a {type(session).__name__} in another process: "
            "use a SqliteSessionStore, RedisSessionStore or PostgresSessionStore session (or none)"
        )

    @asynccontextmanager
    async def reopened(self) -> AsyncIterator[Session]:
        """The session, in a store opened for it and closed after."""
        if self.kind == "sqlite":
            store: Any = SqliteSessionStore(self.location)
        else:
            prefix = "raf" if self.prefix is None else self.prefix
            store = server_store(self.kind, self.location, prefix=prefix, ttl=self.ttl)
        async with store:
            yield await store.get(self.session_id)


class WrittenOnce:
    """The session as a durable run sees it: its writes keyed by the workflow id, so a replayed
    run writes nothing twice, and the calls a decision claimed handed over claimed.

    The n-th write of a run (``add_messages`` or ``record_pending``) is
    keyed ``"{workflow_id}:{n}"`` and goes to the store's
    ``add_once``: the run's post stages make the same writes in the
    same order when the run is recovered, so the ones already stored are
    skipped. Each pending call is stored with the workflow id (``run_id``):
    a decider finds the run that waits for it from the session.
    """

    __slots__ = ("_count", "_inner", "_workflow_id", "claimed", "superseded")

    def __init__(self, inner: Any, workflow_id: str, claimed: Claimed | None = None) -> None:
        self._inner = inner
        self._workflow_id = workflow_id
        self._count = 0
        #: The calls a decision claimed already (in the process that made it): the run's claim
        #: of exactly those tokens gets them, without asking the store again.
        self.claimed = claimed
        #: The runs whose waiting calls a new message claimed (to deny them), in this pass.
        self.superseded: set[str] = set()

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        """The history, oldest first, as long as it was when this read first ran.

        Its length is the step ``raf.history``: a run replayed after it stored
        its turn (a worker killed while the run waited for a decision) reads
        the history as it was then, not its own turn as a previous one.
        """
        messages: tuple[ChatMessage, ...] = await self._inner.get_messages()
        try:
            return messages[: await DBOS.run_step_async({"name": "raf.history"}, len, messages)]
        except dbos_errors.DBOSWorkflowCancelledError:
            return messages  # a cancelled run's post stages still store what it answered

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        """Append ``messages`` unless this run stored this append before its crash."""
        await self.record_pending(messages, ())

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None:
        """Append ``messages`` and record ``pending``, unless this run did before its crash."""
        calls = tuple(attrs.evolve(call, run_id=self._workflow_id) for call in pending)
        self._count += 1
        await self._inner.add_once(f"{self._workflow_id}:{self._count}", messages, calls)

    async def claim_pending(self, tokens: Sequence[str]) -> Claimed | None:
        """The calls handed over (with what still waits now), when ``tokens`` are theirs; else
        the store's claim, as the step ``raf.claim`` (a replay gets what it took)."""
        claimed = self.claimed
        if claimed is not None and sorted(tokens) == sorted(c.token for c in claimed[0]):
            self.claimed = None
            # What still waits is read now: the decider's look is stale (another decider may
            # have claimed the turn's other calls meanwhile).
            return claimed[0], await self._inner.list_pending()
        claim = self._inner.claim_pending
        return await DBOS.run_step_async({"name": "raf.claim"}, claim, tokens)

    async def claim_all_pending(self) -> tuple[PendingCall, ...]:
        """Every waiting call (a new message takes them to deny them), as the step ``raf.claim``.

        A replay gets the calls the claim took (the store has none left to
        give), so it tells their runs again with the same ``DBOS.send`` steps.
        """
        claim = self._inner.claim_all_pending
        claimed: tuple[PendingCall, ...] = await DBOS.run_step_async({"name": "raf.claim"}, claim)
        self.superseded |= {c.run_id for c in claimed if c.run_id is not None}
        return claimed

    def __getattr__(self, name: str) -> Any:  # the rest (its id included) is the session's own
        return getattr(self._inner, name)
