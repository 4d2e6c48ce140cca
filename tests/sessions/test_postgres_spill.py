"""A PostgreSQL session keeps the tool results ToolOutputLimit spilled: table {prefix}_spilled."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from raf import ChatMessage, PostgresSessionStore
from tests._harness.postgres_server import PostgresServer
from tests._harness.spilling import spill_survives_restart

pytestmark = pytest.mark.anyio


@pytest.fixture
def prefix() -> str:
    return f"s{uuid.uuid4().hex[:8]}"


async def test_a_spilled_result_survives_a_restart(
    postgres_server: PostgresServer, prefix: str
) -> None:
    found = await spill_survives_restart(
        lambda: PostgresSessionStore(postgres_server.url(), prefix=prefix)
    )
    assert "line 3000: row 2999" in found


async def test_spills_are_per_session_hold_nul_and_the_last_one_wins(
    postgres_server: PostgresServer, prefix: str
) -> None:
    async with PostgresSessionStore(postgres_server.url(), prefix=prefix) as store:
        one, two = await store.get("one"), await store.get("two")
        await one.spill_tool_result("c", "first")
        await one.spill_tool_result("c", "second\x00with NUL")
        assert await one.spilled_tool_result("c") == "second\x00with NUL"
        assert await two.spilled_tool_result("c") is None
        assert await store.session_ids() == ["one"]  # a spill stores the session


async def test_a_database_made_before_the_table_reads_as_nothing_spilled(
    postgres_server: PostgresServer, prefix: str
) -> None:
    async with PostgresSessionStore(postgres_server.url(), prefix=prefix) as store:
        session = await store.get("s")
        await session.add_messages([ChatMessage.user("hi")])
        assert await session.spilled_tool_result("c") is None
    with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f"{prefix}_spilled",)).fetchone()
        assert found == (None,)


async def test_the_spills_go_with_their_session(
    postgres_server: PostgresServer, prefix: str
) -> None:
    async with PostgresSessionStore(postgres_server.url(), prefix=prefix) as store:
        session = await store.get("s")
        await session.spill_tool_result("c", "text")
        with psycopg.connect(postgres_server.url(), autocommit=True) as conn:
            conn.execute(f"DELETE FROM {prefix}_sessions WHERE id = 's'")
            (left,) = conn.execute(f"SELECT count(*) FROM {prefix}_spilled").fetchone() or (0,)
        assert left == 0
        assert await session.spilled_tool_result("c") is None
