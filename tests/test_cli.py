"""The raf command: one turn from a TOML config, clear errors, sessions on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raf.cli import load_agent, main

EXAMPLE = Path(__file__).parent.parent / "examples" / "agent.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_run_prints_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLE), "hello there"]) == 0
    out, err = capsys.readouterr()
    assert out == "hello there\n"
    assert err == ""


def test_trace_prints_each_stage_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(EXAMPLE), "hi", "--trace"]) == 0
    err = capsys.readouterr().err.splitlines()
    stages = [" ".join(line.split()[1:4:2]) for line in err]
    assert stages == [
        "InMemoryHistoryProvider on_invoking",
        "AgentSkillsProvider on_invoking",
        "WorkspaceContextProvider on_invoking",
        "model complete",
        "WorkspaceContextProvider on_invoked",
        "AgentSkillsProvider on_invoked",
        "InMemoryHistoryProvider on_invoked",
    ]
    assert "+tools load_skill, read_skill_resource" in err[1]


def test_a_session_keeps_history_in_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    args = ["--session", "s1", "--db", str(db), "--trace"]
    assert main(["run", str(EXAMPLE), "first", *args]) == 0
    capsys.readouterr()
    assert main(["run", str(EXAMPLE), "second", *args]) == 0
    out, err = capsys.readouterr()
    assert out == "second\n"
    # The second turn's model call saw the first turn's two messages too.
    assert "(+2 messages)" in err
    assert "(4 messages, 4 tools)" in err
    assert db.exists()


def test_without_a_session_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(EXAMPLE), "x"]) == 0
    assert not (tmp_path / ".raf").exists()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[agent\nname = 1", "not valid TOML"),
        ("[agent]\nnam = 'x'", "[agent] has unknown keys ['nam']"),
        ("[agent]\ninstructions = 3", "[agent] instructions must be a string"),
        ("[model]\nclient = 'gpt'", '[model] client must be "echo" or "openai"'),
        (
            "[[providers]]\nkind = 'nope'",
            "providers[0]: unknown provider kind 'nope'; known kinds:",
        ),
        ("[[providers]]\nkind = 'workspace'", "providers[0]: provider kind 'workspace'"),
        ("providers = 3", "'providers' must be an array of tables"),
    ],
)
def test_a_bad_config_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, message: str
) -> None:
    path = write(tmp_path, config)
    assert main(["run", str(path), "hi"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"raf: {path}")
    assert message in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_a_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path / "missing.toml"), "hi"]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_openai_needs_a_model_and_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = write(tmp_path, "[model]\nclient = 'openai'\nmodel = 'gpt-4o-mini'")
    assert main(["run", str(path), "hi"]) == 2
    assert "needs OPENAI_API_KEY" in capsys.readouterr().err
    path = write(tmp_path, "[model]\nclient = 'openai'")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert main(["run", str(path), "hi"]) == 2
    assert 'needs model = "<model name>"' in capsys.readouterr().err


def test_relative_roots_are_resolved_against_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ws").mkdir()
    path = write(tmp_path, "[[providers]]\nkind = 'workspace'\nroot = 'ws'\nname = 'files'")
    monkeypatch.chdir("/")
    agent = load_agent(path)
    [provider] = agent.providers
    assert provider.name == "files"


def test_chat_reads_lines_until_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = iter(["one", "", "two", "/exit", "never read"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    db = tmp_path / "chat.db"
    assert main(["chat", str(EXAMPLE), "--session", "c", "--db", str(db)]) == 0
    assert capsys.readouterr().out == "one\ntwo\n"


def test_python_dash_m_raf_runs_the_command() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "raf", "run", str(EXAMPLE), "via -m"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "via -m\n", "")


def one_clear_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("raf: ")
    assert "Traceback" not in err
    assert err.count("\n") == 1
    return err


def test_a_config_that_is_not_utf8_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(b"[agent]\nname = '\xff\xfe'\n")
    assert main(["run", str(path), "hi"]) == 2
    err = one_clear_line(capsys)
    assert str(path) in err
    assert "UTF-8" in err


def test_a_config_path_that_is_a_folder_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(tmp_path), "hi"]) == 2
    err = one_clear_line(capsys)
    assert f"raf: {tmp_path}: cannot read the config file" in err


def test_a_db_whose_folder_cannot_be_created_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the folder should be")
    db = blocker / "sessions.db"
    assert main(["run", str(EXAMPLE), "hi", "--session", "s", "--db", str(db)]) == 2
    err = one_clear_line(capsys)
    assert f"--db {db}" in err
    assert f"cannot create the folder {blocker}" in err


def test_model_options_of_the_wrong_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[model]\nclient = 'echo'\nbase_url = 3\n")
    assert main(["run", str(path), "hi"]) == 2
    assert "[model] base_url must be a non-empty string, got 3" in one_clear_line(capsys)
    path = write(tmp_path, "[model]\nmodel = ['a']\n")
    assert main(["run", str(path), "hi"]) == 2
    assert "[model] model must be a non-empty string" in one_clear_line(capsys)


def test_chat_from_a_pipe_prints_only_the_answers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "raf", "chat", str(EXAMPLE)],
        input="one\ntwo\n",
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout == "one\ntwo\n"


def test_an_empty_session_id_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    assert main(["run", str(EXAMPLE), "hi", "--session", "", "--db", str(db)]) == 2
    assert "--session: the session id must not be empty" in one_clear_line(capsys)


def test_a_failed_model_call_does_not_end_the_chat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from raf.clients.echo import EchoChatClient
    from raf.errors import RateLimitError

    calls = {"n": 0}
    original = EchoChatClient.complete

    async def flaky(self: EchoChatClient, messages: Any, options: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RateLimitError("slow down", status_code=429)
        return await original(self, messages, options)

    monkeypatch.setattr(EchoChatClient, "complete", flaky)
    lines = iter(["one", "two", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["chat", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert out == "two\n"
    assert "raf: this turn failed: slow down" in err
