"""The raf command for scripts and people: exit statuses, logs out of answers, Mermaid traces."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._harness.cli import run_raf
from tests._harness.openai_server import OpenAIServer

ROOT = Path(__file__).resolve().parents[2]

KINDS = '''
import pathlib
import anyio
import structlog
from raf import ContextProvider, ContextResult

class Noisy(ContextProvider):
    """Logs a warning and an error in its post stage, while the answer's line is open."""

    async def on_invoked(self, agent, session, request_messages, response, error):
        log = structlog.get_logger("raf")
        log.warning("noisy.warning")
        log.error("noisy.error")

class NoisyEarly(ContextProvider):
    """Logs an error in its pre stage, while "thinking…" is shown."""

    async def on_invoking(self, agent, session, messages, options):
        structlog.get_logger("raf").error("early.error")
        return ContextResult()

class Broken(ContextProvider):
    async def on_invoking(self, agent, session, messages, options):
        raise ValueError("broken on purpose")

class Slow(ContextProvider):
    async def on_invoking(self, agent, session, messages, options):
        pathlib.Path("started").write_text("yes")
        await anyio.sleep(60)
        return ContextResult()

class Record(ContextProvider):
    async def on_invoked(self, agent, session, request_messages, response, error):
        pathlib.Path("ended").write_text(type(error).__name__)

def noisy(options):
    return Noisy()

def noisy_early(options):
    return NoisyEarly()

def broken(options):
    return Broken()

def slow(options):
    return Slow()

def record(options):
    return Record()
'''


def config(tmp_path: Path, *kinds: str, model: str = "[model]\nclient = 'echo'\n") -> Path:
    (tmp_path / "kinds.py").write_text(KINDS)
    providers = "".join(f"[[providers]]\nkind = 'kinds:{kind}'\n\n" for kind in kinds)
    path = tmp_path / "agent.toml"
    path.write_text(f"{model}\n{providers}")
    return path


@pytest.fixture
def kinds_importable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kinds", raising=False)


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


# Exit statuses ------------------------------------------------------------------------------


def test_a_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_raf(["run", "--no-such-option"]) == 2
    assert "usage: raf run" in capsys.readouterr().err


def test_a_config_error_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[model]\nclient = 'no such client'\n")
    assert run_raf(["run", str(path), "hi"]) == 2
    assert capsys.readouterr().err.startswith(f"raf: {path}")


def test_a_failed_model_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAF_TEST_KEY", "sk")
    server = OpenAIServer()
    try:
        server.fail(401, "no such key")  # not retryable: one request, then the error
        model = (
            f"[model]\nclient = 'openai'\nmodel = 'm'\nbase_url = '{server.base_url}'\n"
            "api_key_env = 'RAF_TEST_KEY'\n"
        )
        assert run_raf(["run", str(config(tmp_path, model=model)), "hi"]) == 3
    finally:
        server.close()
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("raf: ")
    assert "no such key" in err


@pytest.mark.usefixtures("kinds_importable")
def test_a_provider_that_fails_the_run_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_raf(["run", str(config(tmp_path, "broken")), "hi"]) == 1
    assert "broken on purpose" in capsys.readouterr().err


@pytest.mark.slow
def test_an_interrupted_run_exits_130_after_its_post_stages(tmp_path: Path) -> None:
    path = config(tmp_path, "record", "slow")
    process = subprocess.Popen(
        [sys.executable, "-m", "raf", "run", str(path), "hi"],
        cwd=tmp_path,
        env=env(PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A suite started in the background ignores SIGINT; the command must not.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline
            assert process.poll() is None, process.stderr
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    # The post stage ran, with the cancellation, before the command exited.
    assert (tmp_path / "ended").read_text() == "CancelledError"


# Logs never land inside an answer -----------------------------------------------------------


@pytest.mark.usefixtures("kinds_importable")
def test_piped_stderr_gets_every_log_event_and_stdout_only_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import structlog

    structlog.reset_defaults()  # as a fresh process: the command configures structlog
    assert run_raf(["run", str(config(tmp_path, "noisy")), "hello"]) == 0
    out, err = capsys.readouterr()
    assert out == "hello\n"
    assert [line.split()[-1] for line in err.splitlines()] == ["noisy.warning", "noisy.error"]
    assert not structlog.is_configured()  # the command leaves structlog as it found it


class Terminal:
    """``raf ARGS`` with stdout and stderr on one pseudo-terminal, as a person runs it."""

    def __init__(self, *args: str, cwd: Path, stdin: bool = False) -> None:
        master, slave = os.openpty()
        self.master = master
        self.process = subprocess.Popen(
            [sys.executable, "-m", "raf", *args],
            stdin=slave if stdin else subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            env=env(PYTHONPATH=f"{ROOT}{os.pathsep}{cwd}", TERM="xterm"),
        )
        os.close(slave)

    def output(self) -> str:
        """Everything the command wrote, once it has ended."""
        seen = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            elif self.process.poll() is not None:
                break
        return seen.decode(errors="replace").replace("\r\n", "\n")

    def close(self) -> int:
        try:
            return self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            os.close(self.master)


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[list[Terminal]]:
    started: list[Terminal] = []
    yield started
    for one in started:
        if one.process.poll() is None:
            one.close()


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True])
def test_on_a_terminal_only_errors_unless_verbose_each_on_its_own_line(
    tmp_path: Path, terminal: list[Terminal], verbose: bool
) -> None:
    args = ["run", str(config(tmp_path, "noisy")), "hello", *(["--verbose"] if verbose else [])]
    terminal.append(Terminal(*args, cwd=tmp_path))
    output = terminal[0].output()
    assert terminal[0].close() == 0, output
    lines = re.sub(r"\x1b\[[0-9;]*m", "", output).splitlines()  # structlog's colours
    assert lines[0] == "hello"  # the answer's line, whole: the log lines come after it
    events = [line.split()[-1] for line in lines[1:]]
    assert events == (["noisy.warning", "noisy.error"] if verbose else ["noisy.error"])


# --trace=mermaid -----------------------------------------------------------------------------

TOOLS = '''
import raf

@raf.tool
def shout(text: str) -> str:
    """Say it louder."""
    return text.upper() + "!"
'''


def test_trace_mermaid_draws_the_run_in_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "shout_tools.py").write_text(TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    server = OpenAIServer()
    try:
        server.answer(content=None, tool_calls=[("c1", "shout", '{"text": "hi; #1"}')])
        server.answer(content="HI; #1!")
        monkeypatch.setenv("RAF_TEST_KEY", "sk")
        path = tmp_path / "agent.toml"
        path.write_text(
            "[agent]\ntools = ['shout_tools:shout']\n\n"
            f"[model]\nclient = 'openai'\nmodel = 'm'\nbase_url = '{server.base_url}'\n"
            "api_key_env = 'RAF_TEST_KEY'\n\n"
            "[[providers]]\nkind = 'memory'\n"
        )
        assert run_raf(["run", str(path), "say hi", "--trace=mermaid"]) == 0
    finally:
        server.close()
    out, err = capsys.readouterr()
    assert out == "HI; #1!\n"
    assert err.splitlines() == [
        "sequenceDiagram",
        "    participant caller",
        "    participant raf",
        "    participant p1 as HistoryProvider",
        "    participant model",
        "    participant t1 as tool shout",
        "    caller->>raf: run: say hi",
        "    raf->>p1: on_invoking",
        "    p1-->>raf: nothing added",
        "    raf->>model: complete: 1 message, 1 tool",
        "    model-->>raf: tool calls: shout",
        '    raf->>t1: shout {"text": "hi#59; #35;1"}',
        "    t1-->>raf: 7 chars",
        "    raf->>model: complete: 3 messages, 1 tool",
        "    model-->>raf: ok",
        "    raf->>p1: on_invoked",
        "    p1-->>raf: done",
        "    raf-->>caller: answer: HI#59; #35;1!",
    ]


@pytest.mark.usefixtures("kinds_importable")
def test_trace_mermaid_draws_an_error_as_a_crossed_arrow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, "record", "broken")
    assert run_raf(["run", str(path), "hi", "--trace=mermaid"]) == 1
    err = capsys.readouterr().err.splitlines()
    diagram = err[: err.index("raf: " + err[-1][5:])]
    assert diagram[diagram.index("    caller->>raf: run: hi") :] == [
        "    caller->>raf: run: hi",
        "    raf->>p1: on_invoking",
        "    p1-->>raf: nothing added",
        "    raf->>p2: on_invoking",
        "    p2--xraf: raised ValueError: broken on purpose",
        "    raf->>p1: on_invoked",
        "    p1-->>raf: done",
        "    raf--xcaller: raised ProviderError: context provider Broken.on_invoking failed: "
        "ValueError: broken on purpose",
    ]
    assert err[-1].startswith("raf: ")


def test_the_library_never_configures_structlog() -> None:
    import anyio
    import structlog

    import raf

    structlog.reset_defaults()
    agent = raf.Agent(raf.EchoChatClient(), chat_stack=[raf.LoggingMiddleware()])
    assert anyio.run(agent.run, "hi").text == "hi"  # it logs (structlog's defaults print)
    assert not structlog.is_configured()


@pytest.mark.slow
def test_in_chat_a_log_line_clears_thinking_and_thinking_comes_back(
    tmp_path: Path, terminal: list[Terminal]
) -> None:
    args = ["chat", str(config(tmp_path, "noisy_early"))]
    terminal.append(Terminal(*args, cwd=tmp_path, stdin=True))
    os.write(terminal[0].master, b"hello\r/exit\r")
    output = re.sub(r"\x1b\[[0-9;]*m", "", terminal[0].output())
    assert terminal[0].close() == 0, output
    # "thinking…" is cleared (\r, erase line) before the event's line, shown again after
    # it, and cleared again at the answer: the event and the answer each on a line of
    # their own.
    shown = output.split("\r\x1b[K")
    event = next(i for i, part in enumerate(shown) if "early.error" in part)
    assert shown[event - 1].endswith("thinking…"), output
    line, again = shown[event].split("\n")
    assert line.split()[-1] == "early.error", output  # the event, on a line of its own
    assert again == "thinking…", output  # then "thinking…" again
    assert shown[event + 1].startswith("hello\n"), output
