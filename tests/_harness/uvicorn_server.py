"""A served agent in a real uvicorn process on a free loopback port (tests and benchmarks).

``with ServedAgent(delay=0.01) as server: server.url`` runs
``uvicorn tests._harness.serve_agent:create --factory`` (or ``raf serve`` with
``command=``) and waits until ``/healthz`` answers; on the way out it sends
SIGTERM and waits for the process to end (tests/_harness/process.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests._harness.process import ServerProcess

__all__ = ["ServedAgent", "started"]

ROOT = Path(__file__).resolve().parents[2]


class ServedAgent(ServerProcess):
    """One server process serving :func:`tests._harness.serve_agent.create` (or ``command``)."""

    name = "the server"
    start_timeout = 90.0  # a loaded CI machine is slow to import
    stop_timeout = 30.0

    def __init__(
        self, *, workers: int = 1, command: list[str] | None = None, **config: Any
    ) -> None:
        super().__init__("raf-serve-")
        self.config = config
        self.workers = workers
        self.command = command

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str | Path]:
        command = self.command or [
            sys.executable, "-m", "uvicorn", "tests._harness.serve_agent:create", "--factory",
            "--workers", str(self.workers),
        ]  # fmt: skip
        return [*command, "--host", "127.0.0.1", "--port", str(self.port)]

    def popen_options(self) -> dict[str, Any]:
        env = {**os.environ, "RAF_TEST_SERVE": json.dumps(self.config), "PYTHONPATH": str(ROOT)}
        return {"cwd": ROOT, "env": env}

    def answers(self) -> bool:
        """Whether ``/healthz`` answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False


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
