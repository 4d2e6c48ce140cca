"""The raf command: one turn from a TOML config, clear errors, sessions on disk."""

from __future__ import annotations

import fcntl
import importlib.metadata
import inspect
import os
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from raf import Update
from tests._harness.cli import run_raf
from tests._harness.openai_server import OpenAIServer, Reply, chunk, completion, text_stream

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_run_prints_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_raf(["run", str(EXAMPLE), "hello there"]) == 0
    out, err = capsys.readouterr()
    assert out == "hello there\n"
    assert err == ""


def test_trace_prints_each_stage_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_raf(["run", str(EXAMPLE), "hi", "--trace"]) == 0
    err = capsys.readouterr().err.splitlines()
    stages = [" ".join(line.split()[1:4:2]) for line in err]
    assert stages == [
        "HistoryProvider on_invoking",
        "AgentSkillsProvider on_invoking",
        "WorkspaceContextProvider on_invoking",
        "model complete",
        "WorkspaceContextProvider on_invoked",
        "AgentSkillsProvider on_invoked",
        "HistoryProvider on_invoked",
    ]
    assert "+tools load_skill, read_skill_resource" in err[1]


def test_a_session_keeps_history_in_the_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    args = ["--session", "s1", "--db", str(db), "--trace"]
    assert run_raf(["run", str(EXAMPLE), "first", *args]) == 0
    capsys.readouterr()
    assert run_raf(["run", str(EXAMPLE), "second", *args]) == 0
    out, err = capsys.readouterr()
    assert out == "second\n"
    # The second turn's model call saw the first turn's two messages too.
    assert "(+2 messages)" in err
    assert "(4 messages, 4 tools; streamed 2 updates, first after " in err
    assert db.exists()


def test_without_a_session_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert run_raf(["run", str(EXAMPLE), "x"]) == 0
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
    assert run_raf(["run", str(path), "hi"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"raf: {path}")
    assert message in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


def test_a_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_raf(["run", str(tmp_path / "missing.toml"), "hi"]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_openai_needs_a_model_and_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    path = write(tmp_path, "[model]\nclient = 'openai'\nmodel = 'gpt-4o-mini'")
    assert run_raf(["run", str(path), "hi"]) == 2
    assert "needs OPENAI_API_KEY" in capsys.readouterr().err
    path = write(tmp_path, "[model]\nclient = 'openai'")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert run_raf(["run", str(path), "hi"]) == 2
    assert 'needs model = "<model name>"' in capsys.readouterr().err


def test_chat_reads_lines_until_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = iter(["one", "", "two", "/exit", "never read"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    db = tmp_path / "chat.db"
    assert run_raf(["chat", str(EXAMPLE), "--session", "c", "--db", str(db)]) == 0
    assert capsys.readouterr().out == "one\ntwo\n"


@pytest.mark.slow
def test_python_dash_m_raf_runs_the_command() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
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
    assert run_raf(["run", str(path), "hi"]) == 2
    err = one_clear_line(capsys)
    assert str(path) in err
    assert "UTF-8" in err


def test_a_config_path_that_is_a_folder_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_raf(["run", str(tmp_path), "hi"]) == 2
    err = one_clear_line(capsys)
    assert f"raf: {tmp_path}: cannot read the config file" in err


def test_a_db_whose_folder_cannot_be_created_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the folder should be")
    db = blocker / "sessions.db"
    assert run_raf(["run", str(EXAMPLE), "hi", "--session", "s", "--db", str(db)]) == 2
    err = one_clear_line(capsys)
    assert f"--db {db}" in err
    assert f"cannot create the folder {blocker}" in err


def test_model_options_of_the_wrong_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[model]\nclient = 'echo'\nbase_url = 3\n")
    assert run_raf(["run", str(path), "hi"]) == 2
    assert "[model] base_url must be a non-empty string, got 3" in one_clear_line(capsys)
    path = write(tmp_path, "[model]\nmodel = ['a']\n")
    assert run_raf(["run", str(path), "hi"]) == 2
    assert "[model] model must be a non-empty string" in one_clear_line(capsys)


@pytest.mark.slow
def test_chat_from_a_pipe_prints_only_the_answers(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "raf", "chat", str(EXAMPLE)],
        input="one\ntwo\n",
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout == "one\ntwo\n"


def test_an_empty_session_id_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    assert run_raf(["run", str(EXAMPLE), "hi", "--session", "", "--db", str(db)]) == 2
    assert "--session: the session id must not be empty" in one_clear_line(capsys)


@pytest.mark.slow
def test_a_failed_model_call_does_not_end_the_chat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from raf import EchoChatClient
    from raf.errors import RateLimitError

    calls = {"n": 0}
    original = EchoChatClient.stream

    async def flaky(self: EchoChatClient, messages: Any, options: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            # The connection drops after the first delta: what was printed stays.
            yield Update.of_text("on")
            raise RateLimitError("slow down", status_code=429)
        async for update in original(self, messages, options):
            yield update

    monkeypatch.setattr(EchoChatClient, "stream", flaky)
    lines = iter(["one", "two", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert run_raf(["chat", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert out == "on\ntwo\n"  # the broken line ended before the next answer
    assert "raf: this turn failed: slow down" in err


# The real command, as a subprocess --------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def raf(
    *args: str | bytes,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    input: str | None = None,
    pythonpath: tuple[Path, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """``raf ARGS...`` (as ``python -m raf``, so this checkout's raf), bounded in time."""
    paths = os.pathsep.join(str(p) for p in (ROOT, *pythonpath))
    return subprocess.run(
        [sys.executable, "-m", "raf", *args],
        capture_output=True,
        text=True,
        errors="replace",
        input=input,
        cwd=cwd,
        env={**os.environ, **(env or {}), "PYTHONPATH": paths},
        check=False,
        timeout=60,
    )


def assert_one_clear_line(done: subprocess.CompletedProcess[str], status: int = 2) -> str:
    assert done.returncode == status, done
    assert done.stdout == ""
    assert done.stderr.startswith("raf: "), done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "[[provider]]\nkind = 'memory'",
            "unknown top-level table [[provider]]; did you mean [[providers]]?",
        ),
        ("[agents]\nname = 'x'", "unknown top-level table [agents]; did you mean [agent]?"),
        ("modle = 'gpt'", "unknown top-level key 'modle'; did you mean [model]?"),
        ("[plugins]\nx = 1", "unknown top-level table [plugins] (allowed: [agent], [model]"),
        # Not "did you mean [[tool_stack]]?": a config's tools are [agent] tools.
        ("[tools]\nx = 1", "unknown top-level table [tools]; did you mean [agent] tools? ("),
    ],
)
@pytest.mark.slow
def test_an_unknown_top_level_table_is_refused(tmp_path: Path, config: str, message: str) -> None:
    path = write(tmp_path, config)
    assert message in assert_one_clear_line(raf("run", str(path), "hi"))


@pytest.mark.slow
def test_version_and_help() -> None:
    done = raf("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"raf {importlib.metadata.version('raf-agents')}"
    done = raf("--help")
    assert done.returncode == 0
    assert "TOML" in done.stdout
    assert "docs/cli.md" in done.stdout
    assert "docs/cli.md" in raf("run", "--help").stdout
    # The docs site's address, as the installed metadata configures it.
    site = next(
        url.split(",", 1)[1].strip()
        for url in importlib.metadata.metadata("raf-agents").get_all("Project-URL") or []
        if url.startswith("Documentation,")
    )
    assert f"`make docs` builds them from a checkout): {site}" in done.stdout
    # Every key of [model] (idle_timeout was left out).
    assert "timeout, idle_timeout)" in done.stdout


@pytest.mark.slow
def test_a_db_in_missing_folders_is_created(tmp_path: Path) -> None:
    db = tmp_path / "no" / "such" / "dir" / "x.db"
    for word in ("first", "second"):
        done = raf("run", str(EXAMPLE), word, "--session", "s", "--db", str(db), "--trace")
        assert (done.returncode, done.stdout) == (0, f"{word}\n"), done.stderr
    assert db.is_file()
    assert "(+2 messages)" in done.stderr  # the first turn was stored there


@pytest.mark.slow
def test_a_config_of_dev_zero_is_refused_without_reading_it_all() -> None:
    err = assert_one_clear_line(raf("run", "/dev/zero", "hi"))
    assert "raf: /dev/zero: not a config file: larger than 1024 KiB" in err


@pytest.mark.slow
def test_a_config_larger_than_the_bound(tmp_path: Path) -> None:
    path = write(tmp_path, "# padding\n" * 200_000)
    assert "not a config file: larger than" in assert_one_clear_line(raf("run", str(path), "hi"))


@pytest.mark.parametrize(
    "config",
    ["x = " + "[" * 5000 + "]" * 5000, "x = " + "{a = " * 5000 + "1" + "}" * 5000],
)
@pytest.mark.slow
def test_a_config_nested_5000_deep_is_one_line(tmp_path: Path, config: str) -> None:
    path = write(tmp_path, config)
    err = assert_one_clear_line(raf("run", str(path), "hi"))
    assert "nested too deeply" in err or "not valid TOML" in err


@pytest.mark.slow
def test_a_non_utf8_argument_does_not_crash_the_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "raf", "run", str(EXAMPLE).encode(), b"caf\xff"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "caf\ufffd\n".encode()
    assert done.stderr == b""


@pytest.mark.slow
def test_a_config_path_that_is_not_utf8_is_one_clear_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "raf", "run", bytes(tmp_path) + b"/\xff.toml", b"hi"],
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count(b"\n") == 1
    assert b"no such config file" in done.stderr
    assert b"Traceback" not in done.stderr


@pytest.fixture
def server() -> Iterator[OpenAIServer]:
    server = OpenAIServer()
    yield server
    server.close()


def openai_config(tmp_path: Path, server: OpenAIServer, extra: str = "", model: str = "") -> Path:
    return write(
        tmp_path,
        f"""
[agent]
name = "support"
{extra}

[model]
client = "openai"
model = "test-model"
base_url = "{server.base_url}"
api_key_env = "SUPPORT_BOT_KEY"
{model}
""",
    )


TOOLS_MODULE = '''
import raf

@raf.tool
def shout(text: str) -> str:
    """Say it louder."""
    return text.upper() + "!"

def whisper(text: str) -> str:
    return text.lower()
'''


@pytest.mark.slow
def test_a_realistic_agent_custom_tools_retry_and_model_options(
    tmp_path: Path, server: OpenAIServer
) -> None:
    (tmp_path / "shop_tools.py").write_text(TOOLS_MODULE)
    path = openai_config(
        tmp_path,
        server,
        'tools = ["shop_tools:shout"]\n\n'
        '[[chat_stack]]\nkind = "retry"\nattempts = 2\nwait_initial = 0\nwait_max = 0\n\n'
        '[[chat_stack]]\nkind = "logging"\n',
        "temperature = 0.2\nmax_tokens = 300",
    )
    # The SDK's own retries (2) answer three 429s first; then RetryMiddleware tries again.
    for _ in range(3):
        server.fail(429, "slow down")
    server.answer(content=None, tool_calls=[("c1", "shout", '{"text": "hello"}')])
    server.answer(content="done")
    done = raf("run", str(path), "say hello", "--trace", env={"SUPPORT_BOT_KEY": "sk-from-env"})
    assert (done.returncode, done.stdout) == (0, "done\n"), done.stderr
    assert len(server.requests) == 5
    last = server.requests[-1]
    assert last.headers["authorization"] == "Bearer sk-from-env"
    assert (last.body["temperature"], last.body["max_tokens"]) == (0.2, 300)
    assert [t["function"]["name"] for t in last.body["tools"]] == ["shout"]
    assert last.body["messages"][-1]["content"] == "HELLO!"
    trace = [line for line in done.stderr.splitlines() if line.startswith("trace: ")]
    assert trace[0].startswith("trace: model [chat] complete ")
    assert "raised RateLimitError" in trace[0]
    assert trace[2].startswith("trace: shout [tool] call ")
    assert trace[2].endswith(' ok (arguments {"text": "hello"}; result 6 chars)')
    assert "model.end" in done.stderr  # the logging middleware, on stderr


@pytest.mark.parametrize(
    ("extra", "model", "message"),
    [
        ("", 'api_key = "sk-123"', "[model] api_key: a key does not belong in a config file"),
        ("", "temperature = 'hot'", "[model] temperature must be a number >= 0, got 'hot'"),
        ("", "max_tokens = 0", "[model] max_tokens must be an integer >= 1, got 0"),
        ("", "timeout = -1", "[model] timeout must be a positive number, got -1"),
        ("", "timeout = inf", "[model] timeout must be a positive number, got inf"),
        ("", "temprature = 1", "[model] has unknown keys ['temprature']"),
        ('tools = ["shop_tools:whisper"]', "", "[agent] tools[0] 'shop_tools:whisper' is a"),
        ('tools = ["shop_tools:whisper"]', "", "not a raf Tool (decorate the function with"),
        ('tools = ["shop_tools:nope"]', "", "[agent] tools[0] 'shop_tools:nope': 'shop_tools'"),
        ('tools = ["no_such_module:x"]', "", "[agent] tools[0] 'no_such_module:x': cannot import"),
        ('tools = ["shop_tools"]', "", "an import path has the form 'package.module:name'"),
        ("tools = 'shop_tools:shout'", "", "[agent] tools must be a list of import paths"),
        ('[[chat_stack]]\nkind = "retry"\nattempts = 0', "", "chat_stack[0]: chat_stack kind"),
        ('[[chat_stack]]\nkind = "retry"\nattempts = 0', "", "option 'attempts' must be an"),
        ('[[chat_stack]]\nkind = "retyr"', "", "chat_stack[0]: unknown chat_stack kind 'retyr'"),
        ('[[chat_stack]]\nkind = "logging"\nlevel = 1', "", "unknown option(s) 'level'"),
        (
            '[[chat_stack]]\nkind = "retry"\nretry_on = ["shop_tools:shout"]',
            "",
            "option 'retry_on' must be a list of exception classes, got 'shop_tools:shout'",
        ),
        ("chat_stack = 1", "", "'chat_stack' must be an array of tables ([[chat_stack]])"),
    ],
)
def test_config_mistakes_name_the_table_the_entry_and_the_key(
    tmp_path: Path,
    server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    extra: str,
    model: str,
    message: str,
) -> None:
    # In-process (the same code as the command, without a Python start-up per case).
    (tmp_path / "shop_tools.py").write_text(TOOLS_MODULE)
    if extra.startswith("[["):
        path = openai_config(tmp_path, server, model=model)
        path.write_text(path.read_text() + "\n" + extra + "\n")
    elif extra.startswith("chat_stack"):
        path = openai_config(tmp_path, server, model=model)
        path.write_text(extra + "\n" + path.read_text())
    else:
        path = openai_config(tmp_path, server, extra, model)
    monkeypatch.setenv("SUPPORT_BOT_KEY", "sk")
    assert run_raf(["run", str(path), "hi"]) == 2
    assert message in one_clear_line(capsys)
    assert server.requests == []


@pytest.mark.slow
def test_api_key_env_names_a_variable_that_is_not_set(tmp_path: Path, server: OpenAIServer) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SUPPORT_BOT_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "raf", "run", str(openai_config(tmp_path, server)), "hi"],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=60,
    )
    err = assert_one_clear_line(done)
    assert "needs SUPPORT_BOT_KEY set (named by [model] api_key_env)" in err


@pytest.mark.slow
def test_the_timeout_bounds_the_whole_model_call(tmp_path: Path, server: OpenAIServer) -> None:
    from raf import OpenAIChatClient

    if "timeout" not in inspect.signature(OpenAIChatClient).parameters:
        pytest.skip("OpenAIChatClient has no timeout= yet (added in another branch)")
    path = openai_config(tmp_path, server, model="timeout = 0.5")
    server.reply(Reply(delay=30, body=completion("too late")))
    done = raf("run", str(path), "hi", env={"SUPPORT_BOT_KEY": "sk"})
    # The model failed: exit status 3, not the 2 of a config error (docs/cli.md).
    assert "raf: " in assert_one_clear_line(done, status=3)


PROVIDERS_MODULE = """
from pydantic import BaseModel, ConfigDict
from raf import ContextProvider, ContextResult

class Motto(ContextProvider):
    kind = "motto"

    def __init__(self, text, name=None):
        self.text = text
        if name:
            self.name = name

    async def on_invoking(self, agent, session, messages, options):
        return ContextResult(instructions=self.text)

class MottoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str

def motto(options):
    return Motto(options.parse(MottoOptions).text, options.name)

not_callable = 42
"""


@pytest.mark.slow
def test_a_provider_kind_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "house.py").write_text(PROVIDERS_MODULE)
    path = write(
        tmp_path, "[[providers]]\nkind = 'house:motto'\nname = 'motto'\ntext = 'Be kind.'\n"
    )
    done = raf("run", str(path), "hi", "--trace")
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    assert "trace: motto [motto] on_invoking " in done.stderr
    assert "(+1 instruction line)" in done.stderr


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("kind = 'house:motto'\ntxt = 'x'", "providers[0]: provider kind 'house:motto' (name"),
        ("kind = 'house:motto'", "option 'text' is required"),
        ("kind = 'house:not_callable'", "providers[0]: provider kind 'house:not_callable': int"),
        ("kind = 'house:nothing'", "'house' has no attribute 'nothing'"),
        ("kind = 'hous:motto'", "cannot import 'hous': ModuleNotFoundError"),
    ],
)
@pytest.mark.slow
def test_a_provider_kind_by_import_path_that_is_wrong(
    tmp_path: Path, config: str, message: str
) -> None:
    (tmp_path / "house.py").write_text(PROVIDERS_MODULE)
    path = write(tmp_path, "[[providers]]\nname = 'm'\n" + config + "\n")
    assert message in assert_one_clear_line(raf("run", str(path), "hi"))


def install_kinds(site: Path) -> None:
    """A distribution offering the kind ``motto`` in the ``raf._onion.compose`` entry points,
    installed in ``site`` as pip would (a module and its .dist-info)."""
    site.mkdir()
    (site / "house_kinds.py").write_text(PROVIDERS_MODULE)
    info = site / "house_kinds-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: house-kinds\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[raf.providers]\nmotto = house_kinds:motto\nbroken = house_kinds:missing\n"
    )


@pytest.mark.slow
def test_installed_packages_offer_kinds_through_entry_points(tmp_path: Path) -> None:
    install_kinds(tmp_path / "site")
    path = write(tmp_path, "[[providers]]\nkind = 'motto'\ntext = 'Be kind.'\n")
    done = raf("run", str(path), "hi", "--trace", pythonpath=(tmp_path / "site",))
    assert (done.returncode, done.stdout) == (0, "hi\n"), done.stderr
    assert "trace: Motto [motto] on_invoking" in done.stderr
    path = write(tmp_path, "[[providers]]\nkind = 'mottto'\n")
    err = assert_one_clear_line(raf("run", str(path), "hi", pythonpath=(tmp_path / "site",)))
    known = "broken, compression, knowledge, long_term_memory, mcp, memory, motto, skills, wiki"
    assert f"known kinds: {known}" in err
    path = write(tmp_path, "[[providers]]\nkind = 'broken'\n")
    err = assert_one_clear_line(raf("run", str(path), "hi", pythonpath=(tmp_path / "site",)))
    assert "providers[0]: provider kind 'broken': its entry point 'house_kinds:missing'" in err


# raf chat on a real terminal ------------------------------------------------------------------


class Terminal:
    """``raf ARGS`` on a pseudo-terminal: its controlling terminal, so Ctrl-C is a real SIGINT
    from the line discipline. ``stdout_pipe`` sends stdout to a pipe instead (to tell it apart
    from stderr, which stays on the terminal)."""

    def __init__(
        self, *args: str, cwd: Path, stdout_pipe: bool = False, env: dict[str, str] | None = None
    ) -> None:
        master, slave = os.openpty()
        self.master = master
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TERM": "xterm",
            "INPUTRC": "/dev/null",
            **(env or {}),
        }

        def controlling_terminal() -> None:  # in the child, before exec
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            # A run started in the background (`make test &`) ignores SIGINT, and so would
            # the child, and Python in it would never see a Ctrl-C: give it the default.
            signal.signal(signal.SIGINT, signal.SIG_DFL)

        self.process = subprocess.Popen(
            [sys.executable, "-m", "raf", *args],
            stdin=slave,
            stdout=subprocess.PIPE if stdout_pipe else slave,
            stderr=slave,
            cwd=cwd,
            env=env,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self.seen = b""

    def expect(self, text: str, timeout: float = 30.0) -> str:
        """Read until ``text`` has been seen; what came before it and it."""
        wanted = text.encode()
        deadline = time.monotonic() + timeout
        while wanted not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not seen in {self.seen!r}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk or wanted in self.seen, f"{text!r} not seen in {self.seen!r}"
                self.seen += chunk
        before, _, after = self.seen.partition(wanted)
        self.seen = after
        return (before + wanted).decode(errors="replace")

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def ctrl_c_until(self, text: str, attempts: int = 10) -> str:
        """Ctrl-C at a readline prompt, again every 2 s until ``text`` is seen.

        CPython's readline loop checks for signals only when its wait for a key
        is interrupted: a SIGINT that lands while it handles the previous key
        (microseconds, but a loaded machine stretches them) is seen at the
        next key, as a person pressing Ctrl-C again would find.
        """
        for _ in range(attempts - 1):
            self.send(b"\x03")
            with suppress(AssertionError):
                return self.expect(text, timeout=2.0)
        self.send(b"\x03")
        return self.expect(text)

    def close(self) -> int:
        try:
            return self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
            os.close(self.master)


@pytest.fixture
def terminals() -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for terminal in started:
        if terminal.process.poll() is None:
            terminal.process.kill()
            terminal.close()


SLOW_MODULE = '''
import pathlib
import anyio
from pydantic import BaseModel, ConfigDict
from raf import ContextProvider, ContextResult

class Record(ContextProvider):
    """Writes how each turn ended, in its post stage."""

    def __init__(self, file):
        self.file = file

    async def on_invoked(self, agent, session, request_messages, response, error):
        outcome = "ok" if error is None else type(error).__name__
        with self.file.open("a") as out:
            out.write(f"{request_messages[-1].content}: {outcome}\\n")

class Slow(ContextProvider):
    """A turn that says "slow" takes a minute, and says when it started."""

    async def on_invoking(self, agent, session, messages, options):
        if messages[-1].content == "slow":
            pathlib.Path("started").write_text("yes")
            await anyio.sleep(60)
        return ContextResult()

class HangOnStop(ContextProvider):
    """A post stage that never ends when the answer was stopped."""

    async def on_invoked(self, agent, session, request_messages, response, error):
        if type(error).__name__ == "StreamClosedError":
            pathlib.Path("hanging").write_text("yes")
            await anyio.sleep(600)

class RecordOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    file: str

def record(options):
    return Record(options.resolve(options.parse(RecordOptions).file))

def hang_on_stop(options):
    return HangOnStop()

def slow(options):
    return Slow()
'''


def slow_config(tmp_path: Path) -> Path:
    (tmp_path / "slowkinds.py").write_text(SLOW_MODULE)
    return write(
        tmp_path,
        "[[providers]]\nkind = 'slowkinds:record'\nfile = 'turns.log'\n\n"
        "[[providers]]\nkind = 'slowkinds:slow'\n",
    )


@pytest.mark.slow
def test_chat_on_a_terminal_empty_lines_ctrl_c_at_the_prompt_and_exit(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    terminal = Terminal("chat", str(EXAMPLE), cwd=tmp_path)
    terminals.append(terminal)
    terminal.expect("> ")
    terminal.send(b"\r")  # an empty line: a new prompt, not the end
    terminal.expect("> ")
    terminal.send(b"half a thought")
    terminal.expect("half a thought")
    terminal.ctrl_c_until("> ")  # Ctrl-C drops the line
    terminal.send(b"one\r")
    assert terminal.expect("> ").endswith("one\r\n> ")
    terminal.send(b"/exit\r")
    assert terminal.close() == 0


@pytest.mark.slow
def test_chat_on_a_terminal_ends_with_ctrl_d(tmp_path: Path, terminals: list[Terminal]) -> None:
    terminal = Terminal("chat", str(EXAMPLE), cwd=tmp_path)
    terminals.append(terminal)
    terminal.expect("> ")
    terminal.send(b"\x04")
    assert terminal.close() == 0


@pytest.mark.slow
def test_chat_on_a_terminal_has_line_editing_and_history(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    terminal = Terminal("chat", str(EXAMPLE), cwd=tmp_path)
    terminals.append(terminal)
    terminal.expect("> ")
    left = b"\x1b[D"
    terminal.send(b"hllo" + left * 3 + b"e\r")  # the cursor moved back to insert the "e"
    terminal.expect("hello\r\n")
    terminal.expect("> ")
    terminal.send(b"\x1b[A\r")  # the up arrow brings the last line back
    terminal.expect("hello\r\n")
    terminal.expect("> ")
    terminal.send(b"\x04")
    assert terminal.close() == 0


@pytest.mark.slow
def test_ctrl_c_during_an_answer_ends_that_turn_not_the_chat(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    terminal = Terminal("chat", str(slow_config(tmp_path)), cwd=tmp_path)
    terminals.append(terminal)
    terminal.expect("> ")
    terminal.send(b"slow\r")
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline, terminal.seen
        time.sleep(0.05)
    terminal.send(b"\x03")
    terminal.expect("raf: turn cancelled")
    terminal.expect("> ")
    # The turn's post stages ran, with the cancellation.
    assert (tmp_path / "turns.log").read_text() == "slow: CancelledError\n"
    terminal.send(b"next\r")
    terminal.expect("next\r\n")
    terminal.expect("> ")
    terminal.send(b"\x04")
    assert terminal.close() == 0
    assert (tmp_path / "turns.log").read_text() == "slow: CancelledError\nnext: ok\n"


@pytest.mark.slow
def test_a_thinking_line_on_the_terminal_until_the_answer(
    tmp_path: Path, terminals: list[Terminal]
) -> None:
    terminal = Terminal("chat", str(slow_config(tmp_path)), cwd=tmp_path, stdout_pipe=True)
    terminals.append(terminal)
    terminal.expect("ends the conversation")
    terminal.send(b"slow\r")
    terminal.expect("thinking…")
    terminal.send(b"\x03")
    terminal.expect("\r\x1b[K")  # cleared once the turn is over
    terminal.expect("raf: turn cancelled")
    terminal.send(b"quick\r")
    terminal.expect("thinking…")
    terminal.expect("\r\x1b[K")
    terminal.send(b"\x04")
    assert terminal.process.stdout is not None
    assert terminal.process.stdout.read() == b"quick\n"  # stdout: just the answer
    assert terminal.close() == 0


@pytest.mark.slow
def test_no_thinking_line_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    done = raf("chat", str(EXAMPLE), input="one\n\ntwo\n/exit\nthree\n", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "one\ntwo\n")
    assert "thinking" not in done.stderr


@pytest.mark.slow
def test_the_support_example_runs_offline(tmp_path: Path) -> None:
    done = raf("run", str(ROOT / "examples" / "support.toml"), "where is A-1042?", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "where is A-1042?\n"), done.stderr
    assert "model.end" in done.stderr


# raf chat streams ------------------------------------------------------------------------------


def streaming_config(tmp_path: Path, server: OpenAIServer) -> Path:
    (tmp_path / "slowkinds.py").write_text(SLOW_MODULE)
    return openai_config(
        tmp_path, server, extra="\n[[providers]]\nkind = 'slowkinds:record'\nfile = 'turns.log'\n"
    )


STREAM_ENV = {"SUPPORT_BOT_KEY": "sk-test", "NO_PROXY": "127.0.0.1,localhost"}


@pytest.mark.slow
def test_chat_prints_the_answer_as_it_streams_and_clears_thinking_at_the_first_update(
    tmp_path: Path, terminals: list[Terminal], server: OpenAIServer
) -> None:
    # A word a second: the first shows long before the last has come.
    server.reply(Reply(events=text_stream("Hello")))
    words = (chunk("", role="assistant"), chunk("Once"), chunk(" upon"), chunk(" a time"))
    server.reply(Reply(events=(*words, chunk(finish_reason="stop")), pause=1.0))
    path = streaming_config(tmp_path, server)
    terminal = Terminal("chat", str(path), cwd=tmp_path, env=STREAM_ENV)
    terminals.append(terminal)
    terminal.expect("> ")
    terminal.send(b"hi\r")
    terminal.expect("Hello\r\n")
    terminal.expect("> ")
    terminal.send(b"story\r")
    terminal.expect("thinking…")
    terminal.expect("\r\x1b[K")  # cleared at the first update, before the answer
    terminal.expect("Once")
    assert "a time" not in terminal.seen.decode(errors="replace")  # not yet come
    terminal.expect(" upon a time\r\n")
    terminal.expect("> ")
    terminal.send(b"\x04")
    assert terminal.close() == 0
    assert (tmp_path / "turns.log").read_text() == "hi: ok\nstory: ok\n"


def counting_chat(
    tmp_path: Path, terminals: list[Terminal], server: OpenAIServer, providers: str
) -> Terminal:
    """``raf chat --session me`` with ``providers``, in the middle of a long streamed answer.

    The model counts ``w0 w1 ...`` a word every 0.1 s for a minute, then
    answers "fine" to the next turn.
    """
    events = (chunk("", role="assistant"), *(chunk(f"w{n} ") for n in range(600)))
    server.reply(Reply(events=events, pause=0.1))
    server.reply(Reply(events=text_stream("fine")))
    (tmp_path / "slowkinds.py").write_text(SLOW_MODULE)
    path = openai_config(tmp_path, server, extra=providers)
    terminal = Terminal("chat", str(path), "--session", "me", cwd=tmp_path, env=STREAM_ENV)
    terminals.append(terminal)
    terminal.expect("> ")
    terminal.send(b"count\r")
    terminal.expect("w2 ")  # the answer is streaming
    return terminal


@pytest.mark.slow
def test_ctrl_c_during_a_streamed_answer_stops_it_and_keeps_what_was_said(
    tmp_path: Path, terminals: list[Terminal], server: OpenAIServer
) -> None:
    terminal = counting_chat(
        tmp_path,
        terminals,
        server,
        "\n[[providers]]\nkind = 'slowkinds:record'\nfile = 'turns.log'\n"
        "\n[[providers]]\nkind = 'memory'\npersist_partial = true\n",
    )
    terminal.send(b"\x03")
    terminal.expect("raf: answer stopped")
    terminal.expect("> ")
    # An early close: the post stages ran, not under cancellation; the connection is closed.
    assert (tmp_path / "turns.log").read_text() == "count: StreamClosedError\n"
    assert server.stream_aborted.wait(20)
    terminal.send(b"next\r")
    terminal.expect("fine\r\n")
    terminal.expect("> ")
    terminal.send(b"\x04")
    assert terminal.close() == 0
    assert (tmp_path / "turns.log").read_text() == "count: StreamClosedError\nnext: ok\n"
    # The memory provider kept what was said of the stopped answer: the next turn sent it.
    sent = server.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    stopped = sent[1]["content"]
    assert stopped.startswith("w0 w1 w2 ")
    assert set(stopped.split()) <= {f"w{n}" for n in range(600)}


@pytest.mark.slow
def test_a_second_ctrl_c_cancels_a_turn_that_does_not_stop(
    tmp_path: Path, terminals: list[Terminal], server: OpenAIServer
) -> None:
    terminal = counting_chat(
        tmp_path, terminals, server, "\n[[providers]]\nkind = 'slowkinds:hang_on_stop'\n"
    )
    terminal.send(b"\x03")  # stop: the early close's post stage hangs
    deadline = time.monotonic() + 30
    while not (tmp_path / "hanging").exists():
        assert time.monotonic() < deadline, terminal.seen
        time.sleep(0.05)
    terminal.send(b"\x03")  # cancel
    terminal.expect("raf: turn cancelled")
    terminal.expect("> ")
    terminal.send(b"next\r")
    terminal.expect("fine\r\n")
    terminal.expect("> ")
    terminal.send(b"\x04")
    assert terminal.close() == 0


@pytest.mark.slow
def test_run_prints_the_answer_as_it_streams_with_tool_calls_on_lines_of_their_own(
    tmp_path: Path, server: OpenAIServer
) -> None:
    (tmp_path / "house_tools.py").write_text(TOOLS_MODULE)
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "shout", "arguments": '{"text": "hi"}'},
    }
    server.reply(
        Reply(
            events=(
                chunk("Let me shout.", role="assistant"),
                chunk(tool_calls=[call]),
                chunk(finish_reason="tool_calls"),
            )
        ),
        Reply(events=text_stream("HI", "!")),
    )
    path = openai_config(tmp_path, server, extra='tools = ["house_tools:shout"]')
    done = raf(
        "run",
        str(path),
        "shout hi",
        "--trace",
        env=STREAM_ENV,
        cwd=tmp_path,
        pythonpath=(tmp_path,),
    )
    assert (done.returncode, done.stdout) == (0, "Let me shout.\nHI!\n"), done.stderr
    model_lines = [line for line in done.stderr.splitlines() if " model [chat] " in line]
    assert len(model_lines) == 2  # a line per model call, not per update
    assert "streamed 2 updates, first after " in model_lines[0]
    assert "streamed 3 updates, first after " in model_lines[1]


@pytest.mark.slow
def test_a_trace_into_the_same_file_as_the_answer_starts_its_own_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "raf", "run", str(EXAMPLE), "and again", "--trace"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout
    assert "and again" in lines  # a line of its own, not glued to the model's trace line
    assert lines.index("and again") + 1 == next(
        n for n, line in enumerate(lines) if line.startswith("trace: model [chat]")
    )
    assert "" not in lines  # and no empty line after it


def test_the_docs_traced_run_shows_the_answer_where_raf_run_prints_it() -> None:
    # docs/cli.md's traced run printed the answer after the post stages; it comes as the
    # model streams it, before the model's own trace line (the test above).
    text = (ROOT / "docs" / "cli.md").read_text()
    block = text.split('$ raf run examples/agent.toml "and again"', 1)[1].split("```", 1)[0]
    lines = block.splitlines()[1:]
    model = next(n for n, line in enumerate(lines) if line.startswith("trace: model [chat]"))
    assert lines[model - 1] == "and again"
    assert "streamed 3 updates" in lines[model]  # "and", " again" and the usage
    assert lines[-1].startswith("trace: HistoryProvider [memory] on_invoked")


# --- A config that is a FIFO, a tools module that exits: one clear line, never a hang -------


def test_raf_run_with_a_tools_module_that_exits_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "quitter.py").write_text("import sys\nsys.exit(0)\n")
    path = write(tmp_path, '[agent]\nname = "a"\ntools = ["quitter:tool"]\n')
    done = raf("run", str(path), "hi")
    assert "cannot import 'quitter'" in assert_one_clear_line(done)
