"""One stateless agent process of the multi-process test.

Run as ``python -m tests._harness.redis_worker``.

    python -m tests._harness.redis_worker URL PREFIX SESSION WORKER WORKERS TURNS BACKEND

Opens a RedisSessionStore, says it is ready (``INCR {PREFIX}:ready``), waits
for the start signal (the key ``{PREFIX}:go``), then runs its share of the
``TURNS`` turns (those with ``turn % WORKERS == WORKER``) all at once, each an
``agent.run`` with a ``HistoryProvider`` on the one shared session.
The request of turn T is ``"turn T"``; the echo model answers with the same text.
"""

from __future__ import annotations

import sys
from functools import partial

import anyio
import coredis

from raf import Agent, EchoChatClient, HistoryProvider
from raf._sessions.redis import RedisSessionStore

START_TIMEOUT = 60.0


async def main(
    url: str, prefix: str, session_id: str, worker: int, workers: int, turns: int
) -> None:
    agent = Agent(EchoChatClient(), stack=[HistoryProvider()])
    async with RedisSessionStore(url, prefix=prefix) as store, coredis.Redis.from_url(url) as admin:
        session = await store.get(session_id)
        await admin.incr(f"{prefix}:ready")
        with anyio.fail_after(START_TIMEOUT):
            # The signal comes from another process: polling Redis is the only way to see it.
            while not await admin.exists([f"{prefix}:go"]):  # noqa: ASYNC110
                await anyio.sleep(0.005)
        async with anyio.create_task_group() as group:
            for turn in range(worker, turns, workers):
                group.start_soon(partial(agent.run, f"turn {turn}", session=session))


if __name__ == "__main__":
    url, prefix, session_id, worker, workers, turns, backend = sys.argv[1:]
    anyio.run(main, url, prefix, session_id, int(worker), int(workers), int(turns), backend=backend)
