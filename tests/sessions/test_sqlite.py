"""SqliteSessionStore: what a durable store adds to the Session conformance suite."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from raf import REQUEST_HASH_LIMIT, ChatMessage, RequestHash, SqliteSessionStore, request_hash
from raf.errors import SessionStoreError

pytestmark = pytest.mark.anyio


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteSessionStore]:
    async with SqliteSessionStore(db_path) as opened:
        yield opened


@contextmanager
def raw_db(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection, committed and closed at the end."""
    db = sqlite3.connect(path)
    try:
        with db:
            yield db
    finally:
        db.close()


def texts(messages: object) -> list[str | None]:
    return [m.content for m in messages]  # type: ignore[attr-defined]


@pytest.mark.parametrize("session_id", ["a\ud800b", "\udcff", "x\udfff"])
async def test_a_session_id_with_a_lone_surrogate_is_a_clear_value_error(
    store: SqliteSessionStore, session_id: str
) -> None:
    # Not a raw UnicodeEncodeError from the first write: refused where the id comes in.
    async def write() -> None:
        session = await store.get(session_id)
        await session.add_messages([ChatMessage.user("hi")])

    with pytest.raises(ValueError, match="lone surrogate") as caught:
        await write()
    assert type(caught.value) is ValueError
    assert await store.session_ids() == []


async def test_file_is_created_in_wal_mode(store: SqliteSessionStore, db_path: Path) -> None:
    await store.get("s")
    with raw_db(db_path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_sessions_are_stored_with_their_first_write_and_listed(
    store: SqliteSessionStore, db_path: Path
) -> None:
    assert await store.session_ids() == []
    first = await store.get("alice")
    assert await store.get("alice") is first
    bob = await store.get("bob")
    carol = await store.get("carol")
    assert await store.session_ids() == []  # getting a session writes nothing
    await first.add_messages([ChatMessage.user("hi")])
    await bob.touch_request_hash([ChatMessage.user("hi")])
    async with SqliteSessionStore(db_path) as again:
        assert sorted(await again.session_ids()) == ["alice", "bob"]
        assert await (await again.get(carol.id)).get_messages() == ()


async def test_request_hashes_are_persisted_with_the_time(
    store: SqliteSessionStore, db_path: Path
) -> None:
    session = await store.get("s")
    request = [ChatMessage.user("hello")]
    touched = await session.touch_request_hash(request)
    assert touched == RequestHash(request_hash(request), repeated=False)
    async with SqliteSessionStore(db_path) as again:
        recorded = await (await again.get("s")).request_hashes()
        assert (await (await again.get("s")).touch_request_hash(request)).repeated
    assert list(recorded) == [touched.digest]
    first_seen = recorded[touched.digest]
    await session.touch_request_hash(request)
    assert (await session.request_hashes())[touched.digest] >= first_seen


async def test_the_request_hash_table_is_bounded_per_session(
    store: SqliteSessionStore, db_path: Path
) -> None:
    one, two = await store.get("one"), await store.get("two")
    for turn in range(REQUEST_HASH_LIMIT + 20):
        await one.touch_request_hash([ChatMessage.user(str(turn))])
    await two.touch_request_hash([ChatMessage.user("other")])
    with raw_db(db_path) as db:
        counts = dict(
            db.execute(
                "SELECT session_id, count(*) FROM raf_request_hashes GROUP BY session_id"
            ).fetchall()
        )
    assert counts == {"one": REQUEST_HASH_LIMIT, "two": 1}


async def test_another_store_sees_appends_from_this_one(db_path: Path) -> None:
    async with SqliteSessionStore(db_path) as one, SqliteSessionStore(db_path) as two:
        mine = await one.get("shared")
        theirs = await two.get("shared")
        await mine.add_messages([ChatMessage.user("a")])
        assert texts(await theirs.get_messages()) == ["a"]
        await theirs.add_messages([ChatMessage.assistant("b")])
        await mine.add_messages([ChatMessage.user("c")])
        assert texts(await mine.get_messages()) == ["a", "b", "c"]
        assert texts(await theirs.get_messages()) == ["a", "b", "c"]


async def test_two_stores_writing_at_once_lose_nothing(db_path: Path) -> None:
    async with SqliteSessionStore(db_path) as one, SqliteSessionStore(db_path) as two:
        sessions = [await one.get("busy"), await two.get("busy")]

        async def write(writer: int) -> None:
            batch = [ChatMessage.user(f"{writer}:{i}") for i in range(3)]
            await sessions[writer % 2].add_messages(batch)

        async with anyio.create_task_group() as group:
            for writer in range(30):
                group.start_soon(write, writer)
        stored = texts(await sessions[0].get_messages())
    assert len(stored) == 90
    for start in range(0, 90, 3):
        writer = str(stored[start]).split(":")[0]
        assert stored[start : start + 3] == [f"{writer}:{i}" for i in range(3)]


async def test_history_is_loaded_incrementally(store: SqliteSessionStore, db_path: Path) -> None:
    session = await store.get("s")
    await session.add_messages([ChatMessage.user("one"), ChatMessage.assistant("two")])
    loaded = await session.get_messages()
    assert await session.get_messages() is loaded
    # Spoil a row that is already loaded: only rows appended since are read again.
    with raw_db(db_path) as db:
        db.execute("UPDATE raf_messages SET message = 'garbage' WHERE seq = 1")
    await session.add_messages([ChatMessage.user("three")])
    assert texts(await session.get_messages()) == ["one", "two", "three"]
    # A store that has to read the spoiled row says which row of which file is bad.
    async with SqliteSessionStore(db_path) as fresh:
        with pytest.raises(SessionStoreError, match=r"sessions\.db.*row 1 of session 's'"):
            await (await fresh.get("s")).get_messages()


async def test_corrupt_file_is_a_clear_error_and_left_alone(db_path: Path) -> None:
    garbage = b"this is not a database, just some bytes " * 200
    await anyio.Path(db_path).write_bytes(garbage)
    store = SqliteSessionStore(db_path)
    with pytest.raises(SessionStoreError, match=r"sessions\.db.*not a usable SQLite database"):
        await store.get("s")
    await store.aclose()
    assert await anyio.Path(db_path).read_bytes() == garbage


async def test_foreign_database_is_refused_and_left_alone(db_path: Path) -> None:
    with raw_db(db_path) as db:
        db.execute("CREATE TABLE users (name TEXT)")
        db.execute("INSERT INTO users VALUES ('ann')")
    before = await anyio.Path(db_path).read_bytes()
    async with SqliteSessionStore(db_path) as store:
        with pytest.raises(SessionStoreError, match=r"sessions\.db.*not a raf session.*users"):
            await store.get("s")
    assert await anyio.Path(db_path).read_bytes() == before


async def test_unknown_schema_version_is_refused(db_path: Path) -> None:
    async with SqliteSessionStore(db_path) as store:
        await store.get("s")
    with raw_db(db_path) as db:
        db.execute("UPDATE raf_meta SET value = 'raf.sessions/99' WHERE key = 'schema'")
    async with SqliteSessionStore(db_path) as store:
        with pytest.raises(SessionStoreError, match=r"raf\.sessions/99"):
            await store.get("s")


async def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "sessions.db"
    async with SqliteSessionStore(path) as store:
        with pytest.raises(SessionStoreError, match="cannot open"):
            await store.get("s")
    assert not path.parent.exists()


async def test_closed_store_refuses_work(db_path: Path) -> None:
    store = SqliteSessionStore(db_path)
    session = await store.get("s")
    await store.aclose()
    with pytest.raises(SessionStoreError, match="closed"):
        await session.get_messages()


async def test_bad_session_id_is_refused(store: SqliteSessionStore) -> None:
    with pytest.raises(ValueError, match="session id"):
        await store.get("")


async def test_in_memory_database_works(anyio_backend: str) -> None:
    async with SqliteSessionStore(":memory:") as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("x")])
        assert texts(await session.get_messages()) == ["x"]


async def test_two_stores_touching_one_request_at_once_see_it_new_once(db_path: Path) -> None:
    async with SqliteSessionStore(db_path) as one, SqliteSessionStore(db_path) as two:
        sessions = [await one.get("s"), await two.get("s")]
        request = [ChatMessage.user("sent twice")]
        results: list[RequestHash] = []

        async def touch(index: int) -> None:
            results.append(await sessions[index % 2].touch_request_hash(request))

        async with anyio.create_task_group() as group:
            for index in range(20):
                group.start_soon(touch, index)
    assert sorted(r.repeated for r in results) == [False] + [True] * 19


async def test_an_older_unbounded_request_hash_table_is_read_and_pruned_to_the_limit(
    store: SqliteSessionStore, db_path: Path
) -> None:
    session = await store.get("s")
    await session.touch_request_hash([ChatMessage.user("first")])
    with raw_db(db_path) as db:  # what an older raf left: every digest it ever saw
        db.executemany(
            "INSERT INTO raf_request_hashes (session_id, hash, seen_at) VALUES ('s', ?, ?)",
            [(f"{n:064x}", 1000.0 + n) for n in range(3 * REQUEST_HASH_LIMIT)],
        )
    recorded = await session.request_hashes()
    assert list(recorded) == [
        f"{n:064x}" for n in range(2 * REQUEST_HASH_LIMIT, 3 * REQUEST_HASH_LIMIT)
    ]
    await session.touch_request_hash([ChatMessage.user("next")])
    with raw_db(db_path) as db:
        (count,) = db.execute("SELECT count(*) FROM raf_request_hashes").fetchone()
    assert count == REQUEST_HASH_LIMIT


async def test_a_warm_read_sees_other_writers(
    db_path: Path,
) -> None:
    async with SqliteSessionStore(db_path) as mine, SqliteSessionStore(db_path) as theirs:
        session = await mine.get("shared")
        await session.add_messages([ChatMessage.user(str(n)) for n in range(50)])
        first = await session.get_messages()
        assert await session.get_messages() == first
        await (await theirs.get("shared")).add_messages([ChatMessage.user("theirs")])
        grown = await session.get_messages()  # another store object wrote: seen
        assert texts(grown[50:]) == ["theirs"]
        assert grown[:50] == first
