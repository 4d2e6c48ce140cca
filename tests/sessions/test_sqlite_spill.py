"""A SQLite session keeps the tool results ToolOutputLimit spilled: table raf_spilled."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from raf import ChatMessage, SqliteSessionStore
from tests._harness.spilling import spill_survives_restart

pytestmark = pytest.mark.anyio


async def test_a_spilled_result_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    found = await spill_survives_restart(lambda: SqliteSessionStore(path))
    assert "line 3000: row 2999" in found


async def test_spills_are_per_session_and_the_last_one_wins(tmp_path: Path) -> None:
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        one, two = await store.get("one"), await store.get("two")
        await one.spill_tool_result("c", "first")
        await one.spill_tool_result("c", "second")
        await two.spill_tool_result("c", "other\x00text")
        assert await one.spilled_tool_result("c") == "second"
        assert await two.spilled_tool_result("c") == "other\x00text"
        assert await store.session_ids() == ["one", "two"]  # a spill stores the session


async def test_a_file_made_before_the_table_reads_as_nothing_spilled(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    async with SqliteSessionStore(path) as store:
        await (await store.get("s")).add_messages([ChatMessage.user("hi")])
    with sqlite3.connect(path) as db:
        assert (
            db.execute("SELECT name FROM sqlite_master WHERE name = 'raf_spilled'").fetchone()
            is None
        )
    async with SqliteSessionStore(path, read_only=True) as store:
        assert await (await store.get("s")).spilled_tool_result("c") is None


async def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        with pytest.raises(ValueError, match="tool call id must be a non-empty str"):
            await session.spill_tool_result("", "text")
        with pytest.raises(TypeError, match=r"spill_tool_result\(text\) must be a str"):
            await session.spill_tool_result("c", b"bytes")  # type: ignore[arg-type]
        assert await store.session_ids() == []
