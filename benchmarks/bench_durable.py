"""Durable runs on DBOS: what they add per step, and a load test with workers killed.

Starts its own PostgreSQL (tests/_harness/postgres_server.py: initdb in a temporary
folder, a free loopback port, as ``nobody`` under root) and stops it.

*Per step*: one turn of three tool calls (seven steps: four model calls,
three tool calls; a scripted model and instant tools, a SQLite session
with history) through the plain agent and through ``dbos_agent`` of it, on
DBOS's SQLite system database and on Postgres; the row gives the turn's
time and what durability adds per step: (durable - plain) / 7. The floor
is a step that does nothing, straight on DBOS: what DBOS itself costs.

*Load*: four worker processes on one Postgres, 100 runs of three tool calls
(0.2 s each), two workers picked at random SIGKILLed at a random moment of
their runs and restarted with the same executor id (tests/_harness/durable_load.py).
Every run must complete with the right answer, no completed tool call may
run again and no history may be stored twice; tool and model calls that
were in flight at a kill run again, and are counted.

    python benchmarks/bench_durable.py [--turns 30] [--runs 100] [--workers 4] [--kills 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dbos import DBOS  # noqa: E402
from harness import fmt, table  # noqa: E402

from raf import Agent, SqliteSessionStore  # noqa: E402
from raf.durable import dbos_agent  # noqa: E402
from tests._harness.durable_load import load  # noqa: E402
from tests._harness.durable_worker import CountingModel, square_tool  # noqa: E402
from tests._harness.postgres_server import PostgresServer  # noqa: E402

STEPS = 7  # four model calls and three tool calls a turn
FLOOR_STEPS = 20


async def _nothing() -> int:
    return 1


@DBOS.workflow(name="raf.bench.bare_steps")
async def _bare_steps(count: int) -> float:
    """The floor: ``count`` steps that do nothing, straight on DBOS; us per step."""
    start = time.perf_counter()
    for _ in range(count):
        await DBOS.run_step_async({"name": "bare"}, _nothing)
    return (time.perf_counter() - start) * 1e6 / count


async def _turns(agent: Any, store: SqliteSessionStore, turns: int, tag: str) -> list[float]:
    """Microseconds per turn, one sample a turn, each turn in a fresh session."""
    samples = []
    for number in range(turns):
        session = await store.get(f"{tag}-{number}")
        start = time.perf_counter()
        response = await agent.run(f"{tag}-{number}", session=session)
        samples.append((time.perf_counter() - start) * 1e6)
        assert response.text == "sum=14", response.text
    return samples


def per_step(system_db: str, folder: Path, turns: int, tag: str) -> tuple[list[float], ...]:
    """Plain and durable turns, and bare DBOS steps, on one system database."""
    log = folder / f"{tag}.log"
    plain = Agent(CountingModel(log, "none"), tools=[square_tool(log, 0.0)], history=True)
    durable = dbos_agent(plain, name=f"bench-{tag}")
    DBOS(config={"name": f"raf-bench-{tag}", "system_database_url": system_db,
                 "log_level": "WARNING"})  # fmt: skip
    DBOS.launch()
    try:

        async def main() -> tuple[list[float], ...]:
            async with SqliteSessionStore(folder / f"{tag}-sessions.db") as store:
                await _turns(plain, store, 3, f"{tag}-warm-plain")
                await _turns(durable, store, 3, f"{tag}-warm-durable")
                return (
                    await _turns(plain, store, turns, f"{tag}-plain"),
                    await _turns(durable, store, turns, f"{tag}-durable"),
                    [await _bare_steps(FLOOR_STEPS) for _ in range(5)],
                )

        return anyio.run(main, backend="asyncio")
    finally:
        DBOS.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raf-bench-durable-") as name, PostgresServer() as pg:
        folder = Path(name)
        rows = []
        for kind, system_db in (
            ("SQLite", f"sqlite:///{folder / 'dbos.sqlite'}"),
            ("Postgres", pg.url("raf_bench_steps")),
        ):
            plain, durable, floor = per_step(system_db, folder, args.turns, kind.lower())
            plain_mid = sorted(plain)[len(plain) // 2]
            durable_mid = sorted(durable)[len(durable) // 2]
            rows.append([
                f"durable/{kind} (turn of {STEPS} steps)",
                fmt(plain),
                fmt(durable),
                f"{(durable_mid - plain_mid) / STEPS:,.0f}",
                fmt(floor),
            ])  # fmt: skip
        print("What a durable run adds per step (us; median (min-max) of a turn)\n")
        headers = ["row", "plain turn", "durable turn", "added per step", "floor: a bare DBOS step"]
        print(table(headers, rows))

        loaded = folder / "load"
        loaded.mkdir()
        result = load(pg.url("raf_bench_load"), loaded, workers=args.workers, runs=args.runs,
                      kills=args.kills)  # fmt: skip
        print(f"\nLoad on Postgres: {args.workers} workers, {args.runs} runs, "
              f"{args.kills} workers SIGKILLed and restarted\n")  # fmt: skip
        keys = [key for key in result if key not in ("problems",)]
        print(
            table(
                ["figure", "value"],
                [
                    [
                        key,
                        f"{result[key]:.1f}"
                        if isinstance(result[key], float)
                        else str(result[key]),
                    ]
                    for key in keys
                ],
            )
        )
        if result["problems"]:
            print("\nPROBLEMS:\n" + "\n".join(result["problems"]))
            sys.exit(1)


if __name__ == "__main__":
    main()
