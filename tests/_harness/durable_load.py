"""The durable load test: workers on one system database, some killed (SIGKILL) and restarted.

(No pytest here: benchmarks/bench_durable.py prints its table, and
tests/durable/test_recovery.py runs a small one.) Each worker
(tests/_harness/durable_worker.py) has its own executor id and its own share of the
runs, all at once. ``kills`` workers, picked at random, are SIGKILLed at a
random moment while their runs are under way, and restarted with the same
executor id, as a supervisor would: the restarted worker's DBOS launch
recovers that executor's pending runs. Then every run must have completed
with the right answer, no tool call that completed may have run twice,
and no history may be stored twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "_harness" / "durable_worker.py"
ANSWER = {"text": "sum=14", "history": 8}  # three tool calls: 1 + 4 + 9; 8 messages a turn


def _start(
    mode: str, system_db: str, folder: Path, executor: str, ids: list[str], tool: float
) -> Any:
    command = [
        sys.executable, str(WORKER), mode,
        "--system-db", system_db,
        "--sessions", str(folder / "sessions.db"),
        "--log", str(folder / "log"),
        "--executor", executor,
        "--tool-seconds", str(tool),
        "--ids", *ids,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _lines(folder: Path) -> list[str]:
    path = folder / "log"
    return path.read_text().splitlines() if path.exists() else []


def load(
    system_db: str,
    folder: Path,
    *,
    workers: int = 4,
    runs: int = 100,
    kills: int = 2,
    tool_seconds: float = 0.2,
    seed: int | None = None,
    timeout: float = 300.0,
) -> dict[str, Any]:
    """Run the load; return what happened (``problems`` lists every broken promise)."""
    chooser = random.Random(seed)
    shares = {f"w{index}": [f"load-{index}-{n}" for n in range(index, runs, workers)]
              for index in range(workers)}  # fmt: skip
    started = time.monotonic()
    processes = {
        executor: _start("run", system_db, folder, executor, ids, tool_seconds)
        for executor, ids in shares.items()
    }
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    for executor in chooser.sample(sorted(shares), kills):
        # Wait until this worker's runs are under way (its first tool call), then a moment more.
        prefix = f"load-{executor[1:]}-"
        deadline = time.monotonic() + timeout
        while not any(f"key={prefix}" in line and "tool start" in line for line in _lines(folder)):
            if time.monotonic() > deadline or processes[executor].poll() is not None:
                break
            time.sleep(0.02)
        time.sleep(chooser.uniform(0.0, 3 * tool_seconds))
        victim = processes[executor]
        victim.send_signal(signal.SIGKILL)
        out, _ = victim.communicate()
        # What it finished before dying counts; the restarted worker reports the rest again.
        results += [json.loads(line) for line in out.splitlines()]
        processes[executor] = _start("recover", system_db, folder, executor, shares[executor],
                                     tool_seconds)  # fmt: skip
    for executor, process in processes.items():
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
        if process.returncode != 0:
            errors.append(f"worker {executor} ended with {process.returncode}: {err[-1500:]}")
        results += [json.loads(line) for line in out.splitlines()]
    elapsed = time.monotonic() - started

    by_id = {result["id"]: result for result in results}
    problems = list(errors)
    missing = sorted(set().union(*map(set, shares.values())) - set(by_id))
    if missing:
        problems.append(f"{len(missing)} runs never completed: {missing[:5]}")
    wrong = [result for result in by_id.values() if {k: result[k] for k in ANSWER} != ANSWER]
    if wrong:
        problems.append(
            f"{len(wrong)} runs answered wrongly or stored a history twice: {wrong[:3]}"
        )
    lines = _lines(folder)
    repeated_done = _completed_then_started(lines)
    if repeated_done:
        problems.append(f"completed tool calls ran again: {repeated_done[:5]}")
    starts = Counter(line.split(" pid=")[0] for line in lines if line.startswith("tool start"))
    models = Counter(line.split(" pid=")[0] for line in lines if line.startswith("model"))
    return {
        "workers": workers,
        "runs": runs,
        "kills": kills,
        "completed": len(by_id),
        "tool_calls": len(starts),
        "tool_calls_rerun_in_flight": sum(count - 1 for count in starts.values()),
        "tool_calls_completed_twice": len(repeated_done),
        "model_calls": len(models),
        "model_calls_rerun_in_flight": sum(count - 1 for count in models.values()),
        "histories_duplicated": sum(1 for r in by_id.values() if r["history"] != ANSWER["history"]),
        "seconds": elapsed,
        "problems": problems,
    }


def _call(line: str) -> str:
    """``"RUN n"`` of ``tool start 2 key=RUN:4 pid=...`` or ``tool recorded 2 key=RUN``."""
    words = line.split()
    return f"{words[3].removeprefix('key=').split(':')[0]} {words[2]}"


def _completed_then_started(lines: list[str]) -> list[str]:
    """The tool calls that started again after DBOS had recorded them (the log is in time order).

    A call that had finished but was not recorded yet when its worker died
    runs again by design (its ``tool done`` shows twice): that is the
    in-flight case, which the idempotency key is for.
    """
    recorded: set[str] = set()
    again = []
    for line in lines:
        if line.startswith("tool recorded"):
            recorded.add(_call(line))
        elif line.startswith("tool start") and _call(line) in recorded:
            again.append(_call(line))
    return sorted(again)
