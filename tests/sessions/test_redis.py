"""RedisSessionStore against a real redis-server: the conformance suite, and what Redis adds.

The server is the session-wide ``redis_server`` fixture (tests/_harness/redis_server.py);
each test gets its own key prefix. Tests that break the server (pause it, kill
connections, stop it) start a dedicated one.
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import coredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raf
from raf import (
    REQUEST_HASH_LIMIT,
    ChatMessage,
    RedisSessionStore,
    RequestHash,
    Session,
    request_hash,
)
from raf.errors import SessionStoreError
from raf.testing.conformance import (
    CHECKS,
    Check,
    check_round_trip_of_arbitrary_messages,
    run_checks,
)
from raf.testing.strategies import chat_messages
from tests._harness.cli import run_raf
from tests._harness.redis_server import RedisServer, free_port

pytestmark = [
    pytest.mark.anyio,
    # coredis (6.9) can leave the six memory streams of a connection object it never
    # ran unclosed, so they warn when collected, at a random later moment: seen only on
    # trio, now and then. Collected once at the module's end here (see _collect), not in
    # another module's test.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in.*MemoryObject:pytest.PytestUnraisableExceptionWarning"
    ),
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent.toml"
_prefixes = itertools.count()
_ids = itertools.count()


# A module fixture's teardown runs within the teardown of the module's last test (on each
# xdist worker, the last before it turns to another module), under this module's marks. Once
# per module, not per test: with the SDKs imported a full collection costs ~0.5 s; garbage
# collected on the way, by the collector itself, is collected within a test of this module.
@pytest.fixture(autouse=True, scope="module")
def _collect() -> Iterator[None]:
    yield
    gc.collect()


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own: tests share one server, never a key."""
    return f"test-{uuid.uuid4().hex[:8]}-{next(_prefixes)}"


@pytest.fixture
async def store(redis_server: RedisServer, prefix: str) -> AsyncIterator[RedisSessionStore]:
    async with RedisSessionStore(redis_server.url, prefix=prefix) as opened:
        yield opened


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[coredis.Redis[bytes]]:
    """A plain coredis client, to look at and spoil what the store wrote."""
    async with coredis.Redis.from_url(redis_server.url) as client:
        yield client


@pytest.fixture
def dedicated() -> Iterator[RedisServer]:
    """A server of this test's own, for tests that pause, cut or stop it."""
    with RedisServer() as server:
        yield server


# --- The Session conformance suite ----------------------------------------------------


class RedisHarness:
    """Redis sessions: reopening is a second store (a second connection pool) on the server."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.stores: list[RedisSessionStore] = []

    async def open(self) -> RedisSessionStore:
        store = await RedisSessionStore(self.url, prefix=self.prefix).open()
        self.stores.append(store)
        return store

    async def new(self) -> Session:
        store = self.stores[0] if self.stores else await self.open()
        return await store.get(f"session-{next(_ids)}")

    async def reopen(self, session: Session) -> Session:
        return await (await self.open()).get(session.id)

    async def aclose(self) -> None:
        for store in reversed(self.stores):
            await store.aclose()


@asynccontextmanager
async def redis_harness(url: str, prefix: str | None = None) -> AsyncIterator[RedisHarness]:
    """A harness on the server at ``url``, its stores closed at the end (in the same task)."""
    opened = RedisHarness(url, prefix or f"conformance-{uuid.uuid4().hex[:8]}")
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def harness(redis_server: RedisServer, prefix: str) -> AsyncIterator[RedisHarness]:
    async with redis_harness(redis_server.url, prefix) as opened:
        yield opened


# The suite, as tests/sessions/test_base.py runs it for the other stores (its STORES entries
# get only tmp_path; this store needs the session's server, so it runs here).
@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__ for check in CHECKS])
async def test_conformance(harness: RedisHarness, check: Check) -> None:
    await check(harness)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(st.lists(chat_messages(tool_traffic=True), max_size=8), max_size=4))
async def test_round_trip_of_arbitrary_messages(
    harness: RedisHarness, batches: list[list[ChatMessage]]
) -> None:
    await check_round_trip_of_arbitrary_messages(harness, batches)


async def test_run_checks_runs_the_whole_suite(harness: RedisHarness) -> None:
    await run_checks(harness)


# --- The store ---------------------------------------------------------------------------


@pytest.mark.slow
def test_import_raf_does_not_import_coredis() -> None:
    code = (
        "import sys, raf\n"
        "assert 'coredis' not in sys.modules, 'import raf imported coredis'\n"
        "store = raf.RedisSessionStore\n"
        "assert 'coredis' in sys.modules\n"
        "assert store.__module__ == 'raf'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
    assert raf.RedisSessionStore is RedisSessionStore
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        raf.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


async def test_one_list_per_session_in_raf_json(
    store: RedisSessionStore, admin: coredis.Redis[bytes], prefix: str
) -> None:
    session = await store.get("alice")
    assert session.keys == (f"{prefix}:{{alice}}:messages", f"{prefix}:{{alice}}:requests")
    await session.add_messages([ChatMessage.user("h\u00e9"), ChatMessage.assistant("yo")])
    assert await admin.type(session.keys[0]) == b"list"
    assert await admin.lrange(session.keys[0], 0, -1) == [
        '{"role":"user","content":"hé"}'.encode(),
        b'{"role":"assistant","content":"yo"}',
    ]


@pytest.mark.parametrize("ttl", [None, 1000])
async def test_a_batch_of_many_messages_is_one_contiguous_append(
    redis_server: RedisServer, prefix: str, ttl: int | None
) -> None:
    # More values than Lua's unpack() takes at once: with a ttl, the script appends in slices.
    async with RedisSessionStore(redis_server.url, prefix=prefix, ttl=ttl) as store:
        await _append_many(await store.get("big"))


async def _append_many(session: Session) -> None:
    batch = [ChatMessage.user(str(index)) for index in range(12_345)]
    await session.add_messages([ChatMessage.system("first")])
    await session.add_messages(batch)
    history = await session.get_messages()
    assert history == (ChatMessage.system("first"), *batch)


async def test_two_stores_writing_at_once_keep_every_batch_whole(
    redis_server: RedisServer, prefix: str
) -> None:
    async with (
        RedisSessionStore(redis_server.url, prefix=prefix) as one,
        RedisSessionStore(redis_server.url, prefix=prefix) as two,
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


async def test_a_server_that_lost_the_scripts_gets_them_again(
    redis_server: RedisServer, prefix: str, admin: coredis.Redis[bytes]
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix, ttl=1000) as store:
        await _scripts_come_back(await store.get("s"), admin)


async def _scripts_come_back(session: Session, admin: coredis.Redis[bytes]) -> None:
    await session.add_messages([ChatMessage.user("one")])
    await admin.script_flush()  # as after a restart of the server
    await session.add_messages([ChatMessage.user("two")])
    await admin.script_flush()
    assert (await session.touch_request_hash([ChatMessage.user("one")])).repeated is False
    assert [m.content for m in await session.get_messages()] == ["one", "two"]


async def test_prefixes_keep_stores_apart(redis_server: RedisServer, prefix: str) -> None:
    async with (
        RedisSessionStore(redis_server.url, prefix=f"{prefix}-a") as one,
        RedisSessionStore(redis_server.url, prefix=f"{prefix}-b") as two,
    ):
        await (await one.get("s")).add_messages([ChatMessage.user("a")])
        assert await (await two.get("s")).get_messages() == ()


async def test_request_hashes_are_bounded_and_oldest_first(store: RedisSessionStore) -> None:
    session = await store.get("hashes")
    requests = [[ChatMessage.user(f"request {index}")] for index in range(REQUEST_HASH_LIMIT + 6)]
    for request in requests:
        assert not (await session.touch_request_hash(request)).repeated
    recorded = await session.request_hashes()
    assert list(recorded) == [request_hash(r) for r in requests[6:]]
    times = list(recorded.values())
    assert times == sorted(times)
    # A digest that fell out of the record is not a repeat any more; a kept one is,
    # and touching it makes it the newest.
    assert not (await session.touch_request_hash(requests[0])).repeated
    assert (await session.touch_request_hash(requests[10])).repeated
    recorded = await session.request_hashes()
    assert len(recorded) == REQUEST_HASH_LIMIT
    assert list(recorded)[-2:] == [request_hash(requests[0]), request_hash(requests[10])]
    assert request_hash(requests[6]) not in recorded


async def test_concurrent_touches_of_one_request_see_exactly_one_first(
    redis_server: RedisServer, prefix: str
) -> None:
    request = [ChatMessage.user("retried by an impatient client")]
    async with (
        RedisSessionStore(redis_server.url, prefix=prefix) as one,
        RedisSessionStore(redis_server.url, prefix=prefix) as two,
    ):
        sessions = [await one.get("s"), await two.get("s")]
        results: list[RequestHash] = []

        async def touch(index: int) -> None:
            results.append(await sessions[index % 2].touch_request_hash(request))

        async with anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon(touch, index)
    assert sorted(result.repeated for result in results) == [False] + [True] * 19


async def test_ttl_is_put_again_on_both_keys_by_every_write(
    redis_server: RedisServer, prefix: str, admin: coredis.Redis[bytes]
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix, ttl=1000) as store:
        session = await store.get("s")
        messages_key, requests_key = session.keys
        await session.touch_request_hash([ChatMessage.user("q")])
        assert 990 < await admin.ttl(requests_key) <= 1000
        assert await admin.ttl(messages_key) == -2  # no list yet: nothing to expire
        await session.add_messages([ChatMessage.user("q")])
        for key in session.keys:
            await admin.expire(key, 5)  # as if time had passed
        await session.add_messages([ChatMessage.assistant("a")])
        assert [990 < await admin.ttl(key) <= 1000 for key in session.keys] == [True, True]
        for key in session.keys:
            await admin.expire(key, 5)
        await session.touch_request_hash([ChatMessage.user("q2")])
        assert [990 < await admin.ttl(key) <= 1000 for key in session.keys] == [True, True]


async def test_without_ttl_keys_never_expire(
    store: RedisSessionStore, admin: coredis.Redis[bytes]
) -> None:
    session = await store.get("s")
    await session.add_messages([ChatMessage.user("q")])
    await session.touch_request_hash([ChatMessage.user("q")])
    assert [await admin.ttl(key) for key in session.keys] == [-1, -1]


@pytest.mark.slow
async def test_an_expired_session_starts_again_empty(
    redis_server: RedisServer, prefix: str
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix, ttl=0.5) as store:
        session = await store.get("short-lived")
        await session.add_messages([ChatMessage.user("soon gone")])
        assert len(await session.get_messages()) == 1
        with anyio.fail_after(10):  # a part of a second is rounded up to 1 s
            while await session.get_messages():  # noqa: ASYNC110  (Redis expires it)
                await anyio.sleep(0.1)
        assert await session.request_hashes() == {}


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="redis:// URL"):
        RedisSessionStore("http://localhost:6379")
    with pytest.raises(ValueError, match="prefix"):
        RedisSessionStore(prefix="")
    with pytest.raises(ValueError, match="ttl"):
        RedisSessionStore(ttl=0)


async def test_session_ids_must_be_non_empty_strings(store: RedisSessionStore) -> None:
    with pytest.raises(ValueError, match="non-empty str"):
        await store.get("")


@pytest.mark.parametrize("session_id", ["a\ud800b", "\udcff"])
async def test_a_session_id_with_a_lone_surrogate_is_a_clear_value_error(
    store: RedisSessionStore, session_id: str
) -> None:
    async def write() -> None:
        session = await store.get(session_id)
        await session.add_messages([ChatMessage.user("hi")])

    with pytest.raises(ValueError, match="lone surrogate") as caught:
        await write()
    assert type(caught.value) is ValueError


# --- Failures: each a SessionStoreError that says which, and nothing stored is lost ---


async def test_a_server_that_is_down_fails_on_opening() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    with pytest.raises(SessionStoreError, match="cannot reach the server") as caught:
        async with RedisSessionStore(url):
            pass  # pragma: no cover
    assert "hunter2" not in str(caught.value)  # the password is not printed
    with pytest.raises(SessionStoreError, match="cannot reach the server"):
        await RedisSessionStore(url).open()


async def test_a_store_that_is_not_open_or_closed_says_so(redis_server: RedisServer) -> None:
    store = RedisSessionStore(redis_server.url)
    with pytest.raises(SessionStoreError, match="not open"):
        await store.get("s")
    async with store:
        session = await store.get("s")
    with pytest.raises(SessionStoreError, match="closed"):
        await session.get_messages()
    with pytest.raises(SessionStoreError, match="closed"):
        await store.open()


async def test_a_bad_item_is_a_type_error_before_anything_is_sent(
    redis_server: RedisServer,
) -> None:
    async with RedisSessionStore(redis_server.url) as store:
        session = await store.get("s")
    # The store is closed: had anything been sent, this would be a SessionStoreError.
    with pytest.raises(
        TypeError, match=r"add_messages\(messages\)\[1\] must be a ChatMessage, got str"
    ):
        await session.add_messages([ChatMessage.user("a"), "b"])  # type: ignore[list-item]


def _serve_garbage(listener: socket.socket, stop: threading.Event) -> None:
    """Answer every connection with an HTTP error, until ``stop`` is set."""
    listener.settimeout(0.05)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass


async def test_a_server_that_is_not_redis_fails_on_opening() -> None:
    stop = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=_serve_garbage, args=(listener, stop), daemon=True)
        thread.start()
        try:
            url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
            with (
                anyio.fail_after(30),
                pytest.raises(
                    SessionStoreError, match=r"127\.0\.0\.1.*does not answer as Redis does"
                ),
            ):
                async with RedisSessionStore(url):
                    pass  # pragma: no cover
        finally:
            stop.set()
            thread.join(10)


@pytest.mark.parametrize("ttl", [None, 1000])
async def test_a_connection_dropped_mid_write_stores_the_batch_whole_or_not_at_all(
    dedicated: RedisServer, ttl: int | None
) -> None:
    async with (
        RedisSessionStore(dedicated.url, ttl=ttl) as store,
        coredis.Redis.from_url(dedicated.url) as admin,
    ):
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("kept")])
        # Writes wait on the server while it is paused: the append is sent and in flight
        # when its connection is killed.
        await admin.client_pause(10_000, mode=coredis.PureToken.WRITE)
        failures: list[BaseException] = []

        async def append() -> None:
            try:
                await session.add_messages([ChatMessage.user("in flight"), ChatMessage.user("x")])
            except SessionStoreError as exc:
                failures.append(exc)

        try:
            with anyio.fail_after(30):
                async with anyio.create_task_group() as group:
                    group.start_soon(append)
                    # Until the server holds the append (a state of the server, not of ours).
                    while (await admin.info("clients"))["blocked_clients"] == 0:  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                    for client in await admin.client_list():
                        if client["cmd"] in ("rpush", "evalsha"):
                            await admin.client_kill(identifier=client["id"])
        finally:
            await admin.client_unpause()
        assert len(failures) == 1
        message = str(failures[0])
        assert "session 's'" in message
        assert "connection failed while trying to append 2 messages" in message
        assert "whole or not at all" in message
        # The store goes on with a new connection; what was stored is all there.
        assert [m.content for m in await session.get_messages()] == ["kept"]
        await session.add_messages([ChatMessage.user("after")])
        assert [m.content for m in await session.get_messages()] == ["kept", "after"]


async def _failure(call: Awaitable[object]) -> str:
    """The message of the SessionStoreError that ``call`` raises (the exception is dropped)."""
    try:
        await call
    except SessionStoreError as exc:
        return str(exc)
    raise AssertionError("no SessionStoreError")


# coredis leaves the memory streams of a connection it failed to open unclosed; they
# warn when collected. Collect them here, under this filter, not in a later test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_server_that_goes_away_is_a_clear_error(dedicated: RedisServer) -> None:
    async with RedisSessionStore(dedicated.url) as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("hi")])
        dedicated.stop()
        message = await _failure(session.add_messages([ChatMessage.user("lost")]))
        assert "connection failed while trying to append 1 message" in message
        assert "read the messages" in await _failure(session.get_messages())
        touch = session.touch_request_hash([ChatMessage.user("lost")])
        assert "record the request hash" in await _failure(touch)
    gc.collect()


async def test_a_key_of_another_type_is_refused_and_left_alone(
    redis_server: RedisServer, prefix: str, admin: coredis.Redis[bytes]
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix, ttl=100) as store:
        session = await store.get("s")
        messages_key, requests_key = session.keys
        await admin.set(messages_key, "someone else's string")
        await admin.hset(requests_key, {"field": "someone else's hash"})
        with pytest.raises(SessionStoreError, match=r"session 's'.*cannot append 1 message.*type"):
            await session.add_messages([ChatMessage.user("x")])
        with pytest.raises(SessionStoreError, match=r"cannot read the messages.*WrongType"):
            await session.get_messages()
        with pytest.raises(
            SessionStoreError, match=r"cannot record the request hash.*another type"
        ):
            await session.touch_request_hash([ChatMessage.user("x")])
        with pytest.raises(SessionStoreError, match=r"cannot read the request hashes"):
            await session.request_hashes()
        # Only one key of the wrong type: the script refuses before writing the other.
        await admin.delete([requests_key])
        with pytest.raises(SessionStoreError, match="type"):
            await session.touch_request_hash([ChatMessage.user("x")])
        assert await admin.exists([requests_key]) == 0
    assert await admin.get(messages_key) == b"someone else's string"
    assert await admin.ttl(messages_key) == -1  # no ttl was put on a key that is not ours


async def test_an_entry_that_is_not_raf_json_is_named_and_left_alone(
    store: RedisSessionStore, admin: coredis.Redis[bytes]
) -> None:
    session = await store.get("spoiled")
    await session.add_messages([ChatMessage.user("good")])
    messages_key = session.keys[0]
    for garbage in (b"not json", b'{"no": "role"}', b"[1, 2]", b"\xff\xfe", b'"role"'):
        await admin.delete([messages_key])
        await admin.rpush(messages_key, [b'{"role":"user","content":"good"}', garbage])
        with pytest.raises(SessionStoreError, match=r"session 'spoiled': entry 1 of .*spoiled"):
            await session.get_messages()
        assert await admin.lrange(messages_key, 0, -1) == [
            b'{"role":"user","content":"good"}',
            garbage,
        ]
    # Appending still works, and touches nothing already stored.
    await session.add_messages([ChatMessage.user("more")])
    assert (await admin.lrange(messages_key, 0, -1))[1:] == [
        b'"role"',
        b'{"role":"user","content":"more"}',
    ]


# --- The command line --------------------------------------------------------------------


def test_raf_run_keeps_history_in_redis(
    redis_server: RedisServer, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    session = f"{prefix}-cli"
    args = ["--session", session, "--db", redis_server.url, "--trace"]
    assert run_raf(["run", str(EXAMPLE), "first", *args]) == 0
    capsys.readouterr()
    assert run_raf(["run", str(EXAMPLE), "second", *args]) == 0
    out, err = capsys.readouterr()
    assert out == "second\n"
    assert "(+2 messages)" in err  # the second turn saw the first one, from Redis


def test_raf_chat_continues_a_conversation_kept_in_redis(
    redis_server: RedisServer,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    session = f"{prefix}-chat"
    lines = iter(["one", "two", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert run_raf(["chat", str(EXAMPLE), "--session", session, "--db", redis_server.url]) == 0
    assert capsys.readouterr().out == "one\ntwo\n"
    args = ["--session", session, "--db", redis_server.url, "--trace"]
    assert run_raf(["run", str(EXAMPLE), "three", *args]) == 0
    assert "(+4 messages)" in capsys.readouterr().err  # both chat turns, from Redis


def test_raf_run_with_redis_down_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert run_raf(["run", str(EXAMPLE), "hi", "--session", "s", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"raf: Redis session store {url}: cannot reach the server")
    assert "Traceback" not in err


# --- Many processes, one conversation ----------------------------------------------------


@pytest.mark.slow
async def test_four_processes_serve_one_conversation(
    redis_server: RedisServer, prefix: str, anyio_backend: str
) -> None:
    """4 OS processes, each an Agent with HistoryProvider, run 50 turns of one session."""
    workers, turns = 4, 50
    session_id = "shared"
    failures: list[str] = []

    async def worker(index: int) -> None:
        command = [
            sys.executable, "-m", "tests._harness.redis_worker", redis_server.url, prefix,
            session_id, str(index), str(workers), str(turns), anyio_backend,
        ]  # fmt: skip
        result = await anyio.run_process(command, cwd=ROOT, check=False)
        if result.returncode != 0:
            failures.append(f"worker {index}: exit {result.returncode}\n{result.stderr.decode()}")

    async with coredis.Redis.from_url(redis_server.url) as admin:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as group:
                for index in range(workers):
                    group.start_soon(worker, index)
                # Start them together, once every process is up and connected.
                ready = f"{prefix}:ready"
                while int(await admin.get(ready) or 0) < workers and not failures:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                await admin.set(f"{prefix}:go", "1")
    assert not failures, "\n".join(failures)

    async with RedisSessionStore(redis_server.url, prefix=prefix) as store:
        session = await store.get(session_id)
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
def test_the_deployment_example_moves_one_conversation_between_workers(
    redis_server: RedisServer,
) -> None:
    """docs/deployment.md: three stateless workers behind a queue, one conversation."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = ROOT / "examples" / "redis_workers.py"
    result = subprocess.run(
        [sys.executable, str(script), "demo", redis_server.url],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 6
    workers = set()
    for turn, line in enumerate(lines, start=1):
        prefix, _, worker = line.partition(": ")
        assert prefix == f"turn {turn}"
        # Whoever answers has seen every earlier turn: the history is in Redis.
        assert f"saw {2 * (turn - 1)} earlier messages, answering 'question {turn}'" in line
        workers.add(worker.split()[0])
    assert len(workers) > 1


def test_the_sessions_guide_example_runs(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/sessions.md's Redis example, pointed at the test server."""
    guide = (ROOT / "docs" / "sessions.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", guide, re.DOTALL) if "Redis" in b]
    assert len(blocks) == 1
    code = blocks[0].replace("redis://127.0.0.1:6379/0", redis_server.url)
    exec(compile(code, "docs/sessions.md", "exec"), {"__name__": "guide"})
    assert capsys.readouterr().out == "Hello again\n"


# --- Timeouts: a server that does not answer is an error, never a hang --------------------


@contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """The server stopped by SIGSTOP (connections stay open, nothing answers), then SIGCONT."""
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        server.process.send_signal(signal.SIGCONT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_frozen_server_is_a_timeout_error_on_every_call(dedicated: RedisServer) -> None:
    async with RedisSessionStore(dedicated.url, timeout=0.5) as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("kept")])
        with frozen(dedicated):
            for call, what in [
                (session.get_messages(), "read the messages"),
                (session.add_messages([ChatMessage.user("late")]), "append 1 message"),
                (session.touch_request_hash([ChatMessage.user("x")]), "record the request"),
                (session.request_hashes(), "read the request hashes"),
            ]:
                with anyio.fail_after(10):
                    message = await _failure(call)
                assert "did not answer within timeout=0.5 s" in message
                assert what in message
        # Thawed, the store goes on; the timed-out append is whole or absent, never a part.
        with anyio.fail_after(10):
            contents = [m.content for m in await session.get_messages()]
        assert contents in (["kept"], ["kept", "late"])
    gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_opening_a_frozen_server_is_a_timeout_error(dedicated: RedisServer) -> None:
    with frozen(dedicated), anyio.fail_after(10):
        message = await _failure(RedisSessionStore(dedicated.url, timeout=0.5).open())
    assert "did not answer within timeout=0.5 s" in message
    gc.collect()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_peer_that_accepts_but_never_answers_is_a_timeout_error_on_opening() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts (backlog), never reads
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        with anyio.fail_after(10):
            message = await _failure(RedisSessionStore(url, timeout=0.5).open())
    assert "did not answer within timeout=0.5 s" in message
    gc.collect()


def test_the_timeout_has_a_default_and_is_checked() -> None:
    assert RedisSessionStore().timeout == 10.0
    assert RedisSessionStore(timeout=None).timeout is None
    for bad in (0, -1, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="timeout"):
            RedisSessionStore(timeout=bad)  # type: ignore[arg-type]


async def test_what_a_store_read_is_bounded_least_recent_session_first(
    redis_server: RedisServer, prefix: str
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix, cache_messages=5) as store:
        one, two = await store.get("one"), await store.get("two")
        await one.add_messages([ChatMessage.user(f"1.{n}") for n in range(4)])
        await two.add_messages([ChatMessage.user(f"2.{n}") for n in range(4)])
        assert len(await one.get_messages()) == 4
        assert len(await two.get_messages()) == 4  # 8 > 5: the least recent one is forgotten
        assert [m.content for m in await one.get_last_messages(2)] == ["1.2", "1.3"]
        assert [m.content for m in await two.get_messages()] == [f"2.{n}" for n in range(4)]


async def test_a_warm_read_sees_what_was_appended_since(store: RedisSessionStore) -> None:
    session = await store.get("warm")
    await session.add_messages([ChatMessage.user(str(n)) for n in range(100)])
    first = await session.get_messages()
    await session.add_messages([ChatMessage.user("new")])
    again = await session.get_messages()
    assert again[:100] == first
    assert again[100].content == "new"


def test_cache_messages_must_be_a_count() -> None:
    with pytest.raises(ValueError, match="cache_messages"):
        RedisSessionStore(cache_messages=-1)


async def test_a_warm_read_sees_its_own_and_other_writers(
    redis_server: RedisServer, prefix: str
) -> None:
    async with (
        RedisSessionStore(redis_server.url, prefix=prefix) as mine,
        RedisSessionStore(redis_server.url, prefix=prefix) as theirs,
    ):
        session = await mine.get("shared")
        await session.add_messages([ChatMessage.user(str(n)) for n in range(50)])
        first = await session.get_messages()
        assert await session.get_messages() == first
        await session.add_messages([ChatMessage.user("mine")])
        own = await session.get_messages()
        assert [m.content for m in own[50:]] == ["mine"]
        await (await theirs.get("shared")).add_messages([ChatMessage.user("theirs")])
        grown = await session.get_messages()  # another store object wrote: seen
        assert [m.content for m in grown[50:]] == ["mine", "theirs"]
        assert grown[:51] == own


async def test_a_session_read_by_its_tail_keeps_the_window_not_every_turn_since(
    store: RedisSessionStore,
) -> None:
    session = await store.get("window")
    await session.add_messages([ChatMessage.user(str(n)) for n in range(10)])
    for turn in range(5):
        assert [m.content for m in await session.get_last_messages(3)][-1] == str(9 + 2 * turn)
        await session.add_messages([ChatMessage.user(str(10 + 2 * turn + n)) for n in range(2)])
    assert [m.content for m in await session.get_last_messages(4)] == ["16", "17", "18", "19"]
    whole = await session.get_messages()  # a whole read starts again from the first
    assert [m.content for m in whole] == [str(n) for n in range(20)]
    assert await session.get_last_messages(3) == whole[-3:]
