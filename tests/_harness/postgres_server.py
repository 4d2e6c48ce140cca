"""A real PostgreSQL server on a free loopback port, in a temporary folder, as an unprivileged user.

(No pytest here: benchmarks/bench_durable.py uses it too; the fixture is in
tests/durable/test_recovery.py.) ``make test`` installs Debian's
``postgresql`` when the machine lacks it. Postgres refuses to run as root:
under root, the cluster belongs to ``nobody`` and the server runs as
``nobody`` (setuid in the child, like ``runuser -u nobody``). ``initdb`` with
trust authentication on 127.0.0.1 only, no persistence beyond the folder;
on Linux the server dies with the process that started it, and ``stop``
removes the folder.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tests._harness.redis_server import _die_with_parent, free_port

__all__ = ["PostgresServer", "postgres_bin"]

START_TIMEOUT = 30.0


def postgres_bin() -> Path | None:
    """The folder of Debian's ``initdb`` and ``postgres`` (the newest version), if installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _version(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


class PostgresServer:
    """One ``postgres`` process; ``with PostgresServer() as server: server.url("db")``."""

    def __init__(self) -> None:
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        # Not under pytest's tmp_path: its folders are root's alone, and the server is not root.
        self.folder = Path(tempfile.mkdtemp(prefix="raf-postgres-"))
        self._user: dict[str, Any] = {}
        if os.geteuid() == 0:
            self._user = {"user": "nobody", "group": "nogroup"}
            shutil.chown(self.folder, "nobody", "nogroup")

    def url(self, database: str = "postgres") -> str:
        """``postgresql://raf@127.0.0.1:PORT/DATABASE`` (trust authentication, loopback only)."""
        return f"postgresql://raf@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        """initdb, then start the server and wait until it accepts connections."""
        binaries = postgres_bin()
        if binaries is None:
            raise RuntimeError(
                "PostgreSQL is not installed: `make test` installs it "
                "(or: apt-get install postgresql)"
            )
        data = self.folder / "data"
        subprocess.run(
            [
                binaries / "initdb",
                "-D",
                data,
                "-U",
                "raf",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            cwd=self.folder,
            **self._user,
        )
        log = self.folder / "postgres.log"
        for _ in range(5):  # another process may take the free port before the server does
            self.port = free_port()
            command = [
                binaries / "postgres",
                "-D", data,
                "-p", str(self.port),
                "-c", "listen_addresses=127.0.0.1",
                "-c", f"unix_socket_directories={self.folder}",
                "-c", "fsync=off",  # a throwaway cluster: durability of the files is not tested
                "-c", "max_connections=200",
            ]  # fmt: skip
            with log.open("ab") as output:
                self.process = subprocess.Popen(
                    command,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    cwd=self.folder,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                    **self._user,
                )
            if self._wait_until_ready():
                return self
            self.stop()
        raise RuntimeError(f"postgres did not start; its log:\n{log.read_text()[-2000:]}")

    def _wait_until_ready(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        log = self.folder / "postgres.log"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if b"ready to accept connections" in log.read_bytes():
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                    return True
                except OSError:
                    pass
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Stop the server (SIGINT: fast shutdown, then SIGKILL after 10 s) and wait for it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(2)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)
