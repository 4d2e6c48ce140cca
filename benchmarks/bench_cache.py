"""What a provider's prompt cache could serve of each call, through raf's context set-ups.

One 120-turn support conversation (a tool call every third turn, whose result is
long) is replayed through each set-up. Every model call is serialized the same
way, as the OpenAI chat completions body raf's client would send (its tools,
then its messages: the order a prompt cache reads), and each call is compared
with every earlier one: the longest prefix it shares with any of them is what
the cache could serve. "Reuse" is the served part of all the characters sent;
"billed units" are the characters not served plus a tenth of those served (the
price of a cache read for the GPT-5 family and Anthropic). Offline and
deterministic: the model is a script, the windows count tokens approximately.

Targets (issue 31): every set-up that bounds the context reuses at least 80 %;
the volatile (knowledge) set-up bills at most 1.15x the whole history; each is
printed beside its floor, what no placement of the tail can avoid. The
knowledge set-up runs with the bench's short passages (3 x about 210
characters a turn) and with passages of the size ``KnowledgeProvider.folder``
cuts (3 x 1,200), each as raf places its tail (after the history, before the
request) and, for comparison, with the tail at the very end of every call or
after the request and before the tool loop's turns (raf's calls reordered
before they are serialized). The "sliding" rows are the same set-ups with
``step=1`` (a window that moves by a message every turn, raf before stepped
windows) and the knowledge provider in the system message (``volatile=False``,
raf before the tail), for comparison.

    python benchmarks/bench_cache.py [--turns 120] [--json]
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

import anyio
import attrs

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    CompressionProvider,
    HistoryProvider,
    InMemorySession,
    KnowledgeProvider,
    OpenAIChatClient,
    ToolCall,
    Usage,
    tool,
)
from raf._providers.knowledge import DEFAULT_CHUNK_CHARS, Passage
from raf.compression import TokenBudgetStrategy, TruncationStrategy

#: The price of a cached character, as a share of an uncached one.
CACHED_PRICE = 0.1
BOUNDED_REUSE_TARGET = 0.80
VOLATILE_BILL_TARGET = 1.15


@tool
def lookup_order(order: str) -> str:
    """The order's status, its items and its shipping history."""
    lines = [f"Order {order}: status shipped, carrier ACME, 3 parcels."]
    for day in range(1, 25):
        lines.append(f"day {day}: parcel scanned at hub {int(order) * 7 % 13 + day} in transit")
    return "\n".join(lines)


class Guides:
    """A retriever whose passages depend on the question, as a real one's do.

    ``size`` is a passage's length in characters: the bench's short passages
    (about 260), or about the 1,200 that ``KnowledgeProvider.folder`` cuts a
    document into (``DEFAULT_CHUNK_CHARS``), its default ``top_k=3`` of them.
    """

    def __init__(self, size: int = 208) -> None:
        self.repeats = max(1, size // len(_ADVICE))

    async def retrieve(self, query: str, top_k: int) -> Sequence[Passage]:
        # Every question gets passages of its own (a cache cannot have seen them before).
        return [
            Passage(f"On {query!r}, part {n}: " + _ADVICE * self.repeats, f"g:{n}")
            for n in range(top_k)
        ]


_ADVICE = "how to help the customer. "


#: Where a turn's tail goes: where raf puts it (after the history, before the request),
#: at the very end of every call (after the tool loop's turns), or after the request and
#: before the tool loop's turns. The other two are raf's calls reordered before they are
#: serialized, to measure them on the same conversation.
Placement = Literal["raf", "end", "after request"]


class Script:
    """The support agent's model: every third turn asks for the order first; records the
    body of every call as the OpenAI chat completions client would send it."""

    def __init__(self, placement: Placement = "raf") -> None:
        self.turn = 0
        self.placement = placement
        self.bodies: list[str] = []
        self.tail_chars = 0
        #: Per turn with a tool loop: its tail, its calls after the first, its loop turns.
        self.loops: dict[int, tuple[int, int, int]] = {}
        self._run_start = 0
        self._started = -1
        self._wire = OpenAIChatClient("gpt-4o", api_key="sk-bench", base_url="http://127.0.0.1:9")

    async def complete(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        first = self._started != self.turn  # a turn's first call: its tail is new content
        if first:
            self._started, self._run_start = self.turn, len(messages)
        tail = [i for i, m in enumerate(messages) if i and m.role == "system"]
        start, end = (tail[0], tail[-1] + 1) if tail else (0, 0)
        order = list(range(len(messages)))
        if tail and self.placement != "raf":
            head, request = order[:start], order[end : self._run_start]
            loop, volatile = order[self._run_start :], order[start:end]
            order = (
                [*head, *request, *loop, *volatile]
                if self.placement == "end"
                else [*head, *request, *volatile, *loop]
            )
        _, body, _ = self._wire.request_body([messages[i] for i in order], options)
        self.bodies.append(_serialized(body))
        sizes = [0] * len(order)  # each message's serialized size, by its place in raf's call
        for index, message in zip(order, body["messages"], strict=True):
            sizes[index] = len(json.dumps(message, sort_keys=True)) + 1
        tail_size = sum(sizes[start:end])
        if first:
            self.tail_chars += tail_size
        elif tail_size:
            calls = self.loops.get(self.turn, (0, 0, 0))[1] + 1
            self.loops[self.turn] = (tail_size, calls, sum(sizes[self._run_start :]))
        answer: ChatMessage
        if self.turn % 3 == 2 and first:
            call = ToolCall(f"call-{self.turn}", "lookup_order", json.dumps({"order": "1234"}))
            answer = ChatMessage.assistant(tool_calls=[call])
        else:
            answer = ChatMessage.assistant(
                f"Answer {self.turn}: here is what I found about your question. " * 3
            )
        return AgentResponse((answer,), Usage(0, 0))

    @property
    def loop_floor(self) -> int:
        """What a tail costs on top of itself in tool loops, wherever it goes: per run, the
        tail again in each later call (it moves to the end), or the loop's turns once more
        in the next turn (they came after it), whichever is less."""
        return sum(min(calls * tail, loop) for tail, calls, loop in self.loops.values())

    async def aclose(self) -> None:
        await self._wire.aclose()


def _serialized(body: dict[str, Any]) -> str:
    """The call as a prompt cache reads it: the tools, then each message, in order."""
    parts = [json.dumps(body.get("tools", []), sort_keys=True)]
    parts.extend(json.dumps(message, sort_keys=True) for message in body["messages"])
    return "\n".join(parts)


def question(turn: int) -> str:
    topics = ("billing", "shipping", "returns", "warranty", "account")
    return f"Turn {turn}: I have a question about my {topics[turn % len(topics)]}"


@attrs.frozen
class Result:
    name: str
    calls: int
    chars: int
    cached: int
    #: The characters of the turns' tails: new every turn, so no cache can serve them.
    tail: int = 0
    #: What the tails cost on top of that in tool loops, wherever they go (Script.loop_floor).
    loops: int = 0

    @property
    def reuse(self) -> float:
        return self.cached / self.chars if self.chars else 0.0

    @property
    def billed(self) -> float:
        return (self.chars - self.cached) + CACHED_PRICE * self.cached


def cached_prefixes(bodies: Sequence[str]) -> list[int]:
    """For each body, the longest prefix it shares with any earlier one.

    The earlier bodies are kept sorted: the one sharing the longest prefix with a new
    body is next to it in that order.
    """
    seen: list[str] = []
    shared: list[int] = []
    for body in bodies:
        at = bisect.bisect_left(seen, body)
        best = max((_common(body, seen[i]) for i in (at - 1, at) if 0 <= i < len(seen)), default=0)
        shared.append(best)
        seen.insert(at, body)
    return shared


def _common(a: str, b: str) -> int:
    """The length of the common prefix of two strings, by halving (slices compare in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@attrs.frozen
class Setup:
    """A stack of providers, and where the bench puts the tail (see :data:`Placement`)."""

    stack: Callable[[], list[Any]]
    placement: Placement = "raf"


def _knowledge(size: int = 208, **options: Any) -> Callable[[], list[Any]]:
    return lambda: [HistoryProvider(), KnowledgeProvider(Guides(size), **options)]


#: The passages ``KnowledgeProvider.folder`` returns by default: three of about 1,200.
FOLDER_SIZE = DEFAULT_CHUNK_CHARS

SETUPS: dict[str, Setup] = {
    "whole history": Setup(lambda: [HistoryProvider()]),
    "HistoryProvider(max_messages=40)": Setup(lambda: [HistoryProvider(max_messages=40)]),
    "TokenBudgetStrategy(3000)": Setup(
        lambda: [HistoryProvider(inject=False), CompressionProvider(TokenBudgetStrategy(3000))]
    ),
    "TruncationStrategy(40)": Setup(
        lambda: [HistoryProvider(inject=False), CompressionProvider(TruncationStrategy(40))]
    ),
    "whole history + KnowledgeProvider": Setup(_knowledge()),
    # The same tail placed elsewhere (raf's calls reordered), to weigh raf's placement.
    "  the same, its tail at the end of each call": Setup(_knowledge(), "end"),
    "  the same, its tail after the request": Setup(_knowledge(), "after request"),
    # Passages of the size KnowledgeProvider.folder cuts (3 x 1,200 characters a turn).
    "whole history + KnowledgeProvider, folder-size passages": Setup(_knowledge(FOLDER_SIZE)),
    "  folder-size, its tail at the end of each call": Setup(_knowledge(FOLDER_SIZE), "end"),
    "  folder-size, its tail after the request": Setup(_knowledge(FOLDER_SIZE), "after request"),
    # The same, as raf cut and placed them before issue 31 (for comparison).
    "sliding: HistoryProvider(max_messages=40, step=1)": Setup(
        lambda: [HistoryProvider(max_messages=40, step=1)]
    ),
    "sliding: TokenBudgetStrategy(3000, step=1)": Setup(
        lambda: [
            HistoryProvider(inject=False),
            CompressionProvider(TokenBudgetStrategy(3000, step=1)),
        ]
    ),
    "system: KnowledgeProvider(volatile=False)": Setup(_knowledge(volatile=False)),
}
BOUNDED = (
    "HistoryProvider(max_messages=40)",
    "TokenBudgetStrategy(3000)",
    "TruncationStrategy(40)",
)
#: The volatile set-ups the 1.15x target applies to, as raf places their tail.
VOLATILE = (
    "whole history + KnowledgeProvider",
    "whole history + KnowledgeProvider, folder-size passages",
)


async def replay(name: str, turns: int) -> Result:
    setup = SETUPS[name]
    model = Script(setup.placement)
    agent = Agent(
        model,
        name="support",
        instructions="You are the support agent of ACME. Be precise and kind. " * 4,
        tools=[lookup_order],
        stack=setup.stack(),
    )
    session = InMemorySession()
    for turn in range(turns):
        model.turn = turn
        await agent.run(question(turn), session=session)
    await model.aclose()
    shared = cached_prefixes(model.bodies)
    return Result(
        name,
        len(model.bodies),
        sum(map(len, model.bodies)),
        sum(shared),
        model.tail_chars,
        model.loop_floor,
    )


def verdicts(results: dict[str, Result]) -> list[tuple[str, bool]]:
    """Each target, met or not; each volatile set-up's floors (lines in parentheses)."""
    whole = results["whole history"]
    checks = [
        (f"{name}: reuse {results[name].reuse:.1%} >= {BOUNDED_REUSE_TARGET:.0%}",
         results[name].reuse >= BOUNDED_REUSE_TARGET)
        for name in BOUNDED
        if name in results
    ]  # fmt: skip
    for name in VOLATILE:
        if name not in results:
            continue
        result = results[name]
        ratio = result.billed / whole.billed
        checks.append(
            (f"{name}: bills {ratio:.2f}x whole history <= {VOLATILE_BILL_TARGET}x",
             ratio <= VOLATILE_BILL_TARGET)
        )  # fmt: skip
        # What no placement avoids: the passages are new content every turn, and in a
        # tool loop either they move (billed again) or what follows them is billed again.
        passages = (whole.billed + result.tail) / whole.billed
        loops = (whole.billed + result.tail + result.loops) / whole.billed
        checks.append(
            (f"(floor: {passages:.2f}x with its passages billed once a turn, "
             f"{loops:.2f}x with the tool loops' least re-billing)", True)
        )  # fmt: skip
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=120)
    parser.add_argument("--json", action="store_true", help="the figures as JSON")
    args = parser.parse_args()

    async def everything() -> dict[str, Result]:
        return {name: await replay(name, args.turns) for name in SETUPS}

    results = anyio.run(everything)
    if args.json:
        rows = {
            r.name.strip(): {"calls": r.calls, "reuse": r.reuse, "billed": r.billed}
            for r in results.values()
        }
        print(json.dumps(rows, indent=2))
        return
    whole = results["whole history"].billed
    print(f"prompt cache reuse, {args.turns}-turn support conversation (tool call every 3rd turn)")
    width = max(map(len, results))
    print(f"{'set-up':<{width}}  {'calls':>5}  {'reuse':>6}  {'billed units':>12}  {'vs whole':>8}")
    for result in results.values():
        print(
            f"{result.name:<{width}}  {result.calls:>5}  {result.reuse:>6.1%}  "
            f"{result.billed / 1000:>10,.0f} k  {result.billed / whole:>7.2f}x"
        )
    for text, met in verdicts(results):
        print(f"{'      ' if text.startswith('(') else 'met   ' if met else 'MISSED'}  {text}")


if __name__ == "__main__":
    main()
