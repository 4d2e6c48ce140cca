"""The raf command's calls that wait for approval: ``raf run`` prints them and exits 4,
``--approve``/``--deny`` decide them; ``raf chat`` asks for each inline.

The real command runs as a subprocess; its model is OpenAI's protocol from a scripted
loopback server (tests/_harness/openai_server.py), its tool a module beside the config.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from raf import PendingCall, SqliteSessionStore
from tests._harness.openai_server import OpenAIServer
from tests.cli.test_cli import Terminal, raf, terminals, write

__all__ = ["terminals"]  # the fixture, used here

TOOLS = '''
import pathlib
import raf

@raf.tool(approval=True)
def delete(path: str) -> str:
    """Delete a file (pretend): it waits for a person's approval."""
    with pathlib.Path("deleted.txt").open("a") as log:
        log.write(path + "\\n")
    return f"deleted {path}"
'''
KEY = {"BOT_KEY": "sk-test"}
WAITING = 'waiting for approval: delete {"path": "notes.txt"}'


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    server = OpenAIServer()
    yield server
    server.close()


def config(tmp_path: Path, server: OpenAIServer) -> Path:
    """An agent that keeps history (where a call waits) with ``delete``, on the server's model."""
    (tmp_path / "files.py").write_text(TOOLS)
    return write(
        tmp_path,
        f"""
[agent]
name = "files"
tools = ["files:delete"]

[model]
client = "openai"
model = "test-model"
base_url = "{server.base_url}"
api_key_env = "BOT_KEY"

[[providers]]
kind = "memory"
""",
    )


def ask_to_delete(server: OpenAIServer) -> None:
    server.answer(content=None, tool_calls=[("c1", "delete", '{"path": "notes.txt"}')])


def deleted(tmp_path: Path) -> list[str]:
    log = tmp_path / "deleted.txt"
    return log.read_text().splitlines() if log.exists() else []


def token_of(stdout: str, flag: str) -> str:
    """The token in the printed command that decides the call with ``flag``."""
    line = next(line for line in stdout.splitlines() if f" {flag} " in line)
    return line.split(f" {flag} ")[1].split()[0]


@pytest.mark.slow
def test_run_prints_what_waits_exits_4_and_approve_finishes_the_turn(
    tmp_path: Path, server: OpenAIServer
) -> None:
    path = config(tmp_path, server)
    db = str(tmp_path / "s.db")
    ask_to_delete(server)
    done = raf("run", str(path), "delete my notes", "--session", "s1", "--db", db,
               cwd=tmp_path, env=KEY)  # fmt: skip
    assert done.returncode == 4, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == WAITING
    token = token_of(done.stdout, "--approve")
    assert lines[1] == f"  approve: raf run {path} --session s1 --db {db} --approve {token}"
    assert (
        lines[2]
        == f"  deny:    raf run {path} --session s1 --db {db} --deny {token} [--reason TEXT]"
    )
    assert deleted(tmp_path) == []
    # The decision resumes the turn in the session: the call runs, the model answers.
    server.answer(content="deleted them")
    resumed = raf("run", str(path), "--session", "s1", "--db", db, "--approve", token,
                  cwd=tmp_path, env=KEY)  # fmt: skip
    assert (resumed.returncode, resumed.stdout) == (0, "deleted them\n"), resumed.stderr
    assert deleted(tmp_path) == ["notes.txt"]
    assert server.requests[-1].body["messages"][-1]["content"] == "deleted notes.txt"
    # The same token again matches no waiting call: one clear line, status 2, nothing runs.
    again = raf("run", str(path), "--session", "s1", "--db", db, "--approve", token,
                cwd=tmp_path, env=KEY)  # fmt: skip
    assert again.returncode == 2, again
    assert token in again.stderr
    assert deleted(tmp_path) == ["notes.txt"]


@pytest.mark.slow
def test_deny_with_a_reason_tells_the_model_and_nothing_runs(
    tmp_path: Path, server: OpenAIServer
) -> None:
    path = config(tmp_path, server)
    db = str(tmp_path / "s.db")
    ask_to_delete(server)
    done = raf("run", str(path), "delete", "--session", "s2", "--db", db, cwd=tmp_path, env=KEY)
    assert done.returncode == 4, done.stderr
    server.answer(content="kept them")
    token = token_of(done.stdout, "--deny")
    denied = raf("run", str(path), "--session", "s2", "--db", db, "--deny", token,
                 "--reason", "keep them", cwd=tmp_path, env=KEY)  # fmt: skip
    assert (denied.returncode, denied.stdout) == (0, "kept them\n"), denied.stderr
    told = server.requests[-1].body["messages"][-1]["content"]
    assert "did not approve" in told
    assert "keep them" in told
    assert deleted(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--approve", "abc"], "give its --session ID"),
        (["hi", "--session", "s", "--approve", "abc"], "give them without a message"),
        (["--session", "s"], "raf run needs a message, or --approve/--deny TOKEN"),
        (["hi", "--reason", "no"], "--reason is the reason of a refusal"),
        (["--session", "s", "--approve", "a", "--deny", "a"], "a token is decided twice"),
        # An unset shell variable ("--approve $TOKEN"): said, not a traceback.
        (["--session", "s", "--approve", ""], "--approve needs a token"),
        (["--session", "s", "--deny", " "], "--deny needs a token"),
        (["--session", "", "--approve", "abc"], "give its --session ID"),
    ],
)
def test_decision_misuse_is_a_usage_error(tmp_path: Path, args: list[str], message: str) -> None:
    path = write(tmp_path, "[model]\nclient = 'echo'\n")
    done = raf("run", str(path), *args, cwd=tmp_path)
    assert done.returncode == 2, done
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_help_names_exit_status_4() -> None:
    done = raf("run", "--help")
    assert "4 tool calls wait for approval" in done.stdout
    assert "--approve TOKEN" in done.stdout


@pytest.mark.slow
def test_run_without_a_session_says_the_calls_cannot_be_decided(
    tmp_path: Path, server: OpenAIServer
) -> None:
    path = config(tmp_path, server)
    ask_to_delete(server)
    done = raf("run", str(path), "delete", cwd=tmp_path, env=KEY)
    assert (done.returncode, done.stdout) == (4, WAITING + "\n"), done.stderr
    assert "run with --session ID" in done.stderr


@pytest.mark.slow
def test_chat_from_a_pipe_answers_each_waiting_call_inline(
    tmp_path: Path, server: OpenAIServer
) -> None:
    path = config(tmp_path, server)
    ask_to_delete(server)
    server.answer(content="kept them")
    ask_to_delete(server)
    server.answer(content="deleted them")
    lines = "delete\nn\nnot today\ndelete again\nmaybe\ny\n"
    done = raf("chat", str(path), cwd=tmp_path, env=KEY, input=lines)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "kept them\ndeleted them\n"
    question = 'approve delete {"path": "notes.txt"}? [y/n] '
    assert done.stderr.count(question) == 2
    assert "reason (Enter for none): " in done.stderr
    assert "please answer y or n: " in done.stderr
    refused = server.requests[1].body["messages"][-1]["content"]
    assert "did not approve" in refused
    assert "not today" in refused
    assert deleted(tmp_path) == ["notes.txt"]


@pytest.mark.slow
def test_chat_on_a_terminal_asks_before_the_next_prompt(
    tmp_path: Path, server: OpenAIServer, terminals: list[Terminal]
) -> None:
    path = config(tmp_path, server)
    ask_to_delete(server)
    server.answer(content="deleted them")
    terminal = Terminal("chat", str(path), cwd=tmp_path, env=KEY)
    terminals.append(terminal)
    terminal.expect("> ")
    terminal.send(b"delete my notes\r")
    terminal.expect('approve delete {"path": "notes.txt"}? [y/n] ')
    terminal.send(b"y\r")
    assert "deleted them" in terminal.expect("> ")
    assert deleted(tmp_path) == ["notes.txt"]
    terminal.send(b"\x04")  # Ctrl-D
    assert terminal.close() == 0


@pytest.mark.slow
def test_chat_ended_at_a_question_exits_4_and_the_call_still_waits(
    tmp_path: Path, server: OpenAIServer
) -> None:
    path = config(tmp_path, server)
    db = str(tmp_path / "s.db")
    ask_to_delete(server)
    done = raf("chat", str(path), "--session", "c", "--db", db, cwd=tmp_path, env=KEY,
               input="delete\n")  # fmt: skip
    assert done.returncode == 4, done.stderr
    assert deleted(tmp_path) == []
    # Still waiting in the session: raf run decides it.
    (pending,) = anyio.run(waiting_in, db, "c")
    token = pending.token
    server.answer(content="deleted them")
    resumed = raf("run", str(path), "--session", "c", "--db", db, "--approve", token,
                  cwd=tmp_path, env=KEY)  # fmt: skip
    assert (resumed.returncode, resumed.stdout) == (0, "deleted them\n"), resumed.stderr
    assert deleted(tmp_path) == ["notes.txt"]


async def waiting_in(db: str, session_id: str) -> tuple[PendingCall, ...]:
    async with SqliteSessionStore(db) as store:
        session = await store.get(session_id)
        return await session.list_pending()
