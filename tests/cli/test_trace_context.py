"""``raf run --trace=context``: the ledger's table on stderr, after the answer."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from raf import Agent, ScriptedChatClient, SqliteSessionStore, ToolCall, ToolOutputLimit, tool
from tests._harness.cli import run_raf


def test_trace_context_prints_the_ledger_after_each_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        "[agent]\ninstructions = 'Be brief.'\n\n[model]\nclient = 'echo'\n\n"
        "[[providers]]\nkind = 'memory'\n"
    )
    db = str(tmp_path / "sessions.db")
    argv = ["run", str(path), "--db", db, "--session", "s1", "--trace=context"]
    assert run_raf([*argv[:2], "hello", *argv[2:]]) == 0
    assert run_raf([*argv[:2], "again", *argv[2:]]) == 0
    out, err = capsys.readouterr()
    assert out == "hello\nagain\n"
    tables = [line.split() for line in err.splitlines() if line.strip()]
    assert tables[0][:4] == ["call", "session", "input", "agent"]
    second = tables[len(tables) // 2 :]
    assert second[0] == [
        "call", "session", "input", "agent", "HistoryProvider", "request", "shared", "cached",
        "broken", "by",
    ]  # fmt: skip
    assert second[1][:2] == ["1", "s1"]
    assert second[-1][:3] == ["tokens", "counted", "by"]


def test_without_trace_context_nothing_is_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[model]\nclient = 'echo'\n")
    assert run_raf(["run", str(path), "hello", "--db", str(tmp_path / "s.db")]) == 0
    assert capsys.readouterr().err == ""


def test_trace_context_lists_the_tool_results_that_were_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A session an agent of the Python API wrote: its ToolOutputLimit cut and spilled a result.
    db = tmp_path / "sessions.db"
    log = "\n".join(f"row {number}" for number in range(3000))

    @tool
    def dump() -> str:
        """The log."""
        return log

    async def first_run() -> None:
        client = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("big", "dump")), "ok"])
        limit = ToolOutputLimit(1000)
        async with SqliteSessionStore(db) as store:
            agent = Agent(client, tools=[dump], tool_stack=[limit], history=True)
            await agent.run("dump the log", session=await store.get("s1"))

    anyio.run(first_run)
    path = tmp_path / "agent.toml"
    path.write_text("[model]\nclient = 'echo'\n\n[[providers]]\nkind = 'memory'\n")
    argv = ["run", str(path), "again", "--db", str(db), "--session", "s1", "--trace=context"]
    assert run_raf(argv) == 0
    err = capsys.readouterr().err
    assert "cut tool results:" in err
    assert f"big (dump), from call 1: {len(log):,} characters" in err
    assert "spilled: kept with the session, read_tool_result reads it" in err
