"""``raf replay CONFIG --db --session [--against] [--chart]``: a stored conversation through
two configs' stacks, side by side, and the chart of it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._harness.cli import run_raf
from tests._harness.openai_server import OpenAIServer

WHOLE = (
    "[agent]\ninstructions = 'Be brief.'\n\n[model]\nclient = 'echo'\n\n"
    "[[providers]]\nkind = 'memory'\n"
)


@pytest.fixture
def recorded(tmp_path: Path) -> tuple[Path, Path, str]:
    """Two configs (the whole history; a window of 4 messages) and a SQLite file holding a
    conversation of six turns that ``raf run`` stored with the first."""
    whole = tmp_path / "whole.toml"
    whole.write_text(WHOLE)
    window = tmp_path / "window.toml"
    window.write_text(WHOLE + "max_messages = 4\n")
    db = str(tmp_path / "sessions.db")
    for turn in range(6):
        status = run_raf(["run", str(whole), f"question {turn}", "--db", db, "--session", "s"])
        assert status == 0
    return whole, window, db


def test_replay_prints_both_stacks_side_by_side_and_draws_the_chart(
    recorded: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole, window, db = recorded
    capsys.readouterr()
    chart = tmp_path / "replay.svg"
    argv = ["replay", str(whole), "--db", db, "--session", "s", "--against", str(window)]
    assert run_raf([*argv, "--chart", str(chart)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "session 's': 12 messages, 6 turns, 6 recorded model calls"
    assert out[1].split()[:4] == ["turn", "call", "whole:", "input"]
    assert "window: input" in out[1]
    rows = [line.split() for line in out[2:8]]
    assert [row[:2] for row in rows] == [[str(n), "1"] for n in range(1, 7)]
    # The whole history never breaks the cache (its column after cost and context); the window does.
    assert all(row[7] == "-" for row in rows)
    # A window of 4 steps by 3 (four fifths, at least 1): it moves at turns 4 and 5 only.
    assert ["HistoryProvider" in line for line in out[2:8]] == [False] * 3 + [True] * 2 + [False]
    assert out[8].split()[:2] == ["all", "6"]
    assert out[-1] == f"chart: {chart}"
    drawn = ET.parse(chart).getroot()
    assert drawn.tag.endswith("svg")
    titles = [el.text or "" for el in drawn.iter("{http://www.w3.org/2000/svg}title")]
    assert len(titles) == 12
    assert titles[0].startswith("call 1 (turn 1): ")


def test_replay_of_one_config_and_its_mistakes(
    recorded: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole, _, db = recorded
    capsys.readouterr()
    assert run_raf(["replay", str(whole), "--db", db, "--session", "s"]) == 0
    out = capsys.readouterr().out
    assert "whole" not in out.splitlines()[1]
    assert "input" in out.splitlines()[1]
    assert run_raf(["replay", str(whole), "--db", db, "--session", "nobody"]) == 2
    assert "--session 'nobody': the store" in capsys.readouterr().err
    assert run_raf(["replay", str(whole), "--db", db]) == 2  # --session is required
    bad = tmp_path / "missing" / "chart.svg"
    argv = ["replay", str(whole), "--db", db, "--session", "s", "--chart", str(bad)]
    assert run_raf(argv) == 2
    assert f"--chart {bad}" in capsys.readouterr().err


def test_replay_needs_no_key_and_counts_with_the_models_encoding(
    recorded: tuple[Path, Path, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An OpenAI config whose key is not set: raf run refuses it, raf replay sends nothing.
    _, _, db = recorded
    monkeypatch.delenv("RAF_TEST_UNSET_KEY", raising=False)
    config = tmp_path / "openai.toml"
    config.write_text(
        "[model]\nclient = 'openai'\nmodel = 'gpt-4o-mini'\napi_key_env = 'RAF_TEST_UNSET_KEY'\n\n"
        "[[providers]]\nkind = 'memory'\n"
    )
    capsys.readouterr()
    assert run_raf(["run", str(config), "hi"]) == 2
    assert "needs RAF_TEST_UNSET_KEY set" in capsys.readouterr().err
    assert run_raf(["replay", str(config), "--db", db, "--session", "s"]) == 0
    assert "tokens counted by o200k_base" in capsys.readouterr().out


def test_replay_of_a_store_file_that_is_not_there_is_told_and_makes_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "whole.toml"
    config.write_text(WHOLE)
    missing = tmp_path / "typo" / "sessions.db"
    assert run_raf(["replay", str(config), "--db", str(missing), "--session", "s"]) == 2
    assert f"--db {missing}: no such session store file" in capsys.readouterr().err
    assert not missing.parent.exists()  # a command that only reads writes nothing


LONG_TOOLS = '''
from raf import tool


@tool
def dump() -> str:
    """The whole log."""
    return "\\n".join(f"row {number}" for number in range(3000))
'''

LONG_RUNNING = """
[agent]
tools = ["long_running_tools:dump"]

[model]
client = "openai"
model = "gpt-4o-mini"
base_url = "{url}"
api_key_env = "RAF_TEST_KEY"

[[providers]]
kind = "memory"
inject = false

[[providers]]
kind = "compression"
strategy = "clear_tool_results"
keep_last = 0
clear_at_least = 0

[[tool_stack]]
kind = "tool_output_limit"
max_chars = 1000
"""


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("RAF_TEST_KEY", "sk-test")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = OpenAIServer()
    yield server
    server.close()


def test_a_declared_tool_output_limit_and_clearing_run_and_replay(
    tmp_path: Path, server: OpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "long_running_tools.py").write_text(LONG_TOOLS)
    config = tmp_path / "long.toml"
    config.write_text(LONG_RUNNING.format(url=server.base_url))
    db = str(tmp_path / "sessions.db")
    argv = ["--db", db, "--session", "s"]
    server.answer(content=None, tool_calls=[("call_big", "dump", "{}")])
    server.answer(content="seen")
    server.answer(content="fine")
    assert run_raf(["run", str(config), "dump the log", *argv]) == 0
    assert run_raf(["run", str(config), "and now?", *argv]) == 0
    _, second, third = (request.body["messages"] for request in server.requests)
    # The tool stack cut the result once, when it was produced, and kept it in full.
    cut = second[-1]["content"]
    assert len(cut) <= 1000
    assert 'read_tool_result(call_id="call_big"' in cut
    assert [t["function"]["name"] for t in server.requests[1].body["tools"]] == [
        "dump",
        "read_tool_result",
    ]
    # The next turn: the compression provider cleared it (keep_last = 0, no batch).
    [cleared] = [m["content"] for m in third if m["role"] == "tool"]
    assert cleared.startswith("[tool result cleared: dump, call call_big, ")
    assert cleared.endswith(
        'its full text (25,889 characters) is kept: read_tool_result(call_id="call_big")]'
    )
    capsys.readouterr()
    # The same config replays the stored conversation offline.
    assert run_raf(["replay", str(config), *argv]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "session 's': 6 messages, 2 turns, 3 recorded model calls"
    inputs = [int(line.split()[2].replace(",", "")) for line in out[2:5]]
    assert inputs[2] < inputs[1] / 2  # the cleared result: turn 2 sends a fraction of it


def test_a_replay_spends_nothing_from_the_configs_budgets(
    recorded: tuple[Path, Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    whole, _, db = recorded
    budgeted = tmp_path / "budgeted.toml"
    budgeted.write_text(
        whole.read_text() + "\n[[chat_stack]]\nkind = 'spend_limits'\nstore = 'spend.db'\n"
        "budgets = [{usd = 1, per = 'day'}]\n"
    )
    capsys.readouterr()
    assert run_raf(["replay", str(budgeted), "--db", db, "--session", "s"]) == 0
    out = capsys.readouterr().out
    assert "diverged" not in out
    assert not (tmp_path / "spend.db").exists()
