"""raf, the floor and peer frameworks side by side, on the same scenarios, offline.

Runs in the virtualenv ``make bench-peers`` builds (``benchmarks/.peers-venv``),
which holds agent-framework-core, langchain and pydantic-ai-slim next to
raf's own dependencies; none of them is a dependency of raf. Each peer uses
its own fake model (no network) and its natural way to add one instruction
line per component:

- agent-framework: a ``ContextProvider`` whose ``before_run`` calls
  ``context.extend_instructions``; history through ``context.extend_messages``;
  the model is a ``BaseChatClient`` subclass answering at once.
- langchain: an ``AgentMiddleware`` whose ``awrap_model_call`` appends a line
  to the system prompt (``create_agent``, on langgraph); history as input
  messages; the model is ``GenericFakeChatModel``.
- pydantic-ai: a ``@agent.system_prompt`` function per line; history as
  ``message_history``; the model is ``FunctionModel``.

The streamed scenario sends 1,000 one-character text chunks through the same
10 instruction lines, in each framework's own streaming form, and counts what
arrives: agent-framework ``agent.run(..., stream=True)`` over a client that
returns a ``ResponseStream``; langchain ``agent.astream(..., stream_mode="messages")``
over a chat model whose ``_astream`` yields the chunks (and reports each token,
as a real async model does); pydantic-ai ``agent.run_stream`` with
``stream_text(delta=True, debounce_by=None)`` over a ``FunctionModel`` with a
``stream_function``. raf's rows are ``agent.run(..., on_update=...)`` and
``async with agent.stream(...)``, each with two chat
middlewares that wrap ``on_update`` as well; the floor iterates the model's
stream directly. Unit: us per update.

Every (scenario, contender) pair runs in a fresh process.

    benchmarks/.peers-venv/bin/python benchmarks/bench_peers.py [--only run/] [--repeats 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Samples, fmt, per_op, ratio, run_isolated, table, wall  # noqa: E402

PEERS = ("agent-framework", "langchain", "pydantic-ai")

#: scenario -> (unit, providers, injected history size, concurrent runs with 0.3 s model)
SCENARIOS: dict[str, tuple[str, int, int, int]] = {
    "run/0 providers": ("us/run", 0, 0, 0),
    "run/1 provider": ("us/run", 1, 0, 0),
    "run/10 providers": ("us/run", 10, 0, 0),
    "run/50 providers": ("us/run", 50, 0, 0),
    "history/1,000 injected": ("us/run", 0, 1_000, 0),
    "history/10,000 injected": ("us/run", 0, 10_000, 0),
    "history/10,000 injected + 50 providers": ("us/run", 50, 10_000, 0),
    "concurrency/300 runs, 0.3 s model, 10 providers": ("ms total", 10, 0, 300),
    # raf's row is bench_pipeline's scenario of this name (its chat middlewares included).
    "stream/callback, 10 providers, 2 chat mw": ("us/update", 10, 0, 0),
    # The peers stream in one form only (an async iterator), measured again here.
    "stream/iterator, 10 providers, 2 chat mw": ("us/update", 10, 0, 0),
}

#: How many text chunks a streamed run sends.
STREAM_CHUNKS = 1_000

Run = Callable[[], Awaitable[Any]]


def _ops(providers: int, history: int) -> int:
    return 30 if history >= 10_000 else max(40, 400 // (providers + 1))


def _lines(count: int) -> list[str]:
    return [f"Rule {i}: be precise." for i in range(count)]


# agent-framework --------------------------------------------------------------------------


def agent_framework_run(providers: int, history: int, latency: float) -> Run:
    import agent_framework as af

    reply = af.ChatResponse(messages=[af.Message(role="assistant", contents=["ok"])])

    class FakeClient(af.BaseChatClient):  # type: ignore[misc]
        async def _inner_get_response(
            self, *, messages: Any, stream: Any, options: Any, **_: Any
        ) -> Any:
            if latency:
                await anyio.sleep(latency)
            return reply

    class Line(af.ContextProvider):  # type: ignore[misc]
        def __init__(self, index: int, line: str) -> None:
            super().__init__(f"line{index}")
            self.line = line

        async def before_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
            context.extend_instructions(self.source_id, self.line)

    past = [
        af.Message(role="user" if i % 2 == 0 else "assistant", contents=[f"message {i}"])
        for i in range(history)
    ]

    class Inject(af.ContextProvider):  # type: ignore[misc]
        async def before_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
            context.extend_messages(self.source_id, past)

    stack: list[Any] = [Inject("history")] if history else []
    stack += [Line(i, line) for i, line in enumerate(_lines(providers))]
    agent = af.Agent(FakeClient(), context_providers=stack)
    return lambda: agent.run("hi")


# langchain ----------------------------------------------------------------------------------


def langchain_run(providers: int, history: int, latency: float) -> Run:
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage

    class SlowFake(GenericFakeChatModel):  # type: ignore[misc]
        async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
            if latency:
                await anyio.sleep(latency)
            return await super()._agenerate(*args, **kwargs)

    def line_middleware(index: int, line: str) -> Any:
        async def awrap_model_call(self: Any, request: Any, handler: Any) -> Any:
            prompt = request.system_prompt
            return await handler(
                request.override(system_prompt=f"{prompt}\n{line}" if prompt else line)
            )

        # langchain names middleware by class and refuses duplicates: one class per line.
        return type(f"Line{index}", (AgentMiddleware,), {"awrap_model_call": awrap_model_call})()

    model = SlowFake(messages=itertools.repeat(AIMessage("ok")))
    agent = create_agent(
        model, tools=[], middleware=[line_middleware(i, t) for i, t in enumerate(_lines(providers))]
    )
    past = [
        HumanMessage(f"message {i}") if i % 2 == 0 else AIMessage(f"message {i}")
        for i in range(history)
    ]
    return lambda: agent.ainvoke({"messages": [*past, HumanMessage("hi")]})


# pydantic-ai --------------------------------------------------------------------------------


def pydantic_ai_run(providers: int, history: int, latency: float) -> Run:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import FunctionModel

    def reply(messages: Any, info: Any) -> Any:
        return ModelResponse(parts=[TextPart("ok")])

    async def slow_reply(messages: Any, info: Any) -> Any:
        await anyio.sleep(latency)
        return ModelResponse(parts=[TextPart("ok")])

    agent = Agent(FunctionModel(slow_reply if latency else reply))

    def prompt_function(line: str) -> Callable[[], str]:
        def prompt() -> str:
            return line

        return prompt

    for line in _lines(providers):
        agent.system_prompt(prompt_function(line))
    past = [
        ModelRequest(parts=[UserPromptPart(f"message {i}")])
        if i % 2 == 0
        else ModelResponse(parts=[TextPart(f"message {i}")])
        for i in range(history)
    ]
    if past:
        return lambda: agent.run("hi", message_history=past)
    return lambda: agent.run("hi")


# Streamed runs -------------------------------------------------------------------------------


class Counter:
    """The consumer of a streamed run: counts what arrives."""

    def __init__(self) -> None:
        self.seen = 0


def agent_framework_stream(providers: int, counter: Counter) -> Run:
    import agent_framework as af

    class FakeStreamingClient(af.BaseChatClient):  # type: ignore[misc]
        def _inner_get_response(self, *, messages: Any, stream: Any, options: Any, **_: Any) -> Any:
            async def chunks() -> Any:
                for _ in range(STREAM_CHUNKS):
                    yield af.ChatResponseUpdate(
                        role="assistant", contents=[af.Content.from_text("x")]
                    )

            return self._build_response_stream(chunks())

    class Line(af.ContextProvider):  # type: ignore[misc]
        def __init__(self, index: int, line: str) -> None:
            super().__init__(f"line{index}")
            self.line = line

        async def before_run(self, *, agent: Any, session: Any, context: Any, state: Any) -> None:
            context.extend_instructions(self.source_id, self.line)

    stack = [Line(i, line) for i, line in enumerate(_lines(providers))]
    agent = af.Agent(FakeStreamingClient(), context_providers=stack)

    async def run() -> None:
        async for update in agent.run("hi", stream=True):
            if update.text:
                counter.seen += 1

    return run


def langchain_stream(providers: int, counter: Counter) -> Run:
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
    from langchain_core.outputs import ChatGenerationChunk

    class StreamingFake(GenericFakeChatModel):  # type: ignore[misc]
        async def _astream(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> Any:
            for _ in range(STREAM_CHUNKS):
                chunk = ChatGenerationChunk(message=AIMessageChunk(content="x"))
                if run_manager is not None:
                    await run_manager.on_llm_new_token("x", chunk=chunk)
                yield chunk

    def line_middleware(index: int, line: str) -> Any:
        async def awrap_model_call(self: Any, request: Any, handler: Any) -> Any:
            prompt = request.system_prompt
            return await handler(
                request.override(system_prompt=f"{prompt}\n{line}" if prompt else line)
            )

        return type(f"Line{index}", (AgentMiddleware,), {"awrap_model_call": awrap_model_call})()

    model = StreamingFake(messages=itertools.repeat(AIMessage("unused")))
    agent = create_agent(
        model, tools=[], middleware=[line_middleware(i, t) for i, t in enumerate(_lines(providers))]
    )

    async def run() -> None:
        async for message, _ in agent.astream(
            {"messages": [HumanMessage("hi")]}, stream_mode="messages"
        ):
            if isinstance(message, AIMessageChunk) and message.content:
                counter.seen += 1

    return run


def pydantic_ai_stream(providers: int, counter: Counter) -> Run:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    async def chunks(messages: Any, info: Any) -> Any:
        for _ in range(STREAM_CHUNKS):
            yield "x"

    agent = Agent(FunctionModel(stream_function=chunks))

    def prompt_function(line: str) -> Callable[[], str]:
        def prompt() -> str:
            return line

        return prompt

    for line in _lines(providers):
        agent.system_prompt(prompt_function(line))

    async def run() -> None:
        async with agent.run_stream("hi") as result:
            async for _ in result.stream_text(delta=True, debounce_by=None):
                counter.seen += 1

    return run


BUILDERS = {
    "agent-framework": agent_framework_run,
    "langchain": langchain_run,
    "pydantic-ai": pydantic_ai_run,
}
STREAM_BUILDERS = {
    "agent-framework": agent_framework_stream,
    "langchain": langchain_stream,
    "pydantic-ai": pydantic_ai_stream,
}


async def measure(peer: str, name: str, repeats: int) -> Samples:
    _, providers, history, crowd = SCENARIOS[name]
    if name.startswith("stream/"):
        counter = Counter()
        streamed = STREAM_BUILDERS[peer](providers, counter)
        await streamed()
        if counter.seen < STREAM_CHUNKS * 0.9:  # a peer that groups chunks is not comparable
            raise RuntimeError(f"{peer} passed on {counter.seen} of {STREAM_CHUNKS} chunks")
        samples = await per_op(streamed, ops=3, repeats=repeats, warmup=2)
        return [sample / STREAM_CHUNKS for sample in samples]
    if crowd:
        one = BUILDERS[peer](providers, history, 0.3)

        async def everyone() -> None:
            async with anyio.create_task_group() as group:
                for _ in range(crowd):
                    group.start_soon(one)

        return await wall(everyone, repeats=repeats, scale=1e3)
    run = BUILDERS[peer](providers, history, 0.0)
    return await per_op(run, ops=_ops(providers, history), repeats=repeats, warmup=10)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        try:
            samples: Samples | str = anyio.run(measure, args.peer, args.one, args.repeats)
        except ImportError as exc:
            samples = f"not installed ({exc.name})"
        print(json.dumps({args.peer: samples}))
        return
    pipeline = str(HERE / "bench_pipeline.py")
    rows = []
    for name in (n for n in SCENARIOS if n.startswith(args.only)):
        ours = run_isolated(pipeline, name, ["--repeats", str(args.repeats)])
        raf_fig, floor_fig = ours.get("raf", ours.get("error", "?")), ours.get("floor", "-")
        row = [name, SCENARIOS[name][0], fmt(raf_fig), fmt(floor_fig), ratio(raf_fig, floor_fig)]
        for peer in PEERS:
            theirs = run_isolated(__file__, name, ["--peer", peer, "--repeats", str(args.repeats)])
            figure = theirs.get(peer, theirs.get("error", "?"))
            row += [fmt(figure), ratio(figure, floor_fig)]
        rows.append(row)
        print(f"  measured {name}", file=sys.stderr, flush=True)
    headers = ["scenario", "unit", "raf", "floor", "raf/floor"]
    for peer in PEERS:
        headers += [peer, "/floor"]
    print(
        f"Python {sys.version.split()[0]}, asyncio, {os.cpu_count()} cores; "
        f"median (min-max) of {args.repeats} repeats; ratios are to the floor\n"
    )
    print(table(headers, rows))


if __name__ == "__main__":
    main()
