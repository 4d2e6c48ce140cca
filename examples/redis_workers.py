"""Stateless agent workers behind a queue, one Redis: a conversation moves between them.

    python examples/redis_workers.py demo redis://127.0.0.1:6379/0

starts three worker processes, then plays one conversation of six turns
through a job queue (a Redis list). Each turn goes to whichever worker is
free; every worker reads the conversation's history from Redis before it
answers and appends the turn after, so the answer shows that it saw every
earlier turn, whoever served them. Needs a running Redis server and the
extra ``raf-agents[redis]``.

    python examples/redis_workers.py worker redis://127.0.0.1:6379/0 NAME

runs one worker until it receives a stop job.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import coredis

import raf

QUEUE = "raf-example:jobs"


class CountingModel:
    """A stand-in model that says how much of the conversation it was shown."""

    def __init__(self, worker: str) -> None:
        self.worker = worker

    async def complete(
        self, messages: Sequence[raf.ChatMessage], options: Any
    ) -> raf.AgentResponse:
        asked = messages[-1].content
        text = f"{self.worker} saw {len(messages) - 1} earlier messages, answering {asked!r}"
        return raf.AgentResponse((raf.ChatMessage.assistant(text),))


async def worker(url: str, name: str) -> None:
    """Take jobs from the queue until a stop job: run the agent on the job's session."""
    agent = raf.Agent(CountingModel(name), stack=[raf.HistoryProvider()])
    async with (
        raf.RedisSessionStore(url, prefix="raf-example") as store,
        coredis.Redis.from_url(url, decode_responses=True) as queue,
    ):
        while True:
            popped = await queue.blpop([QUEUE], timeout=0)  # wait for the next job
            assert popped is not None
            job = json.loads(popped[1])
            if job.get("stop"):
                return
            # The worker keeps nothing between jobs: the session is all the state.
            session = await store.get(job["session"])
            answer = await agent.run(job["text"], session=session)
            await queue.rpush(job["reply_to"], [answer.text])


async def demo(url: str) -> None:
    """Three workers, one conversation of six turns."""
    workers = ["worker-a", "worker-b", "worker-c"]
    conversation = f"conversation-{uuid.uuid4().hex[:8]}"
    async with anyio.create_task_group() as group, coredis.Redis.from_url(url) as queue:
        for name in workers:
            command = [sys.executable, __file__, "worker", url, name]
            group.start_soon(lambda command=command: anyio.run_process(command, stdout=None))
        # Start once every worker waits on the queue (for the demo's sake: a real
        # deployment starts sending at once, and the workers that are up serve).
        with anyio.fail_after(60):
            while (await queue.info("clients"))["blocked_clients"] < len(workers):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        for turn in range(1, 7):
            reply_to = f"raf-example:reply:{uuid.uuid4().hex}"
            job = {"session": conversation, "text": f"question {turn}", "reply_to": reply_to}
            await queue.rpush(QUEUE, [json.dumps(job)])
            popped = await queue.blpop([reply_to], timeout=30)
            if popped is None:
                raise SystemExit("no worker answered within 30 s")
            print(f"turn {turn}: {popped[1].decode()}")
        await queue.rpush(QUEUE, [json.dumps({"stop": True})] * len(workers))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "demo":
        anyio.run(demo, sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "worker":
        anyio.run(worker, sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
