"""A store's cache of what it read never hides another process's writes (SQLite, Redis,
PostgreSQL).

Each test reads a session in this process (so the store keeps what it read),
lets a second process (``tests._harness.session_writer``) write to the same session,
and reads again: whole, and by the tail.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest

from raf import ChatMessage, SqliteSessionStore
from tests._harness.postgres_server import PostgresServer
from tests._harness.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


async def write_from_another_process(*args: str) -> None:
    await anyio.run_process(
        [sys.executable, "-m", "tests._harness.session_writer", *args], cwd=ROOT, check=True
    )


def texts(messages: Any) -> list[str | None]:
    return [m.content for m in messages]


async def read_write_read(session: Any, kind: str, target: str) -> None:
    await session.add_messages([ChatMessage.user("a"), ChatMessage.user("b")])
    assert texts(await session.get_messages()) == ["a", "b"]
    await write_from_another_process(kind, target, session.id, "c", "d")
    assert texts(await session.get_last_messages(1)) == ["d"]
    assert texts(await session.get_messages()) == ["a", "b", "c", "d"]
    await session.add_messages([ChatMessage.user("e")])  # extends what this process read
    await write_from_another_process(kind, target, session.id, "f")
    assert texts(await session.get_messages()) == ["a", "b", "c", "d", "e", "f"]
    assert texts(await session.get_last_messages(3)) == ["d", "e", "f"]


async def test_sqlite_reads_see_another_process(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    async with SqliteSessionStore(path) as store:
        await read_write_read(await store.get("shared"), "sqlite", str(path))
        # A session first read by its tail, then another process writes, then everything.
        tail_first = await store.get("tail-first")
        await tail_first.add_messages([ChatMessage.user(str(n)) for n in range(10)])
        async with SqliteSessionStore(path) as second:
            reader = await second.get("tail-first")
            assert texts(await reader.get_last_messages(2)) == ["8", "9"]
            await write_from_another_process("sqlite", str(path), "tail-first", "10")
            assert texts(await reader.get_last_messages(2)) == ["9", "10"]
            assert texts(await reader.get_messages()) == [str(n) for n in range(11)]


async def test_redis_reads_see_another_process(redis_server: RedisServer) -> None:
    from raf import RedisSessionStore

    async with RedisSessionStore(redis_server.url) as store:
        await read_write_read(await store.get(uuid.uuid4().hex), "redis", redis_server.url)


async def test_redis_a_history_written_again_is_not_taken_for_the_old_one_grown(
    redis_server: RedisServer,
) -> None:
    from raf import RedisSessionStore

    async with RedisSessionStore(redis_server.url) as store:
        session = await store.get(uuid.uuid4().hex)
        await session.add_messages([ChatMessage.user("old 1"), ChatMessage.user("old 2")])
        assert texts(await session.get_messages()) == ["old 1", "old 2"]
        # Longer than what was read, so only the last entry read tells the difference.
        await write_from_another_process(
            "redis-replace", redis_server.url, session.id, "new 1", "new 2", "new 3"
        )
        assert texts(await session.get_messages()) == ["new 1", "new 2", "new 3"]
        assert texts(await session.get_last_messages(2)) == ["new 2", "new 3"]


async def test_postgres_reads_see_another_process(postgres_server: PostgresServer) -> None:
    from raf import PostgresSessionStore

    async with PostgresSessionStore(postgres_server.url()) as store:
        await read_write_read(await store.get(uuid.uuid4().hex), "postgres", postgres_server.url())
