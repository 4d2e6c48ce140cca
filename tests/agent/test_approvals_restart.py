"""Approvals across real processes: one process pauses and exits, others resume.

On SQLite, on a real redis-server and on a real PostgreSQL: process A stops at the pending call
and exits; process B resumes it. Two processes resuming with one decision at
the same moment run the tool once: one answers, the other gets
``ApprovalError``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from raf import PostgresSessionStore, RedisSessionStore, SqliteSessionStore
from raf.compression import check_tool_pairing
from tests._harness.postgres_server import PostgresServer
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "sessions.db")
    if request.param == "postgres":
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        return postgres.url()
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


def _worker(
    mode: str, db: str, session: str, marker: Path, *token: str, backend: str = "asyncio"
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests._harness.approval_worker",
            mode,
            db,
            session,
            str(marker),
            backend,
            *token,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def _output(process: subprocess.Popen[str]) -> Any:
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def _stored(db: str, session_id: str) -> tuple[Any, Any]:
    async def read() -> tuple[Any, Any]:
        store: SqliteSessionStore | RedisSessionStore | PostgresSessionStore
        if db.startswith("redis://"):
            store = await RedisSessionStore(db).open()
        elif db.startswith("postgresql://"):
            store = await PostgresSessionStore(db).open()
        else:
            store = SqliteSessionStore(db)
        try:
            session = await store.get(session_id)
            return await session.get_messages(), ((), await session.list_pending())
        finally:
            await store.aclose()

    return anyio.run(read)


def test_a_process_pauses_and_exits_another_resumes(db: str, tmp_path: Path) -> None:
    # A on asyncio, B on trio: nothing of the pause lives in the process or its event loop.
    session, marker = f"restart-{tmp_path.name}", tmp_path / "ran"
    pending = _output(_worker("pause", db, session, marker))
    assert [p["call"]["name"] for p in pending] == ["delete"]
    assert not marker.exists()
    history, (_, waiting) = _stored(db, session)
    assert [p.token for p in waiting] == [pending[0]["token"]]
    marker.with_name("ran.go").touch()
    assert _output(_worker("resume", db, session, marker, pending[0]["token"], backend="trio")) == {
        "text": "All done.",
        "valid": True,
    }
    assert marker.read_text() == "a.txt\n"
    history, claim = _stored(db, session)
    assert claim == ((), ())
    assert check_tool_pairing(history) is None
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]


def test_two_processes_resuming_one_decision_run_the_tool_once(db: str, tmp_path: Path) -> None:
    session, marker = f"race-{tmp_path.name}", tmp_path / "ran"
    token = _output(_worker("pause", db, session, marker))[0]["token"]
    racers = [
        _worker("resume", db, session, marker, token, backend=backend)
        for backend in ("asyncio", "trio")
    ]
    deadline = time.monotonic() + 60  # both processes have opened the store: start them at once
    while len(list(tmp_path.glob("ran.ready.*"))) < 2:
        assert time.monotonic() < deadline, "the resuming processes did not get ready"
        time.sleep(0.01)
    marker.with_name("ran.go").touch()
    outcomes = sorted(json.dumps(_output(process)) for process in racers)
    assert outcomes == [
        json.dumps({"error": "ApprovalError"}),
        json.dumps({"text": "All done.", "valid": True}),
    ]
    assert marker.read_text() == "a.txt\n"
    history, _ = _stored(db, session)
    assert check_tool_pairing(history) is None
