"""Durable runs survive a worker killed for real (SIGKILL), on SQLite and on PostgreSQL.

The kind ``"one-postgres"`` keeps the sessions (PostgresSessionStore) in the same
PostgreSQL database as DBOS's system tables: one database for everything.

Each test starts a worker process (tests/_harness/durable_worker.py), kills it with
SIGKILL at a chosen point, and starts another worker that launches DBOS on
the same system database and recovers the run. The log the model, the
tools and the providers write says what ran, in which process, how often.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._harness.durable_load import load
from tests._harness.postgres_server import PostgresServer, postgres_bin

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parents[1] / "_harness" / "durable_worker.py"
ROOT = WORKER.parents[2]
DEADLINE = 60.0


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL on a free loopback port, as an unprivileged user, stopped at the end."""
    if postgres_bin() is None:
        pytest.skip(
            "PostgreSQL is not installed (make test installs it: apt-get install postgresql)"
        )
    with PostgresServer() as server:
        yield server


def _worker(
    mode: str, system_db: str, folder: Path, *extra: str, run: str = "turn-1"
) -> subprocess.Popen[str]:
    # The sessions: the SQLite file, or the database _system_db named ("one-postgres").
    url = folder / "sessions.url"
    sessions = url.read_text() if url.exists() else str(folder / "sessions.db")
    command = [
        sys.executable, str(WORKER), mode,
        "--system-db", system_db,
        "--sessions", sessions,
        "--log", str(folder / "log"),
        "--ids", run,
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _log(folder: Path) -> list[tuple[str, int]]:
    """The log's lines as (what, pid), the time left out."""
    path = folder / "log"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        what, _, rest = line.partition(" pid=")
        lines.append((what, int(rest.split()[0])))
    return lines


def _crash(
    system_db: str,
    folder: Path,
    hang: str,
    until: str,
    *extra: str,
    run: str = "turn-1",
    mode: str = "run",
) -> int:
    """Start a worker, wait until the log says ``until``, SIGKILL it; its pid."""
    worker = _worker(mode, system_db, folder, "--hang", hang, *extra, run=run)
    _until(worker, folder, until)
    worker.send_signal(signal.SIGKILL)
    worker.communicate()
    assert worker.returncode == -signal.SIGKILL
    return worker.pid


def _until(worker: subprocess.Popen[str], folder: Path, line: str) -> None:
    """Wait until the log has ``line`` (written by ``worker``, which must not end first)."""
    deadline = time.monotonic() + DEADLINE
    while not any(what == line for what, pid in _log(folder) if pid == worker.pid):
        if worker.poll() is not None:
            pytest.fail(f"the worker ended before {line!r}: {worker.communicate()[1][-3000:]}")
        assert time.monotonic() < deadline, f"the worker never logged {line!r}"
        time.sleep(0.02)


def _result(worker: subprocess.Popen[str]) -> dict[str, object]:
    """What the worker printed last, once it ended well."""
    out, err = worker.communicate(timeout=DEADLINE)
    assert worker.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])  # type: ignore[no-any-return]


def _recover(system_db: str, folder: Path) -> tuple[dict[str, object], int]:
    """Start another worker, which recovers the run: its result and pid."""
    worker = _worker("recover", system_db, folder)
    out, err = worker.communicate(timeout=DEADLINE)
    assert worker.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1]), worker.pid


def _system_db(kind: str, folder: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{folder / 'dbos.sqlite'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    url = server.url(f"raf_{folder.name.replace('-', '_').lower()[-40:]}")
    if kind == "one-postgres":
        (folder / "sessions.url").write_text(url)
    return url


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "one-postgres"])
def test_a_worker_killed_after_the_second_of_three_tool_calls_is_recovered(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    system_db = _system_db(kind, tmp_path, request)
    # The third model call hangs: the worker dies after the second tool call completed.
    first = _crash(system_db, tmp_path, "model3", "model turn-1 3")
    result, second = _recover(system_db, tmp_path)

    assert result == {"id": "turn-1", "text": "sum=14", "history": 8}  # 1 + 4 + 9, as uncrashed
    log = _log(tmp_path)
    ran = Counter(what for what, _ in log)
    # Completed calls are not repeated: their results come from DBOS's log.
    for number in (1, 2):
        assert ran[f"model turn-1 {number}"] == 1
        assert ran[f"tool start {number} key=turn-1:{2 * number + 1}"] == 1  # after raf.history
    # The model call in flight at the kill runs again (its result was never recorded).
    assert [pid for what, pid in log if what == "model turn-1 3"] == [first, second]
    assert ran["tool start 3 key=turn-1:7"] == 1
    assert ran["model turn-1 4"] == 1
    # The pre stages run again on recovery, and know it; the post stages run once, there.
    assert [(what, pid) for what, pid in log if what.startswith("pre")] == [
        ("pre turn-1 repeated=False", first),
        ("pre turn-1 repeated=True", second),
    ]
    assert [(what, pid) for what, pid in log if what.startswith("post")] == [
        ("post turn-1 error=NoneType", second)
    ]
    # What the recovering worker ran comes after everything the first one did.
    pids = [pid for _, pid in log]
    assert pids == sorted(pids, key=lambda pid: pid == second)


@pytest.mark.parametrize("kind", ["sqlite", "one-postgres"])
def test_a_worker_killed_after_the_history_write_does_not_store_the_turn_twice(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    system_db = _system_db(kind, tmp_path, request)
    # The outermost post stage hangs: the history provider (inside it) has written the
    # turn, and DBOS has not marked the workflow done when the worker dies.
    first = _crash(system_db, tmp_path, "post", "post turn-1 error=NoneType")
    result, second = _recover(system_db, tmp_path)

    assert result == {"id": "turn-1", "text": "sum=14", "history": 8}  # not 16
    log = _log(tmp_path)
    # Every model and tool call completed in the first worker: none runs again (the tool
    # middleware outside the steps sees the replayed calls: "tool recorded").
    calls = ("model", "tool start", "tool done")
    assert {pid for what, pid in log if what.startswith(calls)} == {first}
    assert {pid for what, pid in log if what.startswith("tool recorded")} == {first, second}
    assert [pid for what, pid in log if what.startswith("post")] == [first, second]


def test_load_on_postgres_with_a_worker_killed(postgres: PostgresServer, tmp_path: Path) -> None:
    # The small version of `make bench-durable`'s load (four workers, 100 runs, two kills).
    result = load(
        postgres.url("raf_load_test"), tmp_path, workers=2, runs=6, kills=1, tool_seconds=0.1
    )
    assert result["problems"] == []
    assert result["completed"] == 6
    assert result["tool_calls_completed_twice"] == 0
    assert result["histories_duplicated"] == 0


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "one-postgres"])
def test_a_worker_killed_while_its_run_waits_for_approval_is_recovered_and_decided_elsewhere(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    system_db = _system_db(kind, tmp_path, request)
    # The second of three tool calls waits for approval; the worker dies while its run
    # waits for the decision inside DBOS.
    first = _crash(system_db, tmp_path, "none", "waiting turn-1", "--approve")
    recovering = _worker("recover", system_db, tmp_path, "--approve")
    _until(recovering, tmp_path, "launched recover")  # its launch recovered the wait
    # A third process decides: its launch recovers nothing (another executor id).
    decider = _worker("decide", system_db, tmp_path, "--approve", "--executor", "decider")
    out, err = decider.communicate(timeout=DEADLINE)
    assert decider.returncode == 0, err[-3000:]
    decided = json.loads(out.splitlines()[-1])
    out, err = recovering.communicate(timeout=DEADLINE)
    assert recovering.returncode == 0, err[-3000:]
    result = json.loads(out.splitlines()[-1])

    # The same answer as a run that was never killed nor paused: 1 + 4 + 9.
    assert decided == {"id": "turn-1", "text": "sum=14", "history": 8}
    assert result == decided
    log = _log(tmp_path)
    second, third = recovering.pid, decider.pid
    # What completed before the kill is not repeated; the approved call runs once, in the
    # recovered wait, after the decision was made, and the loop goes on there.
    calls = [(what, pid) for what, pid in log if what.startswith(("model", "tool start"))]
    assert [(what.split(" key=")[0], pid) for what, pid in calls] == [
        ("model turn-1 1", first),
        ("tool start 1", first),
        ("model turn-1 2", first),
        ("tool start 2", second),
        ("model turn-1 3", second),
        ("tool start 3", second),
        ("model turn-1 4", second),
    ]
    # Each tool call's key is a step of the run's own workflow, the same one throughout.
    keys = [what.split(" key=")[1] for what, _ in calls if " key=" in what]
    assert all(key.startswith("turn-1:") for key in keys), keys
    assert len(set(keys)) == 3, keys
    launched = [what for what, pid in log].index("launched decide")
    assert [what for what, _ in log].index(calls[3][0]) > launched
    # The first pass's post stages ran before the wait, and again when the recovered worker
    # replayed that pass (post stages are not steps; its history write was not made twice:
    # the history has 8 messages); then the resumed pass's. Nothing ran in the decider but
    # the claim and the message.
    assert [(what, pid) for what, pid in log if what.startswith("post")] == [
        ("post turn-1 error=NoneType", first),
        ("post turn-1 error=NoneType", second),
        ("post turn-1 error=NoneType", second),
    ]
    assert [what for what, pid in log if pid == third] == ["launched decide"]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_worker_killed_after_its_run_denied_the_calls_another_run_waits_on_is_recovered(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    system_db = _system_db(kind, tmp_path, request)
    shared = ("--approve", "--session", "turn-1")
    # turn-1 waits for the approval of its second call, in a worker of its own.
    waiting = _worker("run", system_db, tmp_path, *shared, "--executor", "first")
    _until(waiting, tmp_path, "waiting turn-1")
    # A new message in that session, turn-2, denies that call and tells turn-1 (DBOS.send
    # in its workflow); then its own second call waits, and its worker dies.
    first = _crash(system_db, tmp_path, "none", "waiting turn-2", *shared, run="turn-2")
    told = _result(waiting)  # turn-1 stopped waiting as it was told, before its timeout
    assert told["text"] == ""
    # The recovering worker replays turn-2's pass (the denial and the message included),
    # and a third process approves turn-2's call.
    recovering = _worker("recover", system_db, tmp_path, *shared, run="turn-2")
    _until(recovering, tmp_path, "launched recover")
    decider = _worker("decide", system_db, tmp_path, *shared, "--executor", "d", run="turn-2")
    decided = _result(decider)
    result = _result(recovering)

    # turn-1 kept 4 messages and its denied call's answer; turn-2 is a whole turn: 5 + 8.
    assert decided == {"id": "turn-2", "text": "sum=14", "history": 13}
    assert result == decided
    log = _log(tmp_path)
    second = recovering.pid
    calls = [(what.split(" key=")[0], pid) for what, pid in log if what.startswith("tool start")]
    assert calls == [
        ("tool start 1", waiting.pid),
        ("tool start 1", first),
        ("tool start 2", second),
        ("tool start 3", second),
    ]


def test_a_worker_killed_in_the_run_a_decision_started_is_recovered(tmp_path: Path) -> None:
    system_db = f"sqlite:///{tmp_path / 'dbos.sqlite'}"
    # turn-1 does not wait: it ends with its second call pending.
    ended = _result(_worker("run", system_db, tmp_path, "--approve", "--approval-timeout", "0"))
    assert ended == {"id": "turn-1", "text": "", "history": 4}
    # No run waits for the decision: it starts turn-1-decided (which claims the call from
    # the store), whose worker dies in the model call after the approved call.
    first = _crash(system_db, tmp_path, "model3", "model turn-1 3", "--approve", mode="decide")
    recovering = _worker(
        "recover", system_db, tmp_path, "--session", "turn-1", run="turn-1-decided"
    )
    result = _result(recovering)

    assert result == {"id": "turn-1-decided", "text": "sum=14", "history": 8}
    log = _log(tmp_path)
    calls = [(what.split(" key=")[0], pid) for what, pid in log if what.startswith("tool start")]
    assert [pid for what, pid in calls if what == "tool start 2"] == [first]  # run once
    assert [pid for what, pid in log if what == "model turn-1 3"] == [first, recovering.pid]


def test_one_database_holds_the_sessions_and_dbos_tables(
    postgres: PostgresServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import psycopg

    system_db = _system_db("one-postgres", tmp_path, request)
    _crash(system_db, tmp_path, "model3", "model turn-1 3")
    result, _ = _recover(system_db, tmp_path)
    assert result == {"id": "turn-1", "text": "sum=14", "history": 8}
    with psycopg.connect(system_db) as conn:
        tables = conn.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables "
            "WHERE table_name IN ('raf_messages', 'workflow_status')"
        ).fetchall()
        stored = conn.execute("SELECT count(*) FROM raf_messages").fetchone()
    assert sorted(name for (name,) in tables) == ["dbos.workflow_status", "public.raf_messages"]
    assert stored == (8,)
