"""One server process on a free loopback port, for the tests and the benchmarks.

(No pytest here: benchmarks/ use it too.) :class:`ServerProcess` starts the
command a subclass gives for a free port, its output in a log in a temporary
folder, and waits until the subclass's :meth:`ServerProcess.answers` says it
serves; on Linux the process dies with the process that started it
(``PR_SET_PDEATHSIG``), so a killed test run leaves no server behind.
``stop`` asks it to end (``stop_signal``), then kills it; leaving the ``with``
block also removes the folder. The Redis, PostgreSQL and uvicorn harnesses are
its subclasses.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["ServerProcess", "free_port"]


def free_port() -> int:
    """A TCP port that nothing listens on at the moment, on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGKILL it when its parent dies.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServerProcess:
    """A server process; a subclass says how to start it and how to see that it answers."""

    #: What the server is called in errors.
    name = "server"
    #: Seconds the server may take to answer (a loaded CI machine is slow to start one).
    start_timeout = 20.0
    #: The signal that asks the server to end (``stop`` kills it after its timeout).
    stop_signal = signal.SIGTERM
    #: Seconds ``stop`` waits for the server to end before it kills it.
    stop_timeout = 10.0
    #: Start-ups tried: another process may take the free port before the server does.
    attempts = 5

    def __init__(self, prefix: str) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        # Not under pytest's tmp_path: a server that is not root may have to write here.
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))
        self.log_path = self.folder / "server.log"

    def argv(self) -> list[str | Path]:
        """The command line that starts the server on ``self.port``."""
        raise NotImplementedError

    def answers(self) -> bool:
        """Whether the started server serves requests now."""
        raise NotImplementedError

    def popen_options(self) -> dict[str, Any]:
        """More arguments of ``subprocess.Popen`` (``cwd``, ``env``, ``user``, ...)."""
        return {}

    def log(self) -> str:
        """What the server wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> Self:
        """Start the server and wait until it answers (on a new port if it did not)."""
        for _ in range(self.attempts):
            if self.launch()._answered():
                return self
            self.stop()
        raise RuntimeError(f"{self.name} did not start; its log:\n{self.log()[-2000:]}")

    def launch(self) -> Self:
        """Start the process on a free port; :meth:`ready` waits until it answers."""
        self.port = free_port()
        with self.log_path.open("ab") as output:
            self.process = subprocess.Popen(
                self.argv(),
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                **self.popen_options(),
            )
        return self

    def ready(self) -> Self:
        """Wait until the launched server answers; an error with its log if it does not."""
        if not self._answered():
            self.stop()
            raise RuntimeError(f"{self.name} did not start; its log:\n{self.log()[-2000:]}")
        return self

    def _answered(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.answers():
                return True
            time.sleep(0.02)
        return False

    def stop(self, timeout: float | None = None) -> int | None:
        """Ask the server to end, kill it after ``timeout`` seconds; its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
