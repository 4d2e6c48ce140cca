"""PostgresSessionStore against a real PostgreSQL: the conformance suite, and what Postgres adds.

The server is the session-wide ``postgres_server`` fixture (tests/conftest.py,
Debian's PostgreSQL as an unprivileged user); each test gets its own table
prefix. Tests that freeze or stop the server start a dedicated one.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raf
from raf import REQUEST_HASH_LIMIT, ChatMessage, PostgresSessionStore, Session, request_hash
from raf.errors import SessionStoreError
from raf.testing import check_session_store
from raf.testing.conformance import (
    CHECKS,
    Check,
    check_round_trip_of_arbitrary_messages,
    run_checks,
)
from raf.testing.strategies import chat_messages
from tests._harness.cli import run_raf
from tests._harness.postgres_server import PostgresServer
from tests._harness.process import free_port
from tests._harness.tls import TLS

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent.toml"
_prefixes = itertools.count()
_ids = itertools.count()


@pytest.fixture
def prefix() -> str:
    """A table prefix of this test's own: tests share one server, never a table."""
    return f"t{uuid.uuid4().hex[:8]}_{next(_prefixes)}"


@pytest.fixture
async def store(
    postgres_server: PostgresServer, prefix: str
) -> AsyncIterator[PostgresSessionStore]:
    async with PostgresSessionStore(postgres_server.url(), prefix=prefix) as opened:
        yield opened


@pytest.fixture
def admin(postgres_server: PostgresServer) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain psycopg connection, to look at and spoil what the store wrote."""
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        yield conn


@pytest.fixture
def dedicated() -> Iterator[PostgresServer]:
    """A server of this test's own, for tests that freeze or stop it."""
    with PostgresServer() as server:
        yield server


# --- The Session conformance suite ----------------------------------------------------


class PostgresHarness:
    """Postgres sessions: reopening is a second store (its own connections) on the database."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.stores: list[PostgresSessionStore] = []

    async def open(self) -> PostgresSessionStore:
        store = await PostgresSessionStore(self.url, prefix=self.prefix).open()
        self.stores.append(store)
        return store

    async def new(self) -> Session:
        store = self.stores[0] if self.stores else await self.open()
        return await store.get(f"session-{next(_ids)}")

    async def reopen(self, session: Session) -> Session:
        return await (await self.open()).get(session.id)

    async def aclose(self) -> None:
        for store in self.stores:
            await store.aclose()


@asynccontextmanager
async def postgres_harness(url: str, prefix: str) -> AsyncIterator[PostgresHarness]:
    opened = PostgresHarness(url, prefix)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def harness(postgres_server: PostgresServer, prefix: str) -> AsyncIterator[PostgresHarness]:
    async with postgres_harness(postgres_server.url(), prefix) as opened:
        yield opened


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__ for check in CHECKS])
async def test_conformance(harness: PostgresHarness, check: Check) -> None:
    await check(harness)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(st.lists(chat_messages(tool_traffic=True), max_size=8), max_size=4))
async def test_round_trip_of_arbitrary_messages(
    harness: PostgresHarness, batches: list[list[ChatMessage]]
) -> None:
    await check_round_trip_of_arbitrary_messages(harness, batches)


async def test_run_checks_runs_the_whole_suite(harness: PostgresHarness) -> None:
    await run_checks(harness)


def test_check_session_store_passes_on_asyncio_and_trio(
    postgres_server: PostgresServer, prefix: str
) -> None:
    stores: list[PostgresSessionStore] = []

    async def fresh() -> Session:
        # A store per session: each backend's event loop runs its own calls.
        store = await PostgresSessionStore(postgres_server.url(), prefix=prefix).open()
        stores.append(store)
        return await store.get(f"session-{len(stores)}")

    async def close() -> None:
        for store in stores:
            await store.aclose()

    try:
        check_session_store(fresh)
    finally:
        anyio.run(close)
    assert len(stores) > len(CHECKS)  # both backends made sessions


# --- The store ---------------------------------------------------------------------------


@pytest.mark.slow
def test_import_raf_does_not_import_psycopg() -> None:
    code = (
        "import sys, raf\n"
        "assert 'psycopg' not in sys.modules, 'import raf imported psycopg'\n"
        "store = raf.PostgresSessionStore\n"
        "assert 'psycopg' in sys.modules\n"
        "assert store.__module__ == 'raf'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    assert raf.PostgresSessionStore is PostgresSessionStore


async def test_tables_under_the_prefix_hold_raf_json(
    store: PostgresSessionStore, admin: psycopg.Connection[tuple[object, ...]], prefix: str
) -> None:
    session = await store.get("alice")
    await session.add_messages([ChatMessage.user("h\u00e9"), ChatMessage.assistant("yo")])
    rows = admin.execute(
        f"SELECT seq, message FROM {prefix}_messages WHERE session_id = 'alice' ORDER BY seq"
    ).fetchall()
    assert rows == [
        (1, '{"role":"user","content":"hé"}'),
        (2, '{"role":"assistant","content":"yo"}'),
    ]
    tables = admin.execute(
        "SELECT tablename FROM pg_tables WHERE tablename LIKE %s ORDER BY 1", (f"{prefix}_%",)
    ).fetchall()
    assert [name for (name,) in tables] == [
        f"{prefix}_{table}"
        for table in ("last_calls", "messages", "once", "pending", "requests", "sessions")
    ]
    assert await store.session_ids() == ["alice"]


async def test_prefixes_keep_stores_apart(postgres_server: PostgresServer, prefix: str) -> None:
    async with (
        PostgresSessionStore(postgres_server.url(), prefix=f"{prefix}_a") as one,
        PostgresSessionStore(postgres_server.url(), prefix=f"{prefix}_b") as two,
    ):
        await (await one.get("s")).add_messages([ChatMessage.user("a")])
        assert await (await two.get("s")).get_messages() == ()


async def test_a_batch_of_many_messages_is_one_contiguous_append(
    store: PostgresSessionStore,
) -> None:
    session = await store.get("big")
    batch = [ChatMessage.user(str(index)) for index in range(12_345)]
    await session.add_messages([ChatMessage.system("first")])
    await session.add_messages(batch)
    assert await session.get_messages() == (ChatMessage.system("first"), *batch)
    assert await session.count_messages() == 12_346


async def test_two_stores_writing_at_once_keep_every_batch_whole(
    postgres_server: PostgresServer, prefix: str
) -> None:
    async with (
        PostgresSessionStore(postgres_server.url(), prefix=prefix) as one,
        PostgresSessionStore(postgres_server.url(), prefix=prefix) as two,
    ):
        sessions = [await one.get("busy"), await two.get("busy")]

        async def write(writer: int) -> None:
            batch = [ChatMessage.user(f"{writer}:{i}") for i in range(3)]
            await sessions[writer % 2].add_messages(batch)

        async with anyio.create_task_group() as group:
            for writer in range(40):
                group.start_soon(write, writer)
        stored = [m.content or "" for m in await sessions[1].get_messages()]
    assert len(stored) == 120
    writers = []
    for start in range(0, 120, 3):
        writer = stored[start].split(":")[0]
        assert stored[start : start + 3] == [f"{writer}:{i}" for i in range(3)]
        writers.append(int(writer))
    assert sorted(writers) == list(range(40))


async def test_request_hashes_are_bounded_and_oldest_first(store: PostgresSessionStore) -> None:
    session = await store.get("hashes")
    requests = [[ChatMessage.user(f"request {index}")] for index in range(REQUEST_HASH_LIMIT + 6)]
    for request in requests:
        assert not (await session.touch_request_hash(request)).repeated
    recorded = await session.request_hashes()
    assert list(recorded) == [request_hash(r) for r in requests[6:]]
    assert not (await session.touch_request_hash(requests[0])).repeated
    assert (await session.touch_request_hash(requests[10])).repeated
    recorded = await session.request_hashes()
    assert len(recorded) == REQUEST_HASH_LIMIT
    assert list(recorded)[-2:] == [request_hash(requests[0]), request_hash(requests[10])]


async def test_a_warm_read_reads_only_what_is_new(
    store: PostgresSessionStore, admin: psycopg.Connection[tuple[object, ...]], prefix: str
) -> None:
    session = await store.get("warm")
    await session.add_messages([ChatMessage.user(str(n)) for n in range(100)])
    first = await session.get_messages()
    # An old row spoiled behind the store's back: a read of the whole history would fail
    # on it, a warm read never reads it.
    admin.execute(f"UPDATE {prefix}_messages SET message = 'spoiled' WHERE seq = 1")
    await session.add_messages([ChatMessage.user("mine")])
    async with PostgresSessionStore(store.dsn, prefix=prefix) as other:
        await (await other.get("warm")).add_messages([ChatMessage.user("theirs")])
        with pytest.raises(SessionStoreError, match=r"session 'warm': message 1 is not a stored"):
            await (await other.get("warm")).get_messages()  # a cold read reads it all
    again = await session.get_messages()
    assert again[:100] == first
    assert [m.content for m in again[100:]] == ["mine", "theirs"]
    assert [m.content for m in await session.get_last_messages(2)] == ["mine", "theirs"]


async def test_a_session_read_by_its_tail_reads_only_the_tail(
    store: PostgresSessionStore, admin: psycopg.Connection[tuple[object, ...]], prefix: str
) -> None:
    session = await store.get("window")
    await session.add_messages([ChatMessage.user(str(n)) for n in range(10)])
    admin.execute(f"UPDATE {prefix}_messages SET message = 'spoiled' WHERE seq <= 5")
    async with PostgresSessionStore(store.dsn, prefix=prefix) as other:
        reader = await other.get("window")
        for turn in range(5):
            assert [m.content for m in await reader.get_last_messages(3)][-1] == str(9 + 2 * turn)
            await reader.add_messages([ChatMessage.user(str(10 + 2 * turn + n)) for n in range(2)])
        assert [m.content for m in await reader.get_last_messages(4)] == ["16", "17", "18", "19"]
        assert await reader.count_messages() == 20


async def test_a_session_deleted_and_written_again_is_not_taken_for_the_old_one_grown(
    store: PostgresSessionStore, admin: psycopg.Connection[tuple[object, ...]], prefix: str
) -> None:
    session = await store.get("again")
    await session.add_messages([ChatMessage.user("old 1"), ChatMessage.user("old 2")])
    assert len(await session.get_messages()) == 2
    admin.execute(f"DELETE FROM {prefix}_sessions WHERE id = 'again'")
    async with PostgresSessionStore(store.dsn, prefix=prefix) as other:
        batch = [ChatMessage.user(f"new {n}") for n in (1, 2, 3)]
        await (await other.get("again")).add_messages(batch)
    assert [m.content for m in await session.get_messages()] == ["new 1", "new 2", "new 3"]


async def test_ttl_is_put_again_by_every_write(
    postgres_server: PostgresServer, prefix: str, admin: psycopg.Connection[tuple[object, ...]]
) -> None:
    def seconds_left() -> float:
        row = admin.execute(
            f"SELECT extract(epoch FROM expires_at - now()) FROM {prefix}_sessions"
        ).fetchone()
        assert row is not None
        return float(row[0])  # type: ignore[arg-type]

    async with PostgresSessionStore(postgres_server.url(), prefix=prefix, ttl=1000) as store:
        session = await store.get("s")
        await session.touch_request_hash([ChatMessage.user("q")])
        assert 990 < seconds_left() <= 1000
        for write in (
            session.add_messages([ChatMessage.user("q")]),
            session.touch_request_hash([ChatMessage.user("q2")]),
        ):
            admin.execute(f"UPDATE {prefix}_sessions SET expires_at = now() + interval '5 s'")
            await write
            assert 990 < seconds_left() <= 1000
    async with PostgresSessionStore(postgres_server.url(), prefix=prefix) as store:
        await (await store.get("s")).add_messages([ChatMessage.user("no ttl")])
        assert 990 < seconds_left() <= 1000  # a store without a ttl removes none


@pytest.mark.slow
async def test_an_expired_session_starts_again_empty(
    postgres_server: PostgresServer, prefix: str
) -> None:
    async with PostgresSessionStore(postgres_server.url(), prefix=prefix, ttl=0.5) as store:
        session = await store.get("short-lived")
        await session.add_messages([ChatMessage.user("soon gone")])
        await session.touch_request_hash([ChatMessage.user("soon gone")])
        assert len(await session.get_messages()) == 1
        with anyio.fail_after(10):
            while await session.get_messages():  # noqa: ASYNC110  (the server's clock expires it)
                await anyio.sleep(0.1)
        assert await session.request_hashes() == {}
        assert await store.session_ids() == []
        assert not (await session.touch_request_hash([ChatMessage.user("soon gone")])).repeated
        async with PostgresSessionStore(postgres_server.url(), prefix=prefix) as without_ttl:
            await (await without_ttl.get("short-lived")).add_messages([ChatMessage.user("new")])
        assert [m.content for m in await session.get_messages()] == ["new"]


def test_the_sessions_guide_example_runs(
    postgres_server: PostgresServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/sessions.md's PostgreSQL example, pointed at the test server."""
    guide = (ROOT / "docs" / "sessions.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", guide, re.DOTALL) if "Postgres" in b]
    assert len(blocks) == 1
    code = blocks[0].replace("postgresql://raf@127.0.0.1:5432/postgres", postgres_server.url())
    exec(compile(code, "docs/sessions.md", "exec"), {"__name__": "guide"})
    assert capsys.readouterr().out == "Hello again\n"


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="connection string"):
        PostgresSessionStore("postgresql://host:notaport/x?bad=1")
    with pytest.raises(ValueError, match="prefix"):
        PostgresSessionStore("postgresql://h/d", prefix="Robert'); DROP TABLE")
    with pytest.raises(ValueError, match="ttl"):
        PostgresSessionStore("postgresql://h/d", ttl=0)
    for bad in (0, -1, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="timeout"):
            PostgresSessionStore("postgresql://h/d", timeout=bad)  # type: ignore[arg-type]
    assert PostgresSessionStore("postgresql://h/d").timeout == 10.0


async def test_session_ids_must_be_text_postgres_can_hold(store: PostgresSessionStore) -> None:
    for bad, said in (("", "non-empty str"), ("a\ud800", "lone surrogate"), ("a\x00", "NUL")):
        with pytest.raises(ValueError, match=said):
            await store.get(bad)


async def test_tasks_that_open_a_store_at_once_wait_for_its_tables(
    postgres_server: PostgresServer, prefix: str
) -> None:
    store = PostgresSessionStore(postgres_server.url(), prefix=prefix)
    seen: list[int] = []

    async def first_use(n: int) -> None:
        session = await store.get(f"s{n}")  # opens the store, or waits for its opening
        await session.add_messages([ChatMessage.user(str(n))])
        seen.append(len(await session.get_messages()))

    try:
        async with anyio.create_task_group() as group:
            for n in range(5):
                group.start_soon(first_use, n)
    finally:
        await store.aclose()
    assert seen == [1] * 5


async def test_a_stored_row_that_is_not_raf_json_is_named_and_left_alone(
    store: PostgresSessionStore, admin: psycopg.Connection[tuple[object, ...]], prefix: str
) -> None:
    session = await store.get("spoiled")
    await session.add_messages([ChatMessage.user("good"), ChatMessage.user("bad")])
    for garbage in ("not json", '{"no": "role"}', "[1, 2]", '"role"'):
        admin.execute(f"UPDATE {prefix}_messages SET message = %s WHERE seq = 2", (garbage,))
        async with PostgresSessionStore(store.dsn, prefix=prefix) as fresh:
            with pytest.raises(SessionStoreError, match=r"session 'spoiled': message 2 is not a"):
                await (await fresh.get("spoiled")).get_messages()
        row = admin.execute(f"SELECT message FROM {prefix}_messages WHERE seq = 2").fetchone()
        assert row == (garbage,)


async def test_a_store_used_after_it_was_closed_says_so(postgres_server: PostgresServer) -> None:
    async with PostgresSessionStore(postgres_server.url()) as store:
        session = await store.get("s")
    with pytest.raises(SessionStoreError, match="the store is closed"):
        await session.get_messages()
    with pytest.raises(SessionStoreError, match="the store is closed"):
        await store.open()


# --- Failures: a server that is down or frozen is a SessionStoreError, never a hang -------


async def _failure(call: Awaitable[object]) -> str:
    """The message of the SessionStoreError that ``call`` raises."""
    try:
        await call
    except SessionStoreError as exc:
        return str(exc)
    raise AssertionError("no SessionStoreError")


async def test_a_server_that_is_down_fails_on_opening() -> None:
    url = f"postgresql://raf:hunter2@127.0.0.1:{free_port()}/postgres"
    with anyio.fail_after(30):
        message = await _failure(PostgresSessionStore(url).open())
        assert "cannot reach the server" in message
        assert "hunter2" not in message  # the password is not printed
        store = PostgresSessionStore(url)
        assert "cannot reach the server" in await _failure(store.get("s"))  # first use opens


@pytest.mark.slow
async def test_a_frozen_server_is_a_timeout_error_on_every_call(dedicated: PostgresServer) -> None:
    async with PostgresSessionStore(dedicated.url(), timeout=0.5, max_connections=2) as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("kept")])
        with dedicated.frozen():
            # Cancelled while it waits on the server, on the connection kept from the write
            # above: the call returns at once, and its transaction is never committed.
            with anyio.fail_after(10), anyio.move_on_after(0.2) as scope:
                await session.add_messages([ChatMessage.user("cancelled")])
            assert scope.cancelled_caught
            for call, what in [
                (session.get_messages, "read the messages"),
                (partial(session.add_messages, [ChatMessage.user("late")]), "append 1 message"),
                (
                    partial(session.touch_request_hash, [ChatMessage.user("x")]),
                    "record the request",
                ),
                (session.request_hashes, "read the request hashes"),
                (session.claim_all_pending, "claim pending calls"),
            ]:
                with anyio.fail_after(10):
                    message = await _failure(call())
                # Each call after the first connects anew (a connection left is never reused):
                # the connecting times out.
                assert re.search(r"(cannot|reach the server to) " + what, message), message
                # (Or every connection is still busy with a call left: on trio, a thread
                # holds its place until it ends, at libpq's connect_timeout.)
                assert re.search(r"(did not answer|came free) within timeout=0\.5 s", message)
                assert "session 's'" in message
        # Thawed, the store goes on; the cancelled append was rolled back.
        with anyio.fail_after(30):
            assert [m.content for m in await session.get_messages()] == ["kept"]


@pytest.mark.slow
async def test_opening_a_frozen_server_is_a_timeout_error(dedicated: PostgresServer) -> None:
    with dedicated.frozen(), anyio.fail_after(10):
        message = await _failure(PostgresSessionStore(dedicated.url(), timeout=0.5).open())
    assert message.endswith(
        "cannot reach the server to open the store: it did not answer within timeout=0.5 s"
    )


@pytest.mark.slow
async def test_a_server_that_goes_away_is_a_clear_error(dedicated: PostgresServer) -> None:
    async with PostgresSessionStore(dedicated.url()) as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("hi")])
        assert dedicated.process is not None
        for pid in dedicated.pids():  # SIGKILL, the backends too: no goodbye to the clients
            os.kill(pid, signal.SIGKILL)
        dedicated.process.wait()
        with anyio.fail_after(30):
            message = await _failure(session.add_messages([ChatMessage.user("lost")]))
            assert re.search(
                "connection failed while trying to append 1 message|cannot reach", message
            )
            assert "cannot reach the server" in await _failure(session.get_messages())


# --- The command line --------------------------------------------------------------------


def test_raf_run_and_chat_keep_history_in_postgres(
    postgres_server: PostgresServer,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = f"{prefix}-cli"
    for url in (postgres_server.url(), postgres_server.url().replace("postgresql:", "postgres:")):
        args = ["--session", session, "--db", url, "--trace"]
        assert run_raf(["run", str(EXAMPLE), "first", *args]) == 0
    capsys.readouterr()
    lines = iter(["one", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    chat = ["chat", str(EXAMPLE), "--session", session, "--db", postgres_server.url()]
    assert run_raf(chat) == 0
    assert capsys.readouterr().out == "one\n"
    assert run_raf(["run", str(EXAMPLE), "last", *args]) == 0
    assert "(+6 messages)" in capsys.readouterr().err  # two runs and the chat turn, stored


def test_raf_run_with_postgres_down_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://raf@127.0.0.1:{free_port()}/postgres"
    assert run_raf(["run", str(EXAMPLE), "hi", "--session", "s", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"raf: PostgreSQL session store {url}: cannot reach the server")
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err


@pytest.mark.slow
def test_without_the_extra_the_db_flag_says_what_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None\n"  # as if the extra were not installed
        "from tests._harness.cli import run_raf\n"
        f"sys.exit(run_raf(['run', {str(EXAMPLE)!r}, 'hi', '--session', 's', "
        "'--db', 'postgresql://127.0.0.1/x']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("raf: --db: a PostgreSQL store needs the postgres extra: ")
    assert "pip install 'raf-agents[postgres]'" in line


@pytest.mark.slow
def test_raf_serve_with_postgres_down_is_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nname = "word-agent"\n[model]\nclient = "echo"\n')
    url = f"postgresql://raf@127.0.0.1:{free_port()}/postgres"
    done = subprocess.run(
        [sys.executable, "-m", "raf", "serve", str(config), "--db", url],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"raf: PostgreSQL session store {url}: cannot reach the server")


# --- Many processes, one database ----------------------------------------------------------


@pytest.fixture
def database(postgres_server: PostgresServer) -> str:
    """The URL of a new, empty database of this test's own."""
    name = f"d{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_server.url(name)


@pytest.mark.slow
async def test_processes_that_start_at_once_create_the_tables_once(database: str) -> None:
    """Eight processes open a store on an empty database at the same moment and write."""
    failures: list[str] = []

    async def writer(index: int) -> None:
        command = [sys.executable, "-m", "tests._harness.session_writer", "postgres", database]
        result = await anyio.run_process([*command, "shared", f"w{index}"], cwd=ROOT, check=False)
        if result.returncode != 0:
            failures.append(f"writer {index}: {result.stderr.decode()[-2000:]}")

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for index in range(8):
                group.start_soon(writer, index)
    assert not failures, "\n".join(failures)
    async with PostgresSessionStore(database) as store:
        stored = await (await store.get("shared")).get_messages()
    assert sorted(m.content or "" for m in stored) == [f"w{index}" for index in range(8)]


@pytest.mark.slow
async def test_four_processes_serve_one_conversation(
    postgres_server: PostgresServer, prefix: str, anyio_backend: str, tmp_path: Path
) -> None:
    """4 OS processes, each an Agent with HistoryProvider, run 60 turns of one session."""
    workers, turns = 4, 60
    failures: list[str] = []
    url = postgres_server.url()

    async def worker(index: int) -> None:
        command = [
            sys.executable, "-m", "tests._harness.postgres_worker", url, prefix, "shared",
            str(index), str(workers), str(turns), anyio_backend, str(tmp_path),
        ]  # fmt: skip
        result = await anyio.run_process(command, cwd=ROOT, check=False)
        if result.returncode != 0:
            failures.append(f"worker {index}: exit {result.returncode}\n{result.stderr.decode()}")

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for index in range(workers):
                group.start_soon(worker, index)
            # Start them together, once every process is up and connected.
            folder = anyio.Path(tmp_path)
            while len([p async for p in folder.glob("ready-*")]) < workers and not failures:  # noqa: ASYNC110
                await anyio.sleep(0.01)
            await (folder / "go").touch()
    assert not failures, "\n".join(failures)

    async with PostgresSessionStore(url, prefix=prefix) as store:
        session = await store.get("shared")
        stored = await session.get_messages()
        recorded = await session.request_hashes()
    assert len(stored) == 2 * turns
    # Each turn is its request then its answer, side by side, and appears exactly once.
    pairs = [(stored[i], stored[i + 1]) for i in range(0, len(stored), 2)]
    for request, answer in pairs:
        assert request.role == "user"
        assert answer == ChatMessage.assistant(request.content)
    assert sorted(request.content or "" for request, _ in pairs) == sorted(
        f"turn {turn}" for turn in range(turns)
    )
    assert len(recorded) == turns  # every run recorded its request's digest


@pytest.mark.slow
def test_raf_serve_workers_share_the_sessions_in_postgres(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Two uvicorn workers, `--db postgresql://...`: every turn of one session is kept."""
    import httpx2 as httpx

    from tests._harness.uvicorn_server import ServedAgent

    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\nname = "echo"\n[model]\nclient = "echo"\n[[providers]]\nkind = "memory"\n'
    )
    command = [sys.executable, "-m", "raf", "serve", str(config), "--workers", "2"]
    session = {"X-Session-Id": f"served-{uuid.uuid4().hex}"}
    with ServedAgent(command=[*command, "--db", postgres_server.url()]) as served:
        for turn in range(4):
            body = {"model": "echo", "messages": [{"role": "user", "content": f"turn {turn}"}]}
            reply = httpx.post(
                f"{served.url}/v1/chat/completions",
                json=body,
                headers=session,
                timeout=30,
                verify=TLS,
            )
            assert reply.status_code == 200, reply.text
        listed = httpx.get(
            f"{served.url}/v1/sessions/{session['X-Session-Id']}/messages", verify=TLS
        )
    stored = [(m["role"], m["content"]) for m in listed.json()["data"]]
    assert stored == [(role, f"turn {turn}") for turn in range(4) for role in ("user", "assistant")]


# --- Red team (issue 33 item 4): what broke, kept broken no more -----------------------------


def _backends(url: str) -> list[int]:
    """The process ids of the server's client connections, this one's aside."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() ORDER BY pid"
        ).fetchall()
    return [int(pid) for (pid,) in rows]  # type: ignore[call-overload]


def test_a_malformed_dsn_does_not_print_its_password() -> None:
    for dsn in ("postgresql://ann:p%zzhunter2@db/app", "host=db password=two hunter2"):
        with pytest.raises(ValueError, match="connection string") as caught:
            PostgresSessionStore(dsn)
        assert "hunter2" not in str(caught.value)


def test_a_password_libpq_reads_is_in_no_repr() -> None:
    for dsn in (
        "postgresql://ann:hunter2#x@db/app",  # libpq's password: 'hunter2#x'
        "postgresql://ann:hunter2?x@db/app",
        "postgresql://ann:hun@ter2@db/app",
        "postgresql://ann:hun/ter2@db/app",  # a / in the password: shown whole before
        "postgresql://ann:a/b/hunter2@db:5432/app?sslmode=disable",
        "postgres://ann:hun/ter2@db/app",
        "postgresql://db/app?user=ann&password=hunter2",
        r"host=db password=hun\ ter2 dbname=app",
    ):
        store = PostgresSessionStore(dsn)
        for shown in (repr(store), store.where):
            assert "ter2" not in shown, shown
            assert "***" in shown, shown


def test_a_ttl_postgres_cannot_add_to_a_time_is_a_value_error() -> None:
    for bad in (float("inf"), 1e300, 10**30):
        with pytest.raises(ValueError, match="ttl"):
            PostgresSessionStore("postgresql://h/d", ttl=bad)
    assert PostgresSessionStore("postgresql://h/d", ttl=10 * 365 * 86400).ttl == 315_360_000


@pytest.mark.slow
async def test_the_first_calls_after_a_server_restart_succeed(dedicated: PostgresServer) -> None:
    async with PostgresSessionStore(dedicated.url(), max_connections=4) as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("before")])
        async with anyio.create_task_group() as group:  # four idle connections kept
            for _ in range(4):
                group.start_soon(session.get_messages)
        await anyio.to_thread.run_sync(dedicated.restart)
        with anyio.fail_after(30):
            await session.add_messages([ChatMessage.user("after")])
            assert [m.content for m in await session.get_messages()] == ["before", "after"]


async def test_a_cancelled_call_leaves_the_other_connections_idle(
    postgres_server: PostgresServer, prefix: str
) -> None:
    url = postgres_server.url()
    async with PostgresSessionStore(url, prefix=prefix, max_connections=3) as store:
        sessions = [await store.get(f"s{n}") for n in range(3)]
        await sessions[0].add_messages([ChatMessage.user("x")])

        async with anyio.create_task_group() as group:  # a connection each, at once
            for n in range(3):
                group.start_soon(sessions[n].add_messages, [ChatMessage.user(str(n))])
        kept = set(_backends(url))
        with anyio.move_on_after(0.2) as scope:  # the writer is cancelled while it waits
            with psycopg.connect(url, autocommit=True) as locker, locker.transaction():
                locker.execute(f"SELECT 1 FROM {prefix}_sessions WHERE id = 's0' FOR UPDATE")
                await sessions[0].add_messages([ChatMessage.user("cancelled")])
        assert scope.cancelled_caught
        await sessions[1].get_messages()
        await sessions[2].get_messages()
        # The cancelled call's connection is gone; the others stay, the same backends.
        with anyio.fail_after(10):
            while len(set(_backends(url)) & kept) != len(kept) - 1:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert [m.content for m in await sessions[0].get_messages()] == ["x", "0"]


@pytest.mark.slow
async def test_a_store_with_every_connection_busy_says_so(
    postgres_server: PostgresServer, prefix: str
) -> None:
    url = postgres_server.url()
    async with PostgresSessionStore(url, prefix=prefix, max_connections=2, timeout=0.5) as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("x")])
        messages: list[str] = []

        async def write(n: int) -> None:
            messages.append(await _failure(session.add_messages([ChatMessage.user(str(n))])))

        with psycopg.connect(url, autocommit=True) as locker, locker.transaction():
            locker.execute(f"SELECT 1 FROM {prefix}_sessions WHERE id = 's' FOR UPDATE")
            with anyio.fail_after(10):
                async with anyio.create_task_group() as group:
                    for n in range(5):
                        group.start_soon(write, n)
        waited = [m for m in messages if "the server did not answer" in m]
        busy = [m for m in messages if "came free within timeout=0.5 s" in m]
        assert len(waited) == 2, messages
        assert len(busy) == 3, messages
        assert all("none of the store's max_connections=2" in m for m in busy)
        assert [m.content for m in await session.get_messages()] == ["x"]


async def test_a_key_or_token_no_store_can_write_is_a_value_error(
    store: PostgresSessionStore,
) -> None:
    session = await store.get("surrogates")
    call = raf.ToolCall("c", "lookup", "{}")
    for bad in (
        partial(session.add_once, "k\ud800", [ChatMessage.user("q")]),
        partial(session.record_pending, [], [raf.PendingCall(call, "t\ud800")]),
        partial(session.add_once, "k", [], [raf.PendingCall(call, "t", run_id="r\udfff")]),
    ):
        with pytest.raises(ValueError, match="lone surrogate"):
            await bad()
    assert await session.get_messages() == ()
    assert await session.list_pending() == ()
    # NUL is text UTF-8 holds, and JSON escapes it; PostgreSQL's text refuses it, clearly.
    with pytest.raises(SessionStoreError, match="cannot contain NUL"):
        await session.record_pending([], [raf.PendingCall(call, "t\x00")])
    await session.add_messages([ChatMessage.user("a\x00b")])
    assert [m.content for m in await session.get_messages()] == ["a\x00b"]


@pytest.mark.slow
async def test_turns_cancelled_at_any_moment_are_whole_or_absent_and_leak_nothing(
    postgres_server: PostgresServer, prefix: str
) -> None:
    """40 sessions on 4 connections, each turn cancelled after 0 to 40 ms or not at all."""
    url = postgres_server.url()
    before = len(_backends(url))
    delays = itertools.cycle([0.0, 0.001, 0.004, 0.01, 0.04, None])
    async with PostgresSessionStore(url, prefix=prefix, max_connections=4) as store:

        async def user(n: int) -> None:
            session = await store.get(f"s{n}")
            for turn in range(4):
                delay = next(delays)
                with anyio.move_on_after(math.inf if delay is None else delay):
                    await session.add_messages(
                        [ChatMessage.user(f"{turn}"), ChatMessage.assistant(f"{turn}")]
                    )
            stored = [m.content for m in await session.get_messages()]
            assert stored[::2] == stored[1::2], stored  # every turn whole
            assert len(stored) == 2 * len(set(stored)), stored  # and once

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for n in range(40):
                    group.start_soon(user, n)
            # The pool's, no more, once the left calls' connections are gone: a call
            # cancelled while its thread connects frees its slot at once, and its thread
            # closes that connection when the connect returns (the server ends the backend
            # soon after). A connection kept past the pool's would stay and fail this.
            while len(_backends(url)) - before > 4:  # noqa: ASYNC110
                await anyio.sleep(0.05)
    with anyio.fail_after(10):
        while len(_backends(url)) > before:  # noqa: ASYNC110  (closed: every one is gone)
            await anyio.sleep(0.05)
