"""A real ``redis-server`` on a free loopback port, for the tests and the benchmark.

(No pytest here: benchmarks/bench_redis.py uses it too; the fixture is in conftest.py.)
No persistence (``--save "" --appendonly no``), bound to 127.0.0.1; the process
harness (tests/_harness/process.py) stops it at the end, or with its parent.
``make test`` installs ``redis-server`` when the machine lacks it.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from tests._harness.process import ServerProcess, free_port

__all__ = ["RedisServer", "free_port"]


class RedisServer(ServerProcess):
    """One ``redis-server`` process; ``with RedisServer() as server: server.url``."""

    name = "redis-server"

    def __init__(self) -> None:
        super().__init__("raf-redis-")

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str | Path]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server is not installed: `make test` installs it "
                "(or: apt-get install redis-server)"
            )
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.folder),
            "--logfile", str(self.log_path),
        ]  # fmt: skip

    def answers(self) -> bool:
        return self.ping()

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
