"""SqliteSessionStore under faults: a locked database, cancellation, corruption, read-only
files and stored rows that are not raf's. Every test runs on both anyio backends."""

from __future__ import annotations

import ctypes
import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

import raf._sessions.sqlite as sqlite_module
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ContextProvider,
    HistoryProvider,
    ScriptedChatClient,
    SqliteSessionStore,
)
from raf.errors import SessionStoreError

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteSessionStore]:
    async with SqliteSessionStore(db_path) as opened:
        yield opened


def texts(messages: Sequence[ChatMessage]) -> list[str | None]:
    return [m.content for m in messages]


@contextmanager
def write_lock(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection that holds the file's write lock until the block ends."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.execute("BEGIN IMMEDIATE")
        yield db
    finally:
        if db.in_transaction:
            db.rollback()
        db.close()


async def fill(path: Path, session_id: str, messages: Sequence[ChatMessage]) -> None:
    async with SqliteSessionStore(path) as store:
        await (await store.get(session_id)).add_messages(messages)


# -- calls queue in the event loop, not in threads ---------------------------------------------


async def test_queued_calls_hold_no_threads_and_a_queued_write_can_be_cancelled(
    store: SqliteSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await store.get("s")
    started, release = threading.Event(), threading.Event()
    encode = sqlite_module._encode

    def slow_encode(message: ChatMessage) -> str:
        if message.content == "slow":
            started.set()
            release.wait(20)
        return encode(message)

    monkeypatch.setattr(sqlite_module, "_encode", slow_encode)
    # More queued writes than anyio has worker threads by default.
    queued = anyio.to_thread.current_default_thread_limiter().total_tokens + 5
    cancelled_scope = anyio.CancelScope()
    cancelled_done = anyio.Event()

    async def cancelled_write() -> None:
        try:
            with cancelled_scope:
                await session.add_messages([ChatMessage.user("cancelled")])
        finally:
            cancelled_done.set()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.add_messages, [ChatMessage.user("slow")])
            await anyio.to_thread.run_sync(started.wait, 20)
            tasks.start_soon(cancelled_write)
            for index in range(queued):
                tasks.start_soon(session.add_messages, [ChatMessage.user(f"q{index}")])
            await anyio.wait_all_tasks_blocked()
            # An unrelated call still gets a thread while the slow write holds the store.
            with anyio.fail_after(10):
                assert await anyio.to_thread.run_sync(lambda: 42) == 42
            # A write still waiting its turn leaves as soon as it is cancelled.
            cancelled_scope.cancel()
            with anyio.fail_after(10):
                await cancelled_done.wait()
            assert not release.is_set()  # all of it while the slow write was still running
            release.set()
    finally:
        release.set()
    stored = texts(await session.get_messages())
    assert stored[0] == "slow"
    assert "cancelled" not in stored
    assert sorted(stored[1:]) == sorted(f"q{index}" for index in range(queued))


async def test_a_write_cancelled_while_another_connection_holds_the_lock_writes_nothing(
    store: SqliteSessionStore, db_path: Path
) -> None:
    session = await store.get("s")
    await session.add_messages([ChatMessage.user("before")])
    with write_lock(db_path):
        with anyio.move_on_after(0.3) as scope:
            await session.add_messages([ChatMessage.user("during")])
        assert scope.cancelled_caught
        # Cancelled without a deadline too: the store's thread notices and gives up.
        cancel = anyio.CancelScope()
        async with anyio.create_task_group() as tasks:

            async def write() -> None:
                with cancel:
                    await session.add_messages([ChatMessage.user("also during")])

            tasks.start_soon(write)
            await anyio.sleep(0.2)
            cancel.cancel()
    assert texts(await session.get_messages()) == ["before"]
    async with SqliteSessionStore(db_path) as other:
        assert texts(await (await other.get("s")).get_messages()) == ["before"]
    await session.add_messages([ChatMessage.user("after")])
    assert texts(await session.get_messages()) == ["before", "after"]


async def test_a_write_waits_for_the_lock_up_to_the_store_timeout(db_path: Path) -> None:
    async with SqliteSessionStore(db_path, timeout=0.3) as store:
        session = await store.get("s")
        with write_lock(db_path), pytest.raises(SessionStoreError, match="gave up waiting"):
            await session.add_messages([ChatMessage.user("x")])
        await session.add_messages([ChatMessage.user("y")])
        assert texts(await session.get_messages()) == ["y"]


# -- post stages of a cancelled run are bounded ------------------------------------------------


class LocksTheStore:
    """Chat middleware: another connection takes the file's write lock during the model call."""

    def __init__(self, path: Path, *, hang: bool = False) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.hang = hang
        self.closed = False

    async def __call__(self, request: Any, call_next: Any) -> AgentResponse:
        self.db.execute("BEGIN IMMEDIATE")
        if self.hang:
            await anyio.sleep_forever()
        response: AgentResponse = await call_next(request)
        return response

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.db.in_transaction:
            self.db.rollback()
        self.db.close()


class NotesInterruptions(ContextProvider):
    """Writes a note to the session when a run fails (a post stage that writes on cancellation)."""

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if error is not None:
            await session.add_messages([ChatMessage.assistant("(interrupted)")])


@pytest.mark.parametrize("post_stage", ["history save", "note on cancellation"])
@pytest.mark.slow
async def test_a_cancelled_run_on_a_locked_store_returns_within_post_timeout(
    db_path: Path, post_stage: str
) -> None:
    locker = LocksTheStore(db_path, hang=post_stage == "note on cancellation")
    try:
        async with SqliteSessionStore(db_path) as store:  # timeout: the default 30 s
            session = await store.get("s")
            await session.add_messages([ChatMessage.user("before")])
            agent = Agent(
                ScriptedChatClient(["answer"]),
                stack=[NotesInterruptions(), HistoryProvider()],
                chat_stack=[locker],
                post_timeout=2,
            )
            started = anyio.current_time()
            with anyio.move_on_after(0.5):
                await agent.run("hello", session=session)
            # Two post stages of at most 2 s each, not SQLite's 30 s busy timeout (wide: the
            # suite runs on shared machines).
            assert anyio.current_time() - started < 15
            locker.close()
            # Whatever the abandoned worker thread did, the session agrees with the file.
            mine = texts(await session.get_messages())
            async with SqliteSessionStore(db_path) as other:
                assert texts(await (await other.get("s")).get_messages()) == mine
            assert mine[0] == "before"
            await session.add_messages([ChatMessage.user("after")])
            assert texts(await session.get_messages()) == [*mine, "after"]
    finally:
        locker.close()


# -- corruption ------------------------------------------------------------------------------


def corrupt_index_page(path: Path) -> None:
    """Empty the message index's root page in place: SQLite then reads a short history
    without any error, the corruption this store must catch."""
    db = sqlite3.connect(path)
    try:
        (page,) = db.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'raf_messages_by_session'"
        ).fetchone()
        (size,) = db.execute("PRAGMA page_size").fetchone()
    finally:
        db.close()
    with open(path, "r+b") as file:
        file.seek((page - 1) * size + 1)
        file.write(bytes(7))  # the b-tree page header after its type: no cells


def zero_table_page(path: Path) -> None:
    """Zero the first leaf page of the messages table."""
    db = sqlite3.connect(path)
    try:
        (size,) = db.execute("PRAGMA page_size").fetchone()
        (pages,) = db.execute("PRAGMA page_count").fetchone()
    finally:
        db.close()
    with open(path, "r+b") as file:
        file.seek((pages - 2) * size)
        file.write(bytes(size))


TWO_HUNDRED = [ChatMessage.user(f"message {i} " + "x" * 300) for i in range(200)]


async def test_a_corrupt_index_is_an_error_not_a_short_history(db_path: Path) -> None:
    await fill(db_path, "s", TWO_HUNDRED)
    corrupt_index_page(db_path)
    with sqlite3.connect(db_path) as raw:  # what a plain query now returns: fewer rows, no error
        rows = raw.execute(
            "SELECT message FROM raf_messages WHERE session_id = 's' AND seq > 0 ORDER BY seq"
        ).fetchall()
    raw.close()
    assert len(rows) < 200
    before = await anyio.Path(db_path).read_bytes()
    async with SqliteSessionStore(db_path) as store:
        with pytest.raises(SessionStoreError, match=r"sessions\.db: the database file is corrupt"):
            await (await store.get("s")).get_messages()
    assert await anyio.Path(db_path).read_bytes() == before  # left as it is


async def test_corruption_found_after_opening_refuses_the_store(db_path: Path) -> None:
    await fill(db_path, "s", TWO_HUNDRED)
    async with SqliteSessionStore(db_path) as store:
        session = await store.get("s")  # opened and checked while sound
        zero_table_page(db_path)
        with sqlite3.connect(db_path) as other:  # a write elsewhere: the store rereads the file
            other.execute("INSERT INTO raf_meta (key, value) VALUES ('touched', 'yes')")
        other.close()
        with pytest.raises(SessionStoreError, match=r"sessions\.db: the database file is corrupt"):
            await session.get_messages()
        # From now on the store refuses, even calls that would not touch the bad page.
        with pytest.raises(SessionStoreError, match="corrupt"):
            await (await store.get("other")).request_hashes()


# -- rows that are not raf's -----------------------------------------------------------------

DEEP = 100_000

BAD_ROWS = {
    "deeply nested array": "[" * DEEP + "]" * DEEP,
    "deeply nested content": '{"role": "user", "content": '
    + '{"a":' * DEEP
    + "1"
    + "}" * DEEP
    + "}",
    "not JSON": "garbage",
    "a JSON list": '["role"]',
    "a JSON string": '"role"',
    "no role": '{"content": "x"}',
    "an unknown role": '{"role": "robot", "content": "x"}',
    "content a number": '{"role": "user", "content": 5}',
    "tool_calls an object": '{"role": "assistant", "tool_calls": {"id": "1"}}',
    "a tool call without an id": '{"role": "assistant", "tool_calls": [{"name": "x"}]}',
    "a tool call a number": '{"role": "assistant", "tool_calls": [5]}',
}


@pytest.mark.parametrize("row", sorted(BAD_ROWS))
async def test_a_stored_row_that_is_not_rafs_is_a_clear_error(db_path: Path, row: str) -> None:
    await fill(db_path, "s", [ChatMessage.user("fine")])
    with sqlite3.connect(db_path) as db:
        db.execute(
            "INSERT INTO raf_messages (session_id, message) VALUES ('s', ?)", (BAD_ROWS[row],)
        )
    db.close()
    async with SqliteSessionStore(db_path) as store:
        with pytest.raises(SessionStoreError, match=r"sessions\.db: message row 2 of session 's'"):
            await (await store.get("s")).get_messages()


async def test_a_stored_row_that_is_not_text_is_a_clear_error(db_path: Path) -> None:
    await fill(db_path, "s", [ChatMessage.user("fine")])
    with sqlite3.connect(db_path) as db:
        db.execute("INSERT INTO raf_messages (session_id, message) VALUES ('s', x'00ff')")
    db.close()
    async with SqliteSessionStore(db_path) as store:
        with pytest.raises(SessionStoreError, match="row 2 of session 's' is not text but bytes"):
            await (await store.get("s")).get_messages()


# -- read-only -------------------------------------------------------------------------------


async def test_a_store_opened_read_only_reads_and_never_writes(db_path: Path) -> None:
    await fill(db_path, "s", [ChatMessage.user("hi"), ChatMessage.assistant("hello")])
    async with SqliteSessionStore(db_path) as writer:
        await (await writer.get("s")).touch_request_hash([ChatMessage.user("hi")])
    before = await anyio.Path(db_path).read_bytes()
    async with SqliteSessionStore(db_path, read_only=True) as store:
        session = await store.get("s")
        assert texts(await session.get_messages()) == ["hi", "hello"]
        assert len(await session.request_hashes()) == 1
        assert await store.session_ids() == ["s"]
        assert await (await store.get("new")).get_messages() == ()
        with pytest.raises(SessionStoreError, match=r"sessions\.db is read-only \(opened with"):
            await session.add_messages([ChatMessage.user("no")])
        with pytest.raises(SessionStoreError, match="read-only"):
            await session.touch_request_hash([ChatMessage.user("no")])
        assert texts(await session.get_messages()) == ["hi", "hello"]
    assert await anyio.Path(db_path).read_bytes() == before


async def test_read_only_never_creates_a_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    async with SqliteSessionStore(path, read_only=True) as store:
        with pytest.raises(SessionStoreError, match=r"missing\.db: cannot open the file read-only"):
            await store.get("s")
    assert not path.exists()


READ_ONLY_PROBE = textwrap.dedent(
    """
    import json, sys
    import anyio
    from raf import ChatMessage, SqliteSessionStore
    from raf.errors import SessionStoreError

    async def main(path):
        out = {}
        async with SqliteSessionStore(path) as store:
            try:
                session = await store.get("s")
                out["history"] = [m.content for m in await session.get_messages()]
            except SessionStoreError as exc:
                out["read"] = str(exc)
            else:
                out["hashes"] = len(await session.request_hashes())
                out["ids"] = await store.session_ids()
                try:
                    await session.add_messages([ChatMessage.user("no")])
                except SessionStoreError as exc:
                    out["write"] = str(exc)
        print(json.dumps(out))

    anyio.run(main, sys.argv[1], backend=sys.argv[2])
    """
)


def _without_root_powers() -> None:
    """In the child, before exec: drop the capabilities that let root ignore file modes."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _can_drop_root_powers() -> bool:
    result = subprocess.run(
        [sys.executable, "-c", "open('/proc/self/status')"],
        preexec_fn=_without_root_powers,
        capture_output=True,
        check=False,
    )
    return result.returncode == 0


def read_without_write_access(folder: Path, anyio_backend: str) -> dict[str, Any]:
    """Make ``folder`` and its files read-only, and run READ_ONLY_PROBE on its sessions.db
    in a process that the file modes bind (as root: without CAP_DAC_OVERRIDE)."""
    as_root = os.geteuid() == 0
    if as_root and not _can_drop_root_powers():
        pytest.skip(
            "running as root without the right to drop CAP_DAC_OVERRIDE: modes not enforced"
        )
    for file in folder.iterdir():
        file.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    try:
        result = subprocess.run(
            [sys.executable, "-c", READ_ONLY_PROBE, str(folder / "sessions.db"), anyio_backend],
            cwd=ROOT,
            capture_output=True,
            check=False,
            timeout=60,
            preexec_fn=_without_root_powers if as_root else None,
        )
    finally:
        folder.chmod(0o755)
        for file in folder.iterdir():
            file.chmod(0o644)
    assert result.returncode == 0, result.stderr.decode()
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def copy_with_a_pending_wal(source: Path, folder: Path) -> None:
    """Copy a store while a writer holds a write in its -wal file (and no -shm)."""
    writer = sqlite3.connect(source, isolation_level=None)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute(
            "INSERT INTO raf_messages (session_id, message) VALUES ('s', ?)",
            ('{"role": "user", "content": "only in the wal"}',),
        )
        (folder / "sessions.db").write_bytes(source.read_bytes())
        (folder / "sessions.db-wal").write_bytes(Path(f"{source}-wal").read_bytes())
    finally:
        writer.close()


@pytest.mark.slow
async def test_a_file_that_cannot_be_written_can_be_read(
    tmp_path: Path, anyio_backend: str
) -> None:
    """A store in a folder and file the user may only read (chmod 0555 / 0444)."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    path = folder / "sessions.db"
    await fill(path, "s", [ChatMessage.user("hi"), ChatMessage.assistant("hello")])
    before = await anyio.Path(path).read_bytes()
    out = await anyio.to_thread.run_sync(read_without_write_access, folder, anyio_backend)
    assert out["history"] == ["hi", "hello"]
    assert out["hashes"] == 0
    assert out["ids"] == ["s"]
    assert "sessions.db is read-only (it cannot be written here)" in out["write"]
    assert await anyio.Path(path).read_bytes() == before
    assert [p.name async for p in anyio.Path(folder).iterdir()] == ["sessions.db"]


@pytest.mark.slow
async def test_a_read_only_folder_with_a_leftover_wal_file_is_a_clear_error(
    tmp_path: Path, anyio_backend: str
) -> None:
    """The one read-only case SQLite cannot read: a -wal file without its -shm."""
    source = tmp_path / "source.db"
    await fill(source, "s", [ChatMessage.user("hi")])
    folder = tmp_path / "readonly"
    folder.mkdir()
    copy_with_a_pending_wal(source, folder)
    out = await anyio.to_thread.run_sync(read_without_write_access, folder, anyio_backend)
    assert "sessions.db: cannot be read where it is" in out["read"]
    assert "sessions.db-wal" in out["read"]


# Moved from test_sqlite.py: it slows the private encoder to cancel a write midway.
async def test_a_write_cancelled_midway_is_all_or_nothing_and_the_cache_agrees(
    store: SqliteSessionStore, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await store.get("s")
    await session.add_messages([ChatMessage.user("before")])
    started, release = threading.Event(), threading.Event()
    encode = sqlite_module._encode

    def slow_encode(message: ChatMessage) -> str:
        started.set()
        release.wait(10)
        return encode(message)

    monkeypatch.setattr(sqlite_module, "_encode", slow_encode)
    scope = anyio.CancelScope()

    async def write() -> None:
        with scope:
            await session.add_messages([ChatMessage.user("during"), ChatMessage.assistant("ok")])

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(write)
            await anyio.to_thread.run_sync(started.wait, 10)
            scope.cancel()  # the caller leaves at once; its thread is still encoding
        assert not release.is_set()
    finally:
        release.set()
    monkeypatch.setattr(sqlite_module, "_encode", encode)
    # The thread finished after its caller left: it wrote nothing, and the cache agrees.
    assert texts(await session.get_messages()) == ["before"]
    async with SqliteSessionStore(db_path) as other:
        assert texts(await (await other.get("s")).get_messages()) == ["before"]
    await session.add_messages([ChatMessage.user("after")])
    assert texts(await session.get_messages()) == ["before", "after"]
