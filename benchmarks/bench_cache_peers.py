"""The frontier: billed units against the context each set-up keeps, raf's and its peers'.

Runs in the virtualenv ``make bench-peers`` builds (``benchmarks/.peers-venv``:
agent-framework-core, langchain, pydantic-ai-slim, pydantic-ai-harness and
openai-agents from PyPI; none is a dependency of raf). Two conversations, each in one
run: ``bench_cache.py``'s 120-turn support conversation (a tool call every third turn,
whose result is about 1,300 characters), and the same with large tool results (3,000 to
12,000 characters each). The same script of answers and tool calls, the same
instructions and tool, through raf's set-ups and the peers':

- LangChain ``create_agent`` with ``SummarizationMiddleware`` (trigger at 3,000 tokens,
  keep 2,000; its scripted summarizer's calls are in the row), and with
  ``ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=3000, keep=3)])``, with and
  without ``clear_at_least=2000``;
- pydantic-ai with pydantic-ai-harness's ``SlidingWindowCompaction`` (60 -> 40 messages;
  3,000 -> 2,000 tokens), ``ClearToolResults(keep_pairs=3)`` (with and without
  ``min_clear_tokens=2000``) and ``ToolOutputLimits()`` (its default bands, spilling to a
  temporary folder);
- Microsoft Agent Framework's ``CompactionProvider`` running, after each run,
  ``TruncationStrategy`` (60 -> 40 messages; 3,000 -> 2,000 tokens by its
  ``CharacterEstimatorTokenizer``) or ``SelectiveToolCallCompactionStrategy(1)``;
- OpenAI Agents' ``ToolOutputTrimmer()`` (``agents.extensions``, a
  ``call_model_input_filter``; its defaults: the last 2 turns whole, older outputs over 500
  characters cut to a 200-character preview).

Every call a peer makes is turned into raf's messages and serialized exactly as
``bench_cache.py`` serializes raf's, so the rows differ only in what each framework
sends. For each set-up: billed units (characters not served from the cache + a tenth of
those served), reuse, the context kept (mean characters a call), billed units per kept
character, and prefix breaks (agent calls that do not begin with the agent's previous
call). A peer package or class that is missing is said so, not faked. raf's rows include
``ToolOutputLimit`` (``Agent(tool_stack=[...])``) alone and with ``ClearToolResults``, the
match for the harness's ``ToolOutputLimits()``; raf's calls carry the tools raf offers
(``read_tool_result`` once a cut result is in view), the peers' the bench's one tool.

Targets (issue 42): for every peer set-up, a raf set-up of comparable context (0.8x to
1.25x its mean characters a call) bills no more per kept character; raf's defaults lie on
the frontier (no set-up keeps as much context for fewer units).

    benchmarks/.peers-venv/bin/python benchmarks/bench_cache_peers.py [--turns 120]
        [--json FIGURES.json]   (then: python docs/_frontier_chart.py FIGURES.json)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_cache  # noqa: E402
from bench_cache import Result, cached_prefixes, question  # noqa: E402

from raf import (  # noqa: E402
    Agent,
    ChatMessage,
    ChatOptions,
    ClearToolResults,
    CompressionProvider,
    HistoryProvider,
    InMemorySession,
    OpenAIChatClient,
    ToolCall,
    ToolOutputLimit,
    tool,
)
from raf.compression import TokenBudgetStrategy, TruncationStrategy  # noqa: E402

INSTRUCTIONS = "You are the support agent of ACME. Be precise and kind. " * 4
#: What the scripted summarizers answer (the peers' summaries replace the old messages).
SUMMARY = "Summary of the conversation so far: the customer asked about orders. " * 4
RAF_ROWS = ("whole history", *bench_cache.BOUNDED)


#: The second conversation: every tool result is large (3,000 to 12,000 characters).
LARGE = {"on": False, "turn": 0}


def order_status(order: str) -> str:
    """The order's status, its items and its shipping history (bench_cache's tool); in the
    large conversation, a log of 3,000 to 12,000 characters that depends on the turn."""
    if not LARGE["on"]:
        return str(bench_cache.lookup_order.fn(order))
    size = 3000 + (LARGE["turn"] * 7919) % 9001
    line = f"order {order} turn {LARGE['turn']}: parcel scanned at a hub, in transit. "
    return (line * (size // len(line) + 1))[:size]


@tool(name="lookup_order")
def large_lookup(order: str) -> str:
    """The order's status, its items and its shipping history."""
    return order_status(order)


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

    def result(self, name: str, *, summaries: bool = True) -> Row:
        """The row of every call (``summaries=False``: of the agent's own calls only)."""
        return row_of(name, self.bodies, self.summary_at, summaries=summaries)

    async def aclose(self) -> None:
        await self._wire.aclose()


Turn = Callable[[str], Awaitable[None]]


@attrs.frozen
class Row(Result):
    """bench_cache's row, with the prefix breaks (an agent call that does not begin with
    the agent's previous call) and the context kept (mean characters a call)."""

    breaks: int = attrs.field(default=0, kw_only=True)

    @property
    def mean_chars(self) -> float:
        return self.chars / self.calls if self.calls else 0.0

    @property
    def per_kept(self) -> float:
        """Billed units per character of context kept a call."""
        return self.billed / self.mean_chars if self.mean_chars else 0.0


def row_of(
    name: str,
    bodies: Sequence[str],
    summary_at: Collection[int] = frozenset(),
    *,
    summaries: bool = True,
) -> Row:
    shared = cached_prefixes(bodies)
    kept = [n for n in range(len(bodies)) if summaries or n not in summary_at]
    agent = [bodies[n] for n in range(len(bodies)) if n not in summary_at]
    breaks = sum(1 for a, b in itertools.pairwise(agent) if not b.startswith(a))
    return Row(
        name,
        len(kept),
        sum(len(bodies[n]) for n in kept),
        sum(shared[n] for n in kept),
        breaks=breaks,
    )


# LangChain --------------------------------------------------------------------------------


def langchain(recorder: Recorder, setup: str = "summary", clear_at_least: int = 0) -> Turn:
    from langchain.agents import create_agent
    from langchain.agents.middleware import (
        ClearToolUsesEdit,
        ContextEditingMiddleware,
        SummarizationMiddleware,
    )
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
            if setup == "summary"
            else ContextEditingMiddleware(
                edits=[ClearToolUsesEdit(trigger=3000, keep=3, clear_at_least=clear_at_least)]
            )
        ],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "support"}}

    async def turn(text: str) -> None:
        await agent.ainvoke({"messages": [{"role": "user", "content": text}]}, config)

    return turn


# pydantic-ai ------------------------------------------------------------------------------


def pydantic_ai(recorder: Recorder, make: Callable[[], Any] | None = None) -> Turn:
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
        capabilities=[
            make() if make else SlidingWindowCompaction(max_messages=60, keep_messages=40)
        ],
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


def agent_framework(recorder: Recorder, make: Callable[[], Any] | None = None) -> Turn:
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
        after_strategy=make() if make else TruncationStrategy(max_n=60, compact_to=40),
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


# OpenAI Agents -----------------------------------------------------------------------------


def openai_agents(recorder: Recorder) -> Turn:
    from agents import Agent as OAAgent
    from agents import Model, ModelResponse, RunConfig, Runner, Usage, function_tool
    from agents.extensions import ToolOutputTrimmer
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    def to_raf(system: str | None, items: Sequence[Any]) -> list[ChatMessage]:
        out = [ChatMessage.system(system)] if system else []
        for item in items:
            data = item if isinstance(item, dict) else item.model_dump(exclude_unset=True)
            kind = data.get("type", "message")
            if kind == "function_call":
                call = ToolCall(data["call_id"], data["name"], data["arguments"])
                if out and out[-1].role == "assistant" and not out[-1].content:
                    out[-1] = ChatMessage.assistant(tool_calls=[*out[-1].tool_calls, call])
                else:
                    out.append(ChatMessage.assistant(tool_calls=[call]))
            elif kind == "function_call_output":
                output = data["output"]
                out.append(ChatMessage.tool(data["call_id"], output if isinstance(output, str)
                                            else json.dumps(output)))  # fmt: skip
            elif kind == "message":
                content = data["content"]
                text = content if isinstance(content, str) else "".join(
                    part.get("text", "") for part in content
                )  # fmt: skip
                user = data["role"] == "user"
                out.append(ChatMessage.user(text) if user else ChatMessage.assistant(text))
            else:
                raise ValueError(f"an openai-agents input item of type {kind!r}")
        return out

    class Scripted(Model):  # type: ignore[misc]
        async def get_response(
            self, system_instructions: str | None, input: Any, *_: Any, **__: Any
        ) -> Any:
            items = [{"role": "user", "content": input}] if isinstance(input, str) else input
            call = recorder.call(to_raf(system_instructions, items))
            if call is None:
                text = ResponseOutputText(
                    type="output_text", text=answer_text(recorder.turn), annotations=[]
                )
                output: Any = ResponseOutputMessage(
                    id="m", type="message", role="assistant", status="completed", content=[text]
                )
            else:
                output = ResponseFunctionToolCall(
                    type="function_call", call_id=call.id, name=call.name,
                    arguments=call.arguments,
                )  # fmt: skip
            return ModelResponse(output=[output], usage=Usage(), response_id=None)

        def stream_response(self, *_: Any, **__: Any) -> Any:
            raise NotImplementedError("the bench does not stream")

    @function_tool
    def lookup_order(order: str) -> str:
        """The order's status, its items and its shipping history."""
        return order_status(order)

    agent = OAAgent("support", instructions=INSTRUCTIONS, tools=[lookup_order], model=Scripted())
    config = RunConfig(call_model_input_filter=ToolOutputTrimmer(), tracing_disabled=True)
    history: list[Any] = []

    async def turn(text: str) -> None:
        nonlocal history
        result = await Runner.run(
            agent, [*history, {"role": "user", "content": text}], run_config=config
        )
        history = result.to_input_list()

    return turn


def _harness(name: str, **options: Any) -> Callable[[], Any]:
    def make() -> Any:
        if name == "ToolOutputLimits":
            import tempfile

            from pydantic_ai_harness.tool_output_limits import LocalFileStore, ToolOutputLimits

            # Its spills on this machine (a temporary folder), as the harness suggests.
            return ToolOutputLimits(store=LocalFileStore(Path(tempfile.mkdtemp())), **options)
        from pydantic_ai_harness import compaction

        return getattr(compaction, name)(**options)

    return make


def _maf(name: str, **options: Any) -> Callable[[], Any]:
    def make() -> Any:
        from agent_framework import _compaction

        if options.pop("tokens", False):
            options["tokenizer"] = _compaction.CharacterEstimatorTokenizer()
        return getattr(_compaction, name)(**options)

    return make


PEERS: dict[str, Callable[[Recorder], Turn]] = {
    "LangChain SummarizationMiddleware(trigger 3000 tokens, keep 2000)": langchain,
    "LangChain ClearToolUsesEdit(trigger 3000, keep 3)": functools.partial(
        langchain, setup="clear"
    ),
    "LangChain ClearToolUsesEdit(trigger 3000, keep 3, clear_at_least 2000)": functools.partial(
        langchain, setup="clear", clear_at_least=2000
    ),
    "pydantic-ai-harness SlidingWindowCompaction(max 60, keep 40)": pydantic_ai,
    "pydantic-ai-harness SlidingWindowCompaction(max 3000 tokens, keep 2000)": functools.partial(
        pydantic_ai,
        make=_harness("SlidingWindowCompaction", max_tokens=3000, keep_tokens=2000),
    ),
    "pydantic-ai-harness ClearToolResults(keep 3)": functools.partial(
        pydantic_ai, make=_harness("ClearToolResults", max_tokens=3000, keep_pairs=3)
    ),
    "pydantic-ai-harness ClearToolResults(keep 3, min_clear_tokens 2000)": functools.partial(
        pydantic_ai,
        make=_harness("ClearToolResults", max_tokens=3000, keep_pairs=3, min_clear_tokens=2000),
    ),
    "pydantic-ai-harness ToolOutputLimits()": functools.partial(
        pydantic_ai, make=_harness("ToolOutputLimits")
    ),
    "MAF CompactionProvider(after: TruncationStrategy(60 -> 40))": agent_framework,
    "MAF CompactionProvider(after: TruncationStrategy(3000 -> 2000 tokens))": functools.partial(
        agent_framework, make=_maf("TruncationStrategy", max_n=3000, compact_to=2000, tokens=True)
    ),
    "MAF CompactionProvider(after: SelectiveToolCallCompactionStrategy(1))": functools.partial(
        agent_framework,
        make=_maf("SelectiveToolCallCompactionStrategy", keep_last_tool_call_groups=1),
    ),
    "OpenAI Agents ToolOutputTrimmer()": openai_agents,
}


async def replay_peer(name: str, turns: int) -> tuple[Row, Row] | str:
    """The peer's row (its summarizer's calls included) and the row of its agent's own
    calls, or why it cannot run."""
    recorder = Recorder()
    try:
        run = PEERS[name](recorder)
    except (ImportError, AttributeError) as error:
        return f"not measured: {error} (not in this release, or not in .peers-venv)"
    try:
        for number in range(turns):
            recorder.turn = LARGE["turn"] = number
            await run(question(number))
    except Exception as error:  # a peer's API that differs from this script's: said, not faked
        return f"failed: {type(error).__name__}: {str(error)[:160]}"
    finally:
        await recorder.aclose()
    return recorder.result(name), recorder.result(name, summaries=False)


class Chain:
    """Two strategies, one after the other (ClearToolResults, then a window)."""

    def __init__(self, *strategies: Any) -> None:
        self.strategies = strategies

    async def compress(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
        for strategy in self.strategies:
            messages = await strategy.compress(messages)
        return messages


def _compressed(strategy: Callable[[], Any]) -> Callable[[], list[Any]]:
    return lambda: [HistoryProvider(inject=False), CompressionProvider(strategy())]


#: raf's set-ups on this bench: its defaults (a window steps by four fifths of its bound),
#: raf before (a step of half the bound, and before that of a third), and the shapes nearest
#: each peer's.
RAF: dict[str, Callable[[], list[Any]]] = {
    "whole history": lambda: [HistoryProvider()],
    "HistoryProvider(max_messages=40)": lambda: [HistoryProvider(max_messages=40)],
    "HistoryProvider(max_messages=40, step=20)": lambda: [
        HistoryProvider(max_messages=40, step=20)
    ],
    "HistoryProvider(max_messages=40, step=13)": lambda: [
        HistoryProvider(max_messages=40, step=13)
    ],
    "TruncationStrategy(60)": _compressed(lambda: TruncationStrategy(60)),
    "TokenBudgetStrategy(2000)": _compressed(lambda: TokenBudgetStrategy(2000)),
    "TokenBudgetStrategy(3000)": _compressed(lambda: TokenBudgetStrategy(3000)),
    "TokenBudgetStrategy(3000, step=1500)": _compressed(
        lambda: TokenBudgetStrategy(3000, step=1500)
    ),
    "TokenBudgetStrategy(3000, step=1000)": _compressed(
        lambda: TokenBudgetStrategy(3000, step=1000)
    ),
    "TokenBudgetStrategy(4000)": _compressed(lambda: TokenBudgetStrategy(4000)),
    "TokenBudgetStrategy(6000, step=4000)": _compressed(
        lambda: TokenBudgetStrategy(6000, step=4000)
    ),
    # Steps of 80-90 % of the bound: what matches the peers' token windows on large results.
    "TokenBudgetStrategy(5000, step=4000)": _compressed(
        lambda: TokenBudgetStrategy(5000, step=4000)
    ),
    "TokenBudgetStrategy(5000, step=4500)": _compressed(
        lambda: TokenBudgetStrategy(5000, step=4500)
    ),
    "TokenBudgetStrategy(7000, step=6000)": _compressed(
        lambda: TokenBudgetStrategy(7000, step=6000)
    ),
    "ClearToolResults()": _compressed(ClearToolResults),
    "ClearToolResults(clear_at_least=2000)": _compressed(
        lambda: ClearToolResults(clear_at_least=2000)
    ),
    "ClearToolResults(clear_at_least=0)": _compressed(lambda: ClearToolResults(clear_at_least=0)),
    "ClearToolResults(keep_last=1)": _compressed(lambda: ClearToolResults(1)),
    "ClearToolResults(keep_last=1, clear_at_least=2000)": _compressed(
        lambda: ClearToolResults(1, clear_at_least=2000)
    ),
    "ClearToolResults(keep_last=0, clear_at_least=6000)": _compressed(
        lambda: ClearToolResults(0, clear_at_least=6000)
    ),
    "ClearToolResults(keep_last=1) + TokenBudgetStrategy(6000)": _compressed(
        lambda: Chain(ClearToolResults(1), TokenBudgetStrategy(6000))
    ),
}
#: raf's set-ups with ToolOutputLimit (tool-stack middleware: a result cut once, when it is
#: produced, so every later call sends the same bytes): the limit and the context stack beside
#: it. ``ToolOutputLimit(10000, preview_chars=1000)`` is the harness's ``ToolOutputLimits()``
#: default band (a result over 10,000 characters spilled, a 1,000-character preview kept);
#: the others keep more of each result, or clear old ones too.
LIMITED: dict[str, tuple[Callable[[], ToolOutputLimit], Callable[[], list[Any]]]] = {
    "ToolOutputLimit(10000, preview_chars=1000)": (
        lambda: ToolOutputLimit(10_000, preview_chars=1_000),
        RAF["whole history"],
    ),
    # Without spilling: no read_tool_result joins the tools at the first cut (a prefix break).
    "ToolOutputLimit(10000, preview_chars=1000, spill=False)": (
        lambda: ToolOutputLimit(10_000, preview_chars=1_000, spill=False),
        RAF["whole history"],
    ),
    "ToolOutputLimit(8000)": (lambda: ToolOutputLimit(8_000), RAF["whole history"]),
    "ToolOutputLimit(6000)": (lambda: ToolOutputLimit(6_000), RAF["whole history"]),
    "ToolOutputLimit(6000) + ClearToolResults()": (
        lambda: ToolOutputLimit(6_000),
        _compressed(ClearToolResults),
    ),
    "ToolOutputLimit(4000) + ClearToolResults(keep_last=0, clear_at_least=6000)": (
        lambda: ToolOutputLimit(4_000),
        _compressed(lambda: ClearToolResults(0, clear_at_least=6000)),
    ),
}
RAF.update({name: stack for name, (_, stack) in LIMITED.items()})
#: raf's defaults: what a user gets without choosing a step or a batch.
DEFAULTS = ("HistoryProvider(max_messages=40)", "TokenBudgetStrategy(3000)", "ClearToolResults()")


async def replay_raf(name: str, turns: int) -> Row:
    model = bench_cache.Script()
    agent = Agent(
        model,
        name="support",
        instructions=INSTRUCTIONS,
        tools=[large_lookup if LARGE["on"] else bench_cache.lookup_order],
        stack=RAF[name](),
        tool_stack=[LIMITED[name][0]()] if name in LIMITED else [],
    )
    session = InMemorySession()
    for turn in range(turns):
        model.turn = LARGE["turn"] = turn
        await agent.run(question(turn), session=session)
    await model.aclose()
    return row_of(name, model.bodies)


def frontier(ours: dict[str, Row], theirs: dict[str, Row]) -> list[tuple[str, bool]]:
    """For each peer set-up: raf's best set-up of comparable context (0.8x to 1.25x its mean
    characters a call) bills no more per kept character."""
    verdicts = []
    for name, peer in theirs.items():
        near = [r for r in ours.values() if 0.8 <= r.mean_chars / peer.mean_chars <= 1.25]
        if not near:
            verdicts.append((f"{name}: no raf set-up of comparable context", False))
            continue
        best = min(near, key=lambda r: r.per_kept)
        # A peer that never breaks the prefix is at the floor for its context: raf matches it.
        floor = " (never breaks the prefix: the floor)" if not peer.breaks else ""
        verdicts.append(
            (f"{name}: {peer.per_kept:.2f} per kept char{floor}; raf {best.name}: "
             f"{best.per_kept:.2f} ({best.mean_chars / peer.mean_chars:.2f}x its context, "
             f"{best.breaks} breaks)",
             best.per_kept <= peer.per_kept * 1.0001)
        )  # fmt: skip
    for name in DEFAULTS:
        ours_row = ours[name]
        # Off the frontier: another set-up keeps at least as much context for fewer units.
        dominated = [
            r.name
            for r in [*ours.values(), *theirs.values()]
            if r.mean_chars >= ours_row.mean_chars and r.billed < ours_row.billed
        ]
        verdicts.append(
            (f"raf default {name} on the frontier"
             + (f" (beaten by {', '.join(dominated)})" if dominated else ""), not dominated)
        )  # fmt: skip
    return verdicts


def table(title: str, ours: dict[str, Row], theirs: dict[str, tuple[Row, Row] | str]) -> None:
    whole = ours["whole history"].billed
    rows: list[Row] = [*ours.values()]
    rows += [row[0] for row in theirs.values() if not isinstance(row, str)]
    width = max(len(name) for name in (*ours, *theirs)) + 6
    print(title)
    print(
        f"{'set-up':<{width}}  {'calls':>5}  {'reuse':>6}  {'billed units':>12}  {'vs whole':>8}"
        f"  {'chars/call':>10}  {'per kept':>8}  {'breaks':>6}"
    )
    for result in rows:
        label = result.name if result.name in theirs else f"raf, {result.name}"
        print(
            f"{label:<{width}}  {result.calls:>5}  {result.reuse:>6.1%}  "
            f"{result.billed / 1000:>10,.0f} k  {result.billed / whole:>7.2f}x"
            f"  {result.mean_chars:>10,.0f}  {result.per_kept:>8.1f}  {result.breaks:>6}"
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
    peers = {n: r[0] for n, r in theirs.items() if not isinstance(r, str)}
    for text, met in frontier(ours, peers):
        print(f"{'met   ' if met else 'MISSED'}  {text}")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--json", type=Path, help="also write every row here, for the chart")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    for large, title in (
        (False, f"prompt cache reuse, {args.turns}-turn support conversation, raf and its peers"),
        (True, "the same with large tool results (3,000 to 12,000 characters each)"),
    ):
        LARGE["on"] = large

        async def everything() -> tuple[dict[str, Row], dict[str, tuple[Row, Row] | str]]:
            ours = {name: await replay_raf(name, args.turns) for name in RAF}
            theirs = {name: await replay_peer(name, args.turns) for name in PEERS}
            return ours, theirs

        ours, theirs = anyio.run(everything)
        table(title, ours, theirs)
        figures["large" if large else "support"] = {
            name: {
                "raf": name in ours,
                "billed": row.billed,
                "reuse": row.reuse,
                "mean_chars": row.mean_chars,
                "breaks": row.breaks,
            }
            for name, row in [
                *ours.items(),
                *((n, r[0]) for n, r in theirs.items() if not isinstance(r, str)),
            ]
        }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
