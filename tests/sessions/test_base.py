"""Every Session implementation raf ships, through the conformance suite.

To add a store, add an entry to ``STORES``: a function of pytest's
``tmp_path`` that returns an async context manager yielding a
:class:`raf.testing.conformance.Harness` (skip inside it when the store's
server is not there).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raf import ChatMessage, InMemorySession, Session, SqliteSessionStore
from raf.testing import check_session_store
from raf.testing.conformance import (
    CHECKS,
    Check,
    FactoryHarness,
    Harness,
    check_round_trip_of_arbitrary_messages,
    run_checks,
)
from raf.testing.strategies import chat_messages

pytestmark = pytest.mark.anyio

_ids = itertools.count()


class SqliteHarness:
    """SQLite sessions: reopening opens the file again with a second store."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = SqliteSessionStore(path)
        self.others: list[SqliteSessionStore] = []

    async def new(self) -> Session:
        return await self.store.get(f"session-{next(_ids)}")

    async def reopen(self, session: Session) -> Session:
        other = SqliteSessionStore(self.path)
        self.others.append(other)
        return await other.get(session.id)

    async def aclose(self) -> None:
        for store in [self.store, *self.others]:
            await store.aclose()


@asynccontextmanager
async def memory_store(tmp_path: Path) -> AsyncIterator[Harness]:
    yield FactoryHarness(InMemorySession)


@asynccontextmanager
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = SqliteHarness(tmp_path / "sessions.db")
    try:
        yield harness
    finally:
        await harness.aclose()


#: The stores under test: name -> (tmp_path -> async context manager of a harness).
STORES: dict[str, Callable[[Path], AbstractAsyncContextManager[Harness]]] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
}


@pytest.fixture(params=sorted(STORES))
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    async with STORES[request.param](tmp_path) as opened:
        yield opened


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__ for check in CHECKS])
async def test_conformance(harness: Harness, check: Check) -> None:
    await check(harness)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(st.lists(chat_messages(tool_traffic=True), max_size=8), max_size=4))
async def test_round_trip_of_arbitrary_messages(
    harness: Harness, batches: list[list[ChatMessage]]
) -> None:
    await check_round_trip_of_arbitrary_messages(harness, batches)


async def test_run_checks_runs_the_whole_suite(harness: Harness) -> None:
    await run_checks(harness)


async def test_a_broken_store_is_named_by_the_rule_it_breaks() -> None:
    class Forgetful(InMemorySession):
        async def request_hashes(self) -> dict[str, float]:
            return {}

    with pytest.raises(AssertionError, match="check_request_hashes_have_one_shape"):
        await run_checks(FactoryHarness(Forgetful))


def test_check_session_store_runs_the_suite_on_both_backends() -> None:
    check_session_store(InMemorySession)


def test_check_session_store_takes_an_async_factory(tmp_path: Path) -> None:
    paths = iter(range(1000))

    async def fresh() -> Session:
        # A store per session: each backend's event loop opens its own.
        n = next(paths)
        return await SqliteSessionStore(tmp_path / f"s{n}.db").get(f"session-{n}")

    check_session_store(fresh)


def test_check_session_store_names_the_broken_rule() -> None:
    class Unordered(InMemorySession):
        async def get_messages(self) -> tuple[ChatMessage, ...]:
            return tuple(reversed(await super().get_messages()))

    with pytest.raises(AssertionError, match=r"check_session_store \(asyncio\): check_round_trip"):
        check_session_store(Unordered)


def test_the_sessions_guide_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each script of docs/sessions.md runs as written and prints what its comments say
    (they call ``anyio.run`` themselves, on its default backend)."""
    guide = Path(__file__).resolve().parents[2] / "docs" / "sessions.md"
    scripts = re.findall(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.DOTALL)
    # The Redis and PostgreSQL examples need a server: tests/sessions/test_redis.py and
    # test_postgres.py run them against one.
    scripts = [code for code in scripts if "SessionStore(" not in code or "Sqlite" in code]
    assert len(scripts) == 2
    monkeypatch.chdir(tmp_path)  # the first one writes conversations.db where it runs
    for run in range(2):
        for code in scripts:
            output = io.StringIO()
            with contextlib.redirect_stdout(output):
                exec(compile(code, str(guide), "exec"), {"__name__": "__example__"})
            expected = re.findall(r"print\(.*\)  # (.*)", code)
            assert output.getvalue().splitlines() == expected, (run, code)
