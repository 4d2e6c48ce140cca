"""The cached share of the input, over a multi-turn conversation, through AnthropicChatClient.

bench_cache's 120-turn support conversation (a tool call every third turn, whose
result is long) goes through ``raf.AnthropicChatClient`` (the real ``anthropic``
SDK) to a loopback server that speaks the Messages API and applies Anthropic's
documented prompt-caching rules to each request:

- the prompt is read in the cache's order: tools, then the system blocks, then
  each message's content blocks;
- a block marked ``cache_control`` is a breakpoint (at most four, else a 400): the
  prefix up to and including it is written to the cache, when it is at least
  the model's minimum cacheable length (1,024 tokens, Claude Sonnet 4.5);
- at each breakpoint the cache is looked up at that block's boundary and at the
  boundaries up to 20 blocks before it; the longest prefix found is read;
- the reply's usage says it as the API does: ``cache_read_input_tokens`` (read),
  ``cache_creation_input_tokens`` (written: from the end of what was read to the
  last breakpoint written) and ``input_tokens`` (the rest);
- the 5-minute lifetime is ignored (the run takes seconds).

Tokens are counted as a quarter of the characters of each block's JSON. The
cached share is what was read from the cache over all the input; "billed" is
Anthropic's price in units of an input token: 1 for input, 1.25 for a cache write
(5-minute), 0.1 for a read. Each set-up runs with ``cache=True`` (the default:
breakpoints on the last tool, the system prompt, the history's end and the last
message) and ``cache=False`` (no breakpoint: nothing is cached).

    python benchmarks/bench_anthropic_cache.py [--turns 120]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import attrs

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cache import Guides, lookup_order, question  # noqa: E402

from raf import (  # noqa: E402
    Agent,
    AnthropicChatClient,
    HistoryProvider,
    InMemorySession,
    KnowledgeProvider,
)
from tests._harness.anthropic_server import AnthropicServer, error_body  # noqa: E402
from tests._harness.loopback_server import Exchange, Received  # noqa: E402
from tests._harness.responses_server import Answer  # noqa: E402

#: Claude Sonnet 4.5's minimum cacheable prompt, in tokens.
MIN_CACHEABLE = 1024
#: How many block boundaries before a breakpoint the cache is also looked up at.
LOOKBACK = 20
MAX_BREAKPOINTS = 4
#: Anthropic's prices, in units of an uncached input token.
WRITE_PRICE, READ_PRICE = 1.25, 0.1
#: The cached share issue 35 asks to be high, for cache=True over the whole history.
SHARE_TARGET = 0.80


def blocks(body: Mapping[str, Any]) -> Iterator[tuple[str, bool]]:
    """Each block of a request in the cache's order, as text without its mark, and
    whether it is marked ``cache_control``."""

    def unmarked(where: str, block: Mapping[str, Any]) -> tuple[str, bool]:
        rest = {k: v for k, v in block.items() if k != "cache_control"}
        return where + json.dumps(rest, sort_keys=True), "cache_control" in block

    for tool in body.get("tools") or ():
        yield unmarked("tool:", tool)
    system = body.get("system") or ()
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system:
        yield unmarked("system:", block)
    for turn in body["messages"]:
        content = turn["content"]
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            yield unmarked(f"{turn['role']}:", block)


@attrs.define
class PromptCache:
    """Anthropic's prompt cache for one model: the prefixes written, by their hash."""

    entries: set[str] = attrs.field(factory=set)
    #: Every prefix any request sent, at every block boundary: what an ideal cache holds.
    seen: set[str] = attrs.field(factory=set)
    #: Per request: (input, read, written, what an ideal cache would have read).
    reported: list[tuple[int, int, int, int]] = attrs.field(factory=list)

    def usage(self, body: Mapping[str, Any]) -> dict[str, int] | str:
        """The reply's usage for ``body`` (reading and writing the cache), or why the API
        refuses it."""
        hashes: list[str] = []
        ends: list[int] = []  # the tokens of the prompt up to and including each block
        marks: list[int] = []
        running = hashlib.sha256()
        total = 0
        for index, (text, marked) in enumerate(blocks(body)):
            running.update(text.encode())
            hashes.append(running.copy().hexdigest())
            total += max(1, len(text) // 4)
            ends.append(total)
            if marked:
                marks.append(index)
        if len(marks) > MAX_BREAKPOINTS:
            return f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided."
        read = 0
        for mark in marks:
            for at in range(mark, max(-1, mark - LOOKBACK - 1), -1):
                if hashes[at] in self.entries:
                    read = max(read, ends[at])
                    break
        written = [mark for mark in marks if ends[mark] >= MIN_CACHEABLE]
        self.entries.update(hashes[mark] for mark in written)
        creation = max(0, ends[written[-1]] - read) if written else 0
        ideal = max((ends[at] for at, h in enumerate(hashes) if h in self.seen), default=0)
        self.seen.update(hashes)
        self.reported.append((total, read, creation, ideal))
        return {
            "input_tokens": total - read - creation,
            "output_tokens": 20,
            "cache_read_input_tokens": read,
            "cache_creation_input_tokens": creation,
        }


class CachingServer(AnthropicServer):
    """The loopback Messages API server, its replies' usage from :class:`PromptCache`."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = PromptCache()

    def respond(self, exchange: Exchange, request: Received, answer: Answer) -> None:
        usage = self.cache.usage(request.body)
        if isinstance(usage, str):
            exchange.send(400, json.dumps(error_body(usage)).encode(), "application/json")
            return
        super().respond(
            exchange, request, attrs.evolve(answer, body={**answer.body, "usage": usage})
        )


@attrs.frozen
class Row:
    name: str
    calls: int
    input: int  # every input token: read, written and neither
    read: int
    written: int
    #: What a cache that had kept every prefix ever sent would have read: the ceiling.
    ideal: int

    @property
    def share(self) -> float:
        return self.read / self.input if self.input else 0.0

    @property
    def ceiling(self) -> float:
        return self.ideal / self.input if self.input else 0.0

    @property
    def billed(self) -> float:
        plain = self.input - self.read - self.written
        return plain + WRITE_PRICE * self.written + READ_PRICE * self.read


SETUPS: dict[str, Callable[[], list[Any]]] = {
    "whole history": lambda: [HistoryProvider()],
    "HistoryProvider(max_messages=40)": lambda: [HistoryProvider(max_messages=40)],
    "whole history + KnowledgeProvider (tail)": lambda: [
        HistoryProvider(),
        KnowledgeProvider(Guides()),
    ],
}


async def replay(name: str, cache: bool, turns: int) -> Row:
    server = CachingServer()
    try:
        async with AnthropicChatClient(
            "claude-sonnet-4-5", base_url=server.root_url, api_key="sk-bench", cache=cache
        ) as model:
            agent = Agent(
                model,
                name="support",
                instructions="You are the support agent of ACME. Be precise and kind. " * 4,
                tools=[lookup_order],
                stack=SETUPS[name](),
            )
            session = InMemorySession()
            for turn in range(turns):
                if turn % 3 == 2:
                    call = (f"call-{turn}", "lookup_order", {"order": "1234"})
                    server.answer(text=None, calls=[call])
                text = f"Answer {turn}: here is what I found about your question. " * 3
                server.answer(text=text.strip())
                await agent.run(question(turn), session=session)
    finally:
        server.close()
    reported = server.cache.reported
    return Row(
        f"{name}, cache={cache}",
        len(reported),
        sum(r[0] for r in reported),
        sum(r[1] for r in reported),
        sum(r[2] for r in reported),
        sum(r[3] for r in reported),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=120)
    args = parser.parse_args()
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"

    async def everything() -> list[Row]:
        return [await replay(name, cache, args.turns) for name in SETUPS for cache in (True, False)]

    rows = anyio.run(everything)
    print(
        f"Anthropic prompt cache, {args.turns}-turn support conversation (tool call every 3rd"
        " turn), through AnthropicChatClient against a server applying Anthropic's cache rules"
    )
    width = max(len(r.name) for r in rows)
    print(
        f"{'set-up':<{width}}  {'calls':>5}  {'input':>9}  {'read':>9}  {'written':>9}"
        f"  {'cached':>6}  {'ceiling':>7}  {'billed':>9}"
    )
    for r in rows:
        print(
            f"{r.name:<{width}}  {r.calls:>5}  {r.input:>9,}  {r.read:>9,}  {r.written:>9,}"
            f"  {r.share:>6.1%}  {r.ceiling:>7.1%}  {r.billed:>9,.0f}"
        )
    for row in rows[::2]:  # cache=True
        met = row.share >= SHARE_TARGET
        print(
            f"{'met   ' if met else 'MISSED'}  {row.name}: cached share {row.share:.1%}"
            f" >= {SHARE_TARGET:.0%} (ceiling {row.ceiling:.1%}: every prefix ever sent kept)"
        )


if __name__ == "__main__":
    main()
