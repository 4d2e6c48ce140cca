"""A real PostgreSQL server on a free loopback port, in a temporary folder, as an unprivileged user.

(No pytest here: benchmarks/bench_durable.py uses it too; the fixture is in
tests/durable/test_recovery.py.) ``make test`` installs Debian's
``postgresql`` when the machine lacks it. Postgres refuses to run as root:
under root, the cluster belongs to ``nobody`` and the server runs as
``nobody`` (setuid in the child, like ``runuser -u nobody``). ``initdb`` with
trust authentication on 127.0.0.1 only, no persistence beyond the folder; the
process harness (tests/_harness/process.py) stops it at the end, or with its
parent, and removes the folder.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests._harness.process import ServerProcess

__all__ = ["PostgresServer", "postgres_bin"]

_READY = b"ready to accept connections"

#: The cluster initdb made in this process, copied for each server: initdb costs some 0.8 s
#: of CPU, a copy 0.3 s, and a test process may start several servers.
_template: Path | None = None


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


class PostgresServer(ServerProcess):
    """One ``postgres`` process; ``with PostgresServer() as server: server.url("db")``."""

    name = "postgres"
    start_timeout = 30.0
    stop_signal = signal.SIGINT  # fast shutdown

    def __init__(self) -> None:
        super().__init__("raf-postgres-")
        self._user: dict[str, Any] = {}
        self._ready_before = 0  # "ready" lines in the log before this start (a restart's)
        if os.geteuid() == 0:
            self._user = {"user": "nobody", "group": "nogroup"}
            shutil.chown(self.folder, "nobody", "nogroup")

    def url(self, database: str = "postgres") -> str:
        """``postgresql://raf@127.0.0.1:PORT/DATABASE`` (trust authentication, loopback only)."""
        return f"postgresql://raf@127.0.0.1:{self.port}/{database}"

    def start(self) -> PostgresServer:
        """A new cluster (initdb's, copied), then start the server and wait until it accepts
        connections."""
        copy = ["cp", "-a", self._template(), self.folder / "data"]
        subprocess.run(copy, check=True, capture_output=True, **self.popen_options())
        return super().start()

    def _template(self) -> Path:
        """The cluster initdb made in this process (made now if none yet); removed at exit."""
        global _template
        if _template is None:
            folder = Path(tempfile.mkdtemp(prefix="raf-postgres-template-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            if self._user:
                shutil.chown(folder, "nobody", "nogroup")
            initdb: list[str | Path] = [
                self._binaries() / "initdb",
                "-D", folder / "data",
                "-U", "raf",
                "--auth=trust",
                "-E", "UTF8",
                "--no-sync",
            ]  # fmt: skip
            options = {**self.popen_options(), "cwd": folder}
            subprocess.run(initdb, check=True, capture_output=True, **options)
            _template = folder / "data"
        return _template

    def argv(self) -> list[str | Path]:
        return [
            self._binaries() / "postgres",
            "-D", self.folder / "data",
            "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={self.folder}",
            "-c", "fsync=off",  # a throwaway cluster: durability of the files is not tested
            "-c", "max_connections=200",
        ]  # fmt: skip

    def popen_options(self) -> dict[str, Any]:
        return {"cwd": self.folder, **self._user}

    def answers(self) -> bool:
        if self.log_path.read_bytes().count(_READY) <= self._ready_before:
            return False
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
        except OSError:
            return False
        return True

    def _binaries(self) -> Path:
        binaries = postgres_bin()
        if binaries is None:
            raise RuntimeError(
                "PostgreSQL is not installed: `make test` installs it "
                "(or: apt-get install postgresql)"
            )
        return binaries

    def pids(self) -> list[int]:
        """The postmaster's process id and its children's (one backend per connection)."""
        assert self.process is not None
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [pid, *map(int, children)]

    def restart(self) -> PostgresServer:
        """Stop the server (fast shutdown: it ends its clients' connections) and start it
        again on the same port and data: the clients' open connections are dead."""
        self.stop()
        self._ready_before = self.log_path.read_bytes().count(_READY)
        with self.log_path.open("ab") as output:
            self.process = subprocess.Popen(
                self.argv(), stdout=output, stderr=subprocess.STDOUT, **self.popen_options()
            )
        return self.ready()

    @contextmanager
    def frozen(self) -> Iterator[None]:
        """Every process of the server stopped (SIGSTOP): connections stay open and
        connecting still succeeds (the kernel accepts), but nothing answers; SIGCONT after."""
        pids = self.pids()
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                _signal(pid, signal.SIGCONT)


def _signal(pid: int, number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # a backend whose client has just left
        os.kill(pid, number)
