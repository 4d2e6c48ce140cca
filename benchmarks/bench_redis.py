"""RedisSessionStore against coredis by hand (the floor), and turns per second across processes.

Starts its own redis-server on a free loopback port (no persistence) and
stops it at the end; each scenario runs in a fresh interpreter.

The *floor* of a store operation is the same work written directly on
coredis, as any application would: ``RPUSH`` of the JSON-encoded messages
for an append (with a ttl: ``RPUSH`` and two ``EXPIRE`` in one MULTI/EXEC),
``LRANGE`` and ``ChatMessage.from_dict`` for a load, with none of the
store's checks (item types, key types, error mapping).

The throughput rows run 1, 2 and 4 worker processes on one Redis, each an
``Agent`` with ``HistoryProvider`` serving conversations of its own
(25 turns each): turns per second of all workers together, from a common
start to the last worker's end. Two kinds of worker: an instant echo model
and 8 conversations at once (the worker's CPU is the limit), and an echo
model that takes 20 ms and 4 conversations at once (a worker that takes a
bounded number of jobs from a queue, waiting on its model: the number of
workers is the limit, as in a real deployment).

    python benchmarks/bench_redis.py
    python benchmarks/bench_redis.py --only redis/ --repeats 9 --backend trio
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import coredis  # noqa: E402
from harness import Samples, fmt, median, per_op, ratio, run_isolated, table  # noqa: E402

from raf import Agent, ChatMessage, EchoChatClient, HistoryProvider  # noqa: E402
from raf._sessions.redis import RedisSessionStore  # noqa: E402
from tests._harness.redis_server import RedisServer  # noqa: E402

Figures = dict[str, Samples | str]
Scenario = Callable[[argparse.Namespace], Awaitable[Figures]]

TURN = (ChatMessage.user("a question"), ChatMessage.assistant("an answer"))
TURNS_PER_CONVERSATION = 25
WORKER_COUNTS = (1, 2, 4)


def history(size: int) -> list[ChatMessage]:
    """``size`` messages, alternating questions and answers of a realistic length."""
    return [
        ChatMessage.user(f"question {i}: " + "words " * 20)
        if i % 2 == 0
        else ChatMessage.assistant(f"answer {i}: " + "more words " * 40)
        for i in range(size)
    ]


async def interleaved(
    raf_op: Callable[[], Awaitable[Any]],
    floor_op: Callable[[], Awaitable[Any]],
    *,
    ops: int,
    repeats: int,
    warmup: int,
) -> Figures:
    """Samples of both contenders, taken in turns: a drift in the machine's load hits both."""
    raf_samples: Samples = []
    floor_samples: Samples = []
    for repeat in range(repeats):
        first = warmup if repeat == 0 else 0
        raf_samples += await per_op(raf_op, ops=ops, repeats=1, warmup=first)
        floor_samples += await per_op(floor_op, ops=ops, repeats=1, warmup=first)
    return {"raf": raf_samples, "floor": floor_samples}


def _encode(message: ChatMessage) -> str:
    return json.dumps(message.to_dict(), ensure_ascii=False, separators=(",", ":"))


def append_scenario(ttl: int | None) -> Scenario:
    """One append of a turn (two messages) to one session, with or without a ttl."""

    async def scenario(args: argparse.Namespace) -> Figures:
        async with (
            RedisSessionStore(args.url, prefix=f"bench-append-{ttl}", ttl=ttl) as store,
            coredis.Redis.from_url(args.url) as client,
        ):
            session = await store.get("s")
            key = f"floor-append-{ttl}"

            async def raf_append() -> None:
                await session.add_messages(TURN)

            async def floor_append() -> None:
                await client.rpush(key, [_encode(m) for m in TURN])

            async def floor_append_ttl() -> None:
                # By hand: the append and both expiries in one transaction.
                async with client.pipeline(transaction=True) as pipe:
                    pipe.rpush(key, [_encode(m) for m in TURN])
                    pipe.expire(key, ttl or 0)
                    pipe.expire(f"{key}-requests", ttl or 0)

            floor = floor_append if ttl is None else floor_append_ttl
            # Short samples, many of them, alternating: on a shared machine the load moves
            # within seconds, and a long sample of one contender catches a different load.
            return await interleaved(
                raf_append, floor, ops=50, repeats=10 * args.repeats, warmup=100
            )

    return scenario


async def load_history(args: argparse.Namespace) -> Figures:
    """Loading a 1,000-message history (an open store, nothing cached)."""
    past = history(1_000)
    async with (
        RedisSessionStore(args.url, prefix="bench-load") as store,
        coredis.Redis.from_url(args.url) as client,
    ):
        session = await store.get("s")
        await client.delete([session.keys[0], "floor-load"])
        await session.add_messages(past)
        await client.rpush("floor-load", [_encode(m) for m in past])

        async def raf_load() -> None:
            # Nothing cached: the store keeps what it read (a warm read is one short round
            # trip, see bench_scale.py); this row is the read of the whole list.
            store._cache.clear()
            assert len(await session.get_messages()) == 1_000

        async def floor_load() -> None:
            entries = await client.lrange("floor-load", 0, -1)
            loaded = [ChatMessage.from_dict(json.loads(entry)) for entry in entries]
            assert len(loaded) == 1_000

        return await interleaved(raf_load, floor_load, ops=5, repeats=6 * args.repeats, warmup=5)


class SlowEcho(EchoChatClient):
    """The echo model, answering after ``latency`` seconds."""

    def __init__(self, latency: float) -> None:
        super().__init__()
        self.latency = latency

    async def complete(self, messages: Sequence[ChatMessage], options: Any) -> Any:
        await anyio.sleep(self.latency)
        return await super().complete(messages, options)


def throughput_scenario(workers: int, latency: float, conversations: int) -> Scenario:
    """Turns per second of ``workers`` processes on one Redis (one sample per repeat)."""

    async def scenario(args: argparse.Namespace) -> Figures:
        samples: Samples = []
        for repeat in range(args.repeats):
            prefix = f"bench-tp-{workers}-{latency}-{repeat}"
            samples.append(await _throughput_once(args, workers, latency, conversations, prefix))
        return {"raf": samples, "floor": "-"}

    return scenario


async def _throughput_once(
    args: argparse.Namespace, workers: int, latency: float, conversations: int, prefix: str
) -> float:
    ends: list[float] = []
    starts: list[float] = []

    async def run_worker(index: int) -> None:
        command = [sys.executable, __file__, "--backend", args.backend, "--worker", args.url]
        command += [prefix, str(index), str(latency), str(conversations)]
        result = await anyio.run_process(command)
        times = json.loads(result.stdout.decode().strip().splitlines()[-1])
        starts.append(times["start"])
        ends.append(times["end"])

    async with coredis.Redis.from_url(args.url) as client:
        with anyio.fail_after(300):
            async with anyio.create_task_group() as group:
                for index in range(workers):
                    group.start_soon(run_worker, index)
                # A common start, once every worker is up and connected.
                while int(await client.get(f"{prefix}:ready") or 0) < workers:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
                await client.set(f"{prefix}:go", repr(time.time()))
    total = workers * conversations * TURNS_PER_CONVERSATION
    return total / (max(ends) - min(starts))


async def worker(
    url: str, prefix: str, index: int, latency: float, conversations: int
) -> dict[str, float]:
    """One worker process: wait for the start, serve its conversations, say when it ended."""
    model = SlowEcho(latency) if latency else EchoChatClient()
    agent = Agent(model, stack=[HistoryProvider()])
    async with (
        RedisSessionStore(url, prefix=prefix) as store,
        coredis.Redis.from_url(url) as client,
    ):
        await client.incr(f"{prefix}:ready")
        while (go := await client.get(f"{prefix}:go")) is None:  # noqa: ASYNC110
            await anyio.sleep(0.002)

        async def conversation(number: int) -> None:
            session = await store.get(f"w{index}-c{number}")
            for turn in range(TURNS_PER_CONVERSATION):
                await agent.run(f"turn {turn}", session=session)

        async with anyio.create_task_group() as group:
            for number in range(conversations):
                group.start_soon(partial(conversation, number))
        return {"start": float(go), "end": time.time()}


def _workers(n: int) -> str:
    return f"{n} worker{'s' if n > 1 else ''}"


#: name -> (unit, scenario). The names are what ``--only`` matches.
SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "redis/append a turn (2 messages)": ("us/call", append_scenario(None)),
    "redis/append a turn, ttl set": ("us/call", append_scenario(3600)),
    "redis/load 1,000 messages": ("us/call", load_history),
    **{
        f"redis/throughput, instant model, {_workers(n)}": ("turns/s", throughput_scenario(n, 0, 8))
        for n in WORKER_COUNTS
    },
    **{
        f"redis/throughput, 20 ms model, {_workers(n)}": (
            "turns/s",
            throughput_scenario(n, 0.02, 4),
        )
        for n in WORKER_COUNTS
    },
}


def _median(value: Samples | str) -> float | None:
    return None if isinstance(value, str) else median(value)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default="", help="run the scenarios whose name starts so")
    parser.add_argument("--repeats", type=int, default=7, help="samples per figure")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        url, prefix, index, latency, conversations = args.worker
        result = anyio.run(
            worker,
            url,
            prefix,
            int(index),
            float(latency),
            int(conversations),
            backend=args.backend,
        )
        print(json.dumps(result))
        return
    if args.one:
        _, scenario = SCENARIOS[args.one]
        print(json.dumps(anyio.run(scenario, args, backend=args.backend)))
        return
    chosen = [name for name in SCENARIOS if name.startswith(args.only)]
    rows, results = [], {}
    with RedisServer() as server:
        extra = ["--repeats", str(args.repeats), "--backend", args.backend, "--url", server.url]
        version = server.command("INFO", "server").split(b"redis_version:")[1].split(b"\r")[0]
        for name in chosen:
            result = results[name] = run_isolated(__file__, name, extra)
            raf_fig, floor_fig = (
                result.get("raf", result.get("error", "?")),
                result.get("floor", "-"),
            )
            unit = SCENARIOS[name][0]
            rows.append([name, unit, fmt(raf_fig), fmt(floor_fig), ratio(raf_fig, floor_fig)])
            print(f"  measured {name}", file=sys.stderr, flush=True)
    print(
        f"raf on Python {sys.version.split()[0]}, {args.backend}, redis-server "
        f"{version.decode()} on loopback, {os.cpu_count()} cores; "
        f"median (min-max) of {args.repeats} repeats\n"
    )
    print(table(["scenario", "unit", "raf", "floor", "raf/floor"], rows))
    print()
    print(table(["target", "raf", "target", "verdict"], _targets(results)))


def _targets(results: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for name in (
        "redis/append a turn (2 messages)",
        "redis/append a turn, ttl set",
        "redis/load 1,000 messages",
    ):
        result = results.get(name, {})
        raf_fig, floor_fig = _median(result.get("raf", "-")), _median(result.get("floor", "-"))
        if raf_fig is None or floor_fig is None:
            rows.append([name, "n/a", "<= 1.3 x", "not measured"])
            continue
        factor = raf_fig / floor_fig
        rows.append([name, f"{factor:.2f} x", "<= 1.3 x", "met" if factor <= 1.3 else "MISSED"])
    for model in ("instant model", "20 ms model"):
        one = _median(results.get(f"redis/throughput, {model}, 1 worker", {}).get("raf", "-"))
        four = _median(results.get(f"redis/throughput, {model}, 4 workers", {}).get("raf", "-"))
        if one is not None and four is not None:
            verdict = "scales" if four > 1.5 * one else "does not scale"
            rows.append(
                [f"throughput, {model}, 4 workers / 1", f"{four / one:.2f} x", "-", verdict]
            )
    return rows


if __name__ == "__main__":
    main()
