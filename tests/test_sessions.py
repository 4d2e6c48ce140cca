"""Every Session implementation raf ships, through the conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from raf import InMemorySession, Session, SqliteSessionStore
from tests.session_conformance import *  # noqa: F403

pytestmark = pytest.mark.anyio


class InMemoryHarness:
    """In-memory sessions: reopening is the same object (nothing outlives it)."""

    async def new(self, session_id: str) -> Session:
        return InMemorySession(session_id)

    async def reopen(self, session: Session) -> Session:
        return session


class SqliteHarness:
    """SQLite sessions: reopening opens the file again with a second store."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = SqliteSessionStore(path)
        self.others: list[SqliteSessionStore] = []

    async def new(self, session_id: str) -> Session:
        return await self.store.get(session_id)

    async def reopen(self, session: Session) -> Session:
        other = SqliteSessionStore(self.path)
        self.others.append(other)
        return await other.get(session.id)

    async def aclose(self) -> None:
        for store in [self.store, *self.others]:
            await store.aclose()


@pytest.fixture(params=["memory", "sqlite"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[object]:
    if request.param == "memory":
        yield InMemoryHarness()
        return
    sqlite = SqliteHarness(tmp_path / "sessions.db")
    try:
        yield sqlite
    finally:
        await sqlite.aclose()
