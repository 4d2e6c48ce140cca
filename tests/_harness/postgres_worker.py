"""One stateless agent process of the PostgreSQL multi-process test.

Run as ``python -m tests._harness.postgres_worker``.

    python -m tests._harness.postgres_worker DSN PREFIX SESSION WORKER WORKERS TURNS BACKEND FOLDER

Opens a PostgresSessionStore, says it is ready (creates ``FOLDER/ready-WORKER``),
waits for the start signal (the file ``FOLDER/go``), then runs its share of the
``TURNS`` turns (those with ``turn % WORKERS == WORKER``) all at once, each an
``agent.run`` with a ``HistoryProvider`` on the one shared session.
The request of turn T is ``"turn T"``; the echo model answers with the same text.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import anyio

from raf import Agent, EchoChatClient, HistoryProvider
from raf._sessions.postgres import PostgresSessionStore

START_TIMEOUT = 60.0


async def main(
    dsn: str, prefix: str, session_id: str, worker: int, workers: int, turns: int, folder: Path
) -> None:
    agent = Agent(EchoChatClient(), stack=[HistoryProvider()])
    async with PostgresSessionStore(dsn, prefix=prefix) as store:
        session = await store.get(session_id)
        (folder / f"ready-{worker}").touch()
        with anyio.fail_after(START_TIMEOUT):
            # The signal comes from another process: polling the file is the way to see it.
            while not (folder / "go").exists():  # noqa: ASYNC110
                await anyio.sleep(0.005)
        async with anyio.create_task_group() as group:
            for turn in range(worker, turns, workers):
                group.start_soon(partial(agent.run, f"turn {turn}", session=session))


if __name__ == "__main__":
    dsn, prefix, session_id, worker, workers, turns, backend, folder = sys.argv[1:]
    anyio.run(
        main, dsn, prefix, session_id, int(worker), int(workers), int(turns), Path(folder),
        backend=backend,
    )  # fmt: skip
