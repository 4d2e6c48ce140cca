"""bench_cache's conversation through the peers' best windows, beside raf's set-ups, in one run.

Runs in the virtualenv ``make bench-peers`` builds (``benchmarks/.peers-venv``:
agent-framework-core, langchain, pydantic-ai-slim and pydantic-ai-harness from
PyPI; none is a dependency of raf). The same 120-turn support conversation as
``bench_cache.py`` (a tool call every third turn, whose result is long), the same
script of answers and tool calls, the same instructions and tool, through:

- LangChain ``create_agent`` with ``SummarizationMiddleware`` (trigger at 3,000
  tokens, keep 2,000), on a scripted chat model; the summarizer is a scripted model
  too, and its calls are in the row (a user pays for them as well);
- pydantic-ai with pydantic-ai-harness's ``SlidingWindowCompaction(max_messages=60,
  keep_messages=40)``, on a ``FunctionModel``;
- Microsoft Agent Framework with ``CompactionProvider`` running
  ``TruncationStrategy(max_n=60, compact_to=40)`` after each run on the stored
  history of an ``InMemoryHistoryProvider(skip_excluded=True)``.

Every call a peer makes is turned into raf's messages and serialized exactly as
``bench_cache.py`` serializes raf's (the OpenAI chat completions body of raf's
client: its tools, then its messages), so the rows differ only in what each
framework sends. A peer package or class that is missing is said so, not faked.

Targets (issue 31): every raf set-up that bounds the context reuses at least 80 %
and bills no more than the best peer set-up of the same run.

    benchmarks/.peers-venv/bin/python benchmarks/bench_cache_peers.py [--turns 120]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_cache  # noqa: E402
from bench_cache import Result, cached_prefixes, question  # noqa: E402

from raf import ChatMessage, ChatOptions, OpenAIChatClient, ToolCall  # noqa: E402

INSTRUCTIONS = "You are the support agent of ACME. Be precise and kind. " * 4
#: What the scripted summarizers answer (the peers' summaries replace the old messages).
SUMMARY = "Summary of the conversation so far: the customer asked about orders. " * 4
RAF_ROWS = ("whole history", *bench_cache.BOUNDED)


def order_status(order: str) -> str:
    """The order's status, its items and its shipping history (bench_cache's tool)."""
    return str(bench_cache.lookup_order.fn(order))


def answer_text(turn: int) -> str:
    return f"Answer {turn}: here is what I found about your question. " * 3


class Recorder:
    """The serialized body of every call, as raf's OpenAI chat completions client would
    send those messages, and the script's state (the turn, its first call)."""

    def __init__(self) -> None:
        self.turn = 0
        self.bodies: list[str] = []
        self.summaries = 0  # calls of a summarizer, among the bodies
        self.summary_at: set[int] = set()  # their places among the bodies
        self._started = -1
        self._wire = OpenAIChatClient("gpt-4o", api_key="sk-bench", base_url="http://127.0.0.1:9")
        self._options = ChatOptions(tools=(bench_cache.lookup_order,))

    def call(self, messages: Sequence[ChatMessage]) -> ToolCall | None:
        """Record one model call; the tool call the script makes, or None for an answer."""
        _, body, _ = self._wire.request_body(list(messages), self._options)
        self.bodies.append(bench_cache._serialized(body))
        first = self._started != self.turn
        self._started = self.turn
        if self.turn % 3 == 2 and first:
            return ToolCall(f"call-{self.turn}", "lookup_order", json.dumps({"order": "1234"}))
        return None

    def summarize(self, messages: Sequence[ChatMessage]) -> str:
        """Record a summarizer's call: it is billed as well, in the same units."""
        _, body, _ = self._wire.request_body(list(messages), ChatOptions())
        self.summary_at.add(len(self.bodies))
        self.bodies.append(bench_cache._serialized(body))
        self.summaries += 1
        return SUMMARY

    def result(self, name: str, *, summaries: bool = True) -> Result:
        """The row of every call (``summaries=False``: of the agent's own calls only)."""
        shared = cached_prefixes(self.bodies)
        kept = [n for n in range(len(self.bodies)) if summaries or n not in self.summary_at]
        return Result(
            name,
            len(kept),
            sum(len(self.bodies[n]) for n in kept),
            sum(shared[n] for n in kept),
        )

    async def aclose(self) -> None:
        await self._wire.aclose()


Turn = Callable[[str], Awaitable[None]]


# LangChain --------------------------------------------------------------------------------


def langchain(recorder: Recorder) -> Turn:
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool as lc_tool
    from langgraph.checkpoint.memory import InMemorySaver

    def to_raf(messages: Sequence[BaseMessage]) -> list[ChatMessage]:
        out: list[ChatMessage] = []
        for m in messages:
            text = m.content if isinstance(m.content, str) else json.dumps(m.content)
            if m.type == "system":
                out.append(ChatMessage.system(text))
            elif m.type == "human":
                out.append(ChatMessage.user(text))
            elif m.type == "ai":
                calls = [
                    ToolCall(c["id"], c["name"], json.dumps(c["args"]))
                    for c in getattr(m, "tool_calls", ())
                ]
                out.append(ChatMessage.assistant(text or None, tool_calls=calls))
            elif m.type == "tool":
                out.append(ChatMessage.tool(str(getattr(m, "tool_call_id", "")), text))
            else:
                raise ValueError(f"a LangChain message of type {m.type!r}")
        return out

    class Scripted(BaseChatModel):  # type: ignore[misc]
        summarizer: bool = False

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **_: Any) -> Any:
            return self

        def _generate(self, messages: list[BaseMessage], *_: Any, **__: Any) -> ChatResult:
            if self.summarizer:
                message = AIMessage(recorder.summarize(to_raf(messages)))
            else:
                call = recorder.call(to_raf(messages))
                message = (
                    AIMessage(answer_text(recorder.turn))
                    if call is None
                    else AIMessage(
                        "",
                        tool_calls=[
                            {"id": call.id, "name": call.name, "args": json.loads(call.arguments)}
                        ],
                    )
                )
            return ChatResult(generations=[ChatGeneration(message=message)])

    @lc_tool
    def lookup_order(order: str) -> str:
        """The order's status, its items and its shipping history."""
        return order_status(order)

    agent = create_agent(
        Scripted(),
        tools=[lookup_order],
        system_prompt=INSTRUCTIONS,
        middleware=[
            SummarizationMiddleware(
                Scripted(summarizer=True), trigger=("tokens", 3000), keep=("tokens", 2000)
            )
        ],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "support"}}

    async def turn(text: str) -> None:
        await agent.ainvoke({"messages": [{"role": "user", "content": text}]}, config)

    return turn


# pydantic-ai ------------------------------------------------------------------------------


def pydantic_ai(recorder: Recorder) -> Turn:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai_harness.compaction import SlidingWindowCompaction

    def to_raf(messages: Sequence[ModelMessage]) -> list[ChatMessage]:
        out: list[ChatMessage] = []
        for message in messages:
            if isinstance(message, ModelRequest):
                if message.instructions:
                    out.append(ChatMessage.system(message.instructions))
                for part in message.parts:
                    if isinstance(part, SystemPromptPart):
                        out.append(ChatMessage.system(part.content))
                    elif isinstance(part, UserPromptPart):
                        out.append(ChatMessage.user(str(part.content)))
                    elif isinstance(part, ToolReturnPart):
                        out.append(ChatMessage.tool(part.tool_call_id, part.model_response_str()))
                    else:
                        raise ValueError(f"a pydantic-ai request part {type(part).__name__}")
            else:
                texts = [p.content for p in message.parts if isinstance(p, TextPart)]
                calls = [
                    ToolCall(p.tool_call_id, p.tool_name, p.args_as_json_str())
                    for p in message.parts
                    if isinstance(p, ToolCallPart)
                ]
                out.append(ChatMessage.assistant("".join(texts) or None, tool_calls=calls))
        return out

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        call = recorder.call(to_raf(messages))
        if call is None:
            return ModelResponse(parts=[TextPart(answer_text(recorder.turn))])
        return ModelResponse(
            parts=[ToolCallPart(call.name, json.loads(call.arguments), tool_call_id=call.id)]
        )

    agent = Agent(
        FunctionModel(model),
        system_prompt=INSTRUCTIONS,
        capabilities=[SlidingWindowCompaction(max_messages=60, keep_messages=40)],
    )

    @agent.tool_plain
    def lookup_order(order: str) -> str:
        """The order's status, its items and its shipping history."""
        return order_status(order)

    history: list[ModelMessage] = []

    async def turn(text: str) -> None:
        nonlocal history
        result = await agent.run(text, message_history=history)
        history = result.all_messages()

    return turn


# Microsoft Agent Framework ----------------------------------------------------------------


def agent_framework(recorder: Recorder) -> Turn:
    import agent_framework as af
    from agent_framework._compaction import TruncationStrategy

    def to_raf(messages: Sequence[Any]) -> list[ChatMessage]:
        out: list[ChatMessage] = []
        for message in messages:
            role = str(message.role)
            texts = [c.text for c in message.contents if c.type == "text"]
            if role == "system":
                out.append(ChatMessage.system("".join(texts)))
            elif role == "user":
                out.append(ChatMessage.user("".join(texts)))
            elif role == "assistant":
                calls = [
                    ToolCall(c.call_id, c.name, c.arguments if isinstance(c.arguments, str)
                             else json.dumps(c.arguments))
                    for c in message.contents
                    if c.type == "function_call"
                ]  # fmt: skip
                out.append(ChatMessage.assistant("".join(texts) or None, tool_calls=calls))
            elif role == "tool":
                for c in message.contents:
                    if c.type == "function_result":
                        out.append(ChatMessage.tool(c.call_id, str(c.result)))
            else:
                raise ValueError(f"an agent-framework message of role {role!r}")
        return out

    class Scripted(af.FunctionInvocationLayer, af.BaseChatClient):  # type: ignore[misc]
        async def _inner_get_response(
            self, *, messages: Any, stream: Any, options: Any, **_: Any
        ) -> Any:
            # The agent's instructions come in the options: a client sends them first.
            instructions = (options or {}).get("instructions")
            system = [ChatMessage.system(instructions)] if instructions else []
            call = recorder.call([*system, *to_raf(messages)])
            if call is None:
                contents = [af.Content.from_text(answer_text(recorder.turn))]
            else:
                contents = [
                    af.Content.from_function_call(call.id, call.name, arguments=call.arguments)
                ]
            return af.ChatResponse(messages=[af.Message(role="assistant", contents=contents)])

    history = af.InMemoryHistoryProvider(skip_excluded=True)
    compaction = af.CompactionProvider(
        after_strategy=TruncationStrategy(max_n=60, compact_to=40),
        history_source_id=history.source_id,
    )

    @af.tool
    def lookup_order(order: str) -> str:
        """The order's status, its items and its shipping history."""
        return order_status(order)

    agent = af.Agent(
        Scripted(),
        instructions=INSTRUCTIONS,
        tools=[lookup_order],
        context_providers=[history, compaction],
    )
    session = agent.create_session()

    async def turn(text: str) -> None:
        await agent.run(text, session=session)

    return turn


PEERS: dict[str, Callable[[Recorder], Turn]] = {
    "LangChain SummarizationMiddleware(trigger 3000 tokens, keep 2000)": langchain,
    "pydantic-ai-harness SlidingWindowCompaction(max 60, keep 40)": pydantic_ai,
    "MAF CompactionProvider(after: TruncationStrategy(60 -> 40))": agent_framework,
}


async def replay_peer(name: str, turns: int) -> tuple[Result, Result] | str:
    """The peer's row (its summarizer's calls included) and the row of its agent's own
    calls, or why it cannot run."""
    recorder = Recorder()
    try:
        run = PEERS[name](recorder)
    except ImportError as error:
        return f"not installed: {error.name or error} (not on PyPI, or not in .peers-venv)"
    try:
        for number in range(turns):
            recorder.turn = number
            await run(question(number))
    finally:
        await recorder.aclose()
    return recorder.result(name), recorder.result(name, summaries=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=120)
    args = parser.parse_args()

    async def everything() -> tuple[dict[str, Result], dict[str, tuple[Result, Result] | str]]:
        ours = {name: await bench_cache.replay(name, args.turns) for name in RAF_ROWS}
        theirs = {name: await replay_peer(name, args.turns) for name in PEERS}
        return ours, theirs

    ours, theirs = anyio.run(everything)
    whole = ours["whole history"].billed
    rows: list[Result] = [*ours.values()]
    rows += [row[0] for row in theirs.values() if not isinstance(row, str)]
    width = max(len(name) for name in (*ours, *theirs)) + 6
    print(f"prompt cache reuse, {args.turns}-turn support conversation, raf and its peers")
    print(f"{'set-up':<{width}}  {'calls':>5}  {'reuse':>6}  {'billed units':>12}  {'vs whole':>8}")
    for result in rows:
        label = result.name if result.name in theirs else f"raf, {result.name}"
        print(
            f"{label:<{width}}  {result.calls:>5}  {result.reuse:>6.1%}  "
            f"{result.billed / 1000:>10,.0f} k  {result.billed / whole:>7.2f}x"
        )
    for name, row in theirs.items():
        if isinstance(row, str):
            print(f"{name:<{width}}  {row}")
        elif row[1].calls != row[0].calls:
            print(
                f"      ({name}: {row[0].calls - row[1].calls} of its calls are its summarizer's;"
                f" its agent's own calls alone reuse {row[1].reuse:.1%}"
                f" and bill {row[1].billed / 1000:,.0f} k)"
            )
    peers = [row[0] for row in theirs.values() if not isinstance(row, str)]
    best = min(peers, key=lambda r: r.billed) if peers else None
    for name in bench_cache.BOUNDED:
        result = ours[name]
        met = result.reuse >= bench_cache.BOUNDED_REUSE_TARGET
        print(f"{'met   ' if met else 'MISSED'}  raf, {name}: reuse {result.reuse:.1%} >= 80%")
        if best is not None:
            met = result.billed <= best.billed
            print(
                f"{'met   ' if met else 'MISSED'}  raf, {name}: bills {result.billed / 1000:,.0f} k"
                f" <= the best peer's {best.billed / 1000:,.0f} k ({best.name})"
            )


if __name__ == "__main__":
    main()
