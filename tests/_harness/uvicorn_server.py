"""A served agent in a real uvicorn process on a free loopback port (tests and benchmarks).

``with ServedAgent(delay=0.01) as server: server.url`` runs
``uvicorn tests._harness.serve_agent:create --factory`` (or ``raf serve`` with
``command=``) and waits until ``/healthz`` answers; on the way out it sends
SIGTERM and waits for the process to end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from tests._harness.redis_server import _die_with_parent, free_port

__all__ = ["ServedAgent", "started"]

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a server may take to start (a loaded CI machine is slow to import).
START_TIMEOUT = 90


class ServedAgent:
    """One server process serving :func:`tests._harness.serve_agent.create` (or ``command``)."""

    def __init__(
        self, *, workers: int = 1, command: list[str] | None = None, **config: Any
    ) -> None:
        self.config = config
        self.workers = workers
        self.command = command
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        folder = tempfile.mkdtemp(prefix="raf-serve-")
        self._log_path = Path(folder) / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self._log_path.read_text(errors="replace") if self._log_path.exists() else ""

    def start(self) -> ServedAgent:
        return self.launch().ready()

    def launch(self) -> ServedAgent:
        """Start the process (on a free port); :meth:`ready` waits until it answers."""
        self.port = free_port()
        command = self.command or [
            sys.executable, "-m", "uvicorn", "tests._harness.serve_agent:create", "--factory",
            "--workers", str(self.workers),
        ]  # fmt: skip
        command = [*command, "--host", "127.0.0.1", "--port", str(self.port)]
        env = {**os.environ, "RAF_TEST_SERVE": json.dumps(self.config), "PYTHONPATH": str(ROOT)}
        with self._log_path.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        return self

    def ready(self) -> ServedAgent:
        """Wait until ``/healthz`` answers 200."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server ended at start:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"no answer within {START_TIMEOUT} s:\n{self.log()}")

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, then wait (SIGKILL after ``timeout``); the exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> ServedAgent:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self._log_path.parent, ignore_errors=True)


@contextlib.contextmanager
def started(*servers: ServedAgent) -> Iterator[tuple[ServedAgent, ...]]:
    """Start every server at once (their start-ups overlap), stop them all at the end."""

    with contextlib.ExitStack() as stack:
        for server in servers:
            stack.callback(server.__exit__, None, None, None)
            if server.process is None:  # one launched already (to know its port) goes on
                server.launch()
        for server in servers:
            server.ready()
        yield servers
