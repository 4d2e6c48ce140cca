"""A real ``redis-server`` on a free loopback port, for the tests and the benchmark.

(No pytest here: benchmarks/bench_redis.py uses it too; the fixture is in conftest.py.)

No persistence (``--save "" --appendonly no``), bound to 127.0.0.1, stopped
at the end; on Linux the server also dies with the process that started it
(``PR_SET_PDEATHSIG``), so a killed test run leaves no server behind.
``make test`` installs ``redis-server`` when the machine lacks it.
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

__all__ = ["RedisServer", "free_port"]

START_TIMEOUT = 20.0


def free_port() -> int:
    """A TCP port that nothing listens on at the moment, on 127.0.0.1."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: SIGKILL it when its parent dies.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class RedisServer:
    """One ``redis-server`` process; ``with RedisServer() as server: server.url``."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._folder = tempfile.TemporaryDirectory(prefix="raf-redis-")

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers ``PING``."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: `make test` installs it "
                "(or: apt-get install redis-server)"
            )
        log = Path(self._folder.name) / "redis.log"
        for _ in range(5):  # another process may take the free port before the server does
            self.port = free_port()
            command = [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", self._folder.name,
                "--logfile", str(log),
            ]  # fmt: skip
            with log.open("ab") as output:
                self.process = subprocess.Popen(
                    command,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            if self._wait_until_ready():
                return self
            self.stop()
        raise RuntimeError(f"redis-server did not start; its log:\n{log.read_text()[-2000:]}")

    def _wait_until_ready(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self.ping():
                return True
            time.sleep(0.02)
        return False

    def ping(self) -> bool:
        """Whether the server answers ``PING`` right now."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def command(self, *args: str) -> bytes:
        """Send one command in RESP, return the raw reply (for tests that poke the server)."""
        payload = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            payload += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5.0) as conn:
            conn.sendall(payload)
            return conn.recv(1 << 16)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and wait for it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self._folder.cleanup()
