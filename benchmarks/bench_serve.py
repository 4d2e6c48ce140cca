"""A served agent under load, and what serving costs per request and per chunk.

Part 1, load: two uvicorn workers (one process, ``--workers 2``) serving
``tests/_harness/serve_agent.py``'s agent on one redis-server (started here on a free
loopback port, stopped at the end). 200 clients stream a turn each, all at
once, each in its own session; 20 % of them leave after 5 chunks (they
close the connection). Then every session is read back from Redis: every
turn is stored exactly once (a user message and one assistant message),
every left turn as a partial answer, every other as the whole one. The
latency of a whole turn (request to ``[DONE]``) is beside the upstream
model's own (the same streams read straight from the model, 200 at once).

Part 2, cost: one streamed answer of N chunks through ``raf.serve.app``,
called at the ASGI level in this process (no network: only the app's own
work), beside the floor: a bare Starlette ``StreamingResponse`` relaying
the same upstream as the same ``chat.completion.chunk`` events. Per request
(N = 1) and per chunk (the slope between N = 1 and N = 1000).

    python benchmarks/bench_serve.py [--clients 200] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import raf.serve
from benchmarks.harness import table
from raf import Agent, ChatMessage, ChatOptions, Update
from tests._harness.redis_server import RedisServer
from tests._harness.serve_agent import WordModel
from tests._harness.uvicorn_server import ServedAgent

WORDS = 40
DELAY = 0.01  # between two words of the upstream model
LEAVE_AFTER = 5  # chunks


def _prompt() -> str:
    return " ".join(f"x{i}" for i in range(WORDS))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _client(
    client: httpx.AsyncClient, url: str, session: str, leave: bool
) -> tuple[float, bool]:
    body = {
        "model": "word-agent",
        "stream": True,
        "messages": [{"role": "user", "content": _prompt()}],
    }
    started = time.perf_counter()
    chunks = 0
    async with client.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"X-Session-Id": session}
    ) as reply:
        assert reply.status_code == 200, reply.status_code
        async for line in reply.aiter_lines():
            if line == "data: [DONE]":
                return time.perf_counter() - started, True
            if line.startswith("data: "):
                chunks += 1
                if leave and chunks >= LEAVE_AFTER:
                    return time.perf_counter() - started, False  # closes the connection
    raise AssertionError("a stream ended without [DONE]")


async def _model_alone(clients: int) -> list[float]:
    model = WordModel(DELAY)
    times: list[float] = []

    async def one() -> None:
        started = time.perf_counter()
        async for _ in model.stream([ChatMessage.user(_prompt())], ChatOptions()):
            pass
        times.append(time.perf_counter() - started)

    async with anyio.create_task_group() as group:
        for _ in range(clients):
            group.start_soon(one)
    return times


async def _load(url: str, redis_url: str, clients: int) -> list[list[str]]:
    sessions = [uuid.uuid4().hex for _ in range(clients)]
    leaving = set(sessions[: clients // 5])
    results: dict[str, tuple[float, bool]] = {}

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(session: str) -> None:
            results[session] = await _client(client, url, session, session in leaving)

        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(one, session)
    await anyio.sleep(1.0)  # the left turns' post stages finish after the client is gone
    from raf import RedisSessionStore

    full = " ".join([f"seen 1: {_prompt()}"]).split()
    partial = lost = twice = wrong = 0
    async with RedisSessionStore(redis_url) as store:
        for session in sessions:
            stored = await (await store.get(session)).get_messages()
            if not stored:
                lost += 1
                continue
            if len(stored) != 2:
                twice += 1
                continue
            words = (stored[1].content or "").split()
            if session in leaving:
                partial += len(words) < len(full)
            elif words != full:
                wrong += 1
    done = [t for s, (t, ok) in results.items() if ok]
    alone = await _model_alone(clients)

    def p50_p99(times: list[float]) -> str:
        return f"{_pct(times, 0.5) * 1000:.0f} / {_pct(times, 0.99) * 1000:.0f} ms"

    return [
        ["clients (streamed, at once)", str(clients)],
        ["left mid-stream", str(len(leaving))],
        ["turns lost / stored twice / wrong", f"{lost} / {twice} / {wrong}"],
        ["left turns stored as partial", f"{partial} of {len(leaving)}"],
        ["turn latency p50 / p99 (served)", p50_p99(done)],
        ["upstream model alone p50 / p99", p50_p99(alone)],
    ]  # fmt: skip


# Part 2 ----------------------------------------------------------------------------------


def _bare_app(chunks: int) -> Any:
    """The floor: Starlette's StreamingResponse relaying the upstream as chunk events."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    model = _Upstream(chunks)

    async def endpoint(request: Request) -> StreamingResponse:
        body = await request.json()
        messages = [ChatMessage.user(m["content"]) for m in body["messages"]]

        async def events() -> Any:
            cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
            async for update in model.stream(messages, ChatOptions()):
                if update.kind == "text":
                    chunk = {
                        "id": cid, "object": "chat.completion.chunk", "created": created,
                        "model": body["model"],
                        "choices": [{"index": 0, "delta": {"content": update.text},
                                     "finish_reason": None}],
                    }  # fmt: skip
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])])


class _Upstream:
    """An instant upstream of ``chunks`` text updates."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks

    async def complete(self, messages: Any, options: Any) -> Any:
        raise NotImplementedError

    async def stream(self, messages: Any, options: Any) -> Any:
        for _ in range(self.chunks):
            yield Update.of_text("word ")


async def _call(app: Any) -> None:
    body = json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    finished = anyio.Event()

    async def receive() -> Any:
        if pending:
            return pending.pop()
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            finished.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80), "headers": [(b"content-type", b"application/json")],
    }  # fmt: skip
    await app(scope, receive, send)


async def _timed(app: Any, calls: int) -> float:
    """The mean time of one of ``calls`` calls, in microseconds."""
    started = time.perf_counter()
    for _ in range(calls):
        await _call(app)
    return (time.perf_counter() - started) / calls * 1e6


async def _costs(builds: dict[str, Any], repeats: int) -> dict[str, tuple[float, float]]:
    """Per request (N = 1) and per chunk (the slope to N = 1000) of each app, in us.

    The apps take turns within each repeat, so a burst of load on a shared
    machine falls on all of them alike; each figure is a median over repeats.
    """
    apps = {name: (build(1), build(1000)) for name, build in builds.items()}
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in apps}
    for one, many in apps.values():
        await _timed(one, 20)
        await _timed(many, 2)
    for _ in range(repeats):
        for name, (one, many) in apps.items():
            samples[name][0].append(await _timed(one, 300))
            samples[name][1].append(await _timed(many, 10))
    figures = {}
    for name, (ones, manys) in samples.items():
        one = statistics.median(ones)
        figures[name] = (one, (statistics.median(manys) - one) / 999)
    return figures


async def _cost(repeats: int) -> list[list[str]]:
    floor_name, served_name = "bare Starlette relay (floor)", "raf.serve.app"
    figures = await _costs(
        {
            floor_name: _bare_app,
            served_name: lambda n: raf.serve.app(Agent(_Upstream(n), name="m")),
            # Where the time goes, without HTTP: the two forms of a streamed run alone.
            "agent.stream alone (no HTTP)": lambda n: _Direct(_iterated, n),
            "on_update alone": lambda n: _Direct(_called, n),
        },
        repeats,
    )
    rows = [[name, f"{one:.0f} us", f"{chunk:.1f} us"] for name, (one, chunk) in figures.items()]
    floor, served = figures[floor_name], figures[served_name]
    ratio = ["ratio (raf.serve.app / floor)"]
    ratio += [f"{served[0] / floor[0]:.2f}x", f"{served[1] / floor[1]:.2f}x"]
    rows.insert(2, ratio)
    return rows


class _Direct:
    """A run of the agent alone, called as ``_call`` calls an app (the arguments unused)."""

    def __init__(self, form: Any, chunks: int) -> None:
        self.agent = Agent(_Upstream(chunks), name="m")
        self.form = form

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.form(self.agent)


async def _iterated(agent: Agent) -> None:
    async with agent.stream("hi") as stream:
        async for _ in stream:
            pass


async def _called(agent: Agent) -> None:
    async def on_update(update: Update) -> None:
        pass

    await agent.run("hi", on_update=on_update)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print("raf.serve: per request and per chunk of a streamed answer (ASGI level, asyncio)")
    print(table(["app", "per request (1 chunk)", "per chunk"], anyio.run(_cost, args.repeats)))
    print()
    print(
        f"raf.serve under load: 2 uvicorn workers, one Redis; {WORDS} words, "
        f"{DELAY * 1000:.0f} ms apart, from the upstream model"
    )
    with RedisServer() as redis, ServedAgent(workers=2, db=redis.url, delay=DELAY) as server:
        rows = anyio.run(_load, server.url, redis.url, args.clients)
    print(table(["", ""], rows))


if __name__ == "__main__":
    main()
