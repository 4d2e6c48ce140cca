"""Print the ledger report in money of docs/costs.md: four turns of a support agent on gpt-4o-mini.

The model is played in-process (no key, no network) but bills as OpenAI does: its
usage counts the whole prompt, and the part the previous call of the session already
sent (from 1,024 tokens on, in steps of 128) is reported as cached. Prices are
genai-prices' own. ``python docs/_costs_report.py --write`` puts the report in
docs/costs.md, between its ``<!-- costs-report -->`` marks; tests/package checks that
the page holds what this prints.

    python docs/_costs_report.py [--write]
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    HistoryProvider,
    InMemorySession,
    KnowledgeProvider,
    ToolCall,
    Usage,
    tool,
)
from raf._providers.knowledge import Passage
from raf._values.tokens import approximate_prompt_tokens
from raf.observe import ContextLedger

PAGE = Path(__file__).with_name("costs.md")
MARKS = re.compile(r"(<!-- costs-report -->\n```text\n).*?(```\n)", re.DOTALL)


@tool
def lookup_order(order: str) -> str:
    """The order's status and shipping history."""
    return "\n".join(f"day {day}: parcel {order} scanned at hub {day % 7}" for day in range(20))


class Guides:
    """Passages that change with the question: a volatile provider's tail."""

    async def retrieve(self, query: str, top_k: int) -> Sequence[Passage]:
        return [Passage(f"On {query!r}: check the order first. " * 6, f"g:{n}") for n in range(2)]


class Gpt4oMini:
    """Answers like gpt-4o-mini and bills like OpenAI's prefix cache."""

    model = "gpt-4o-mini"

    def __init__(self) -> None:
        self.previous: list[ChatMessage] = []

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        shared = 0
        for old, new in zip(self.previous, messages, strict=False):
            if old != new:
                break
            shared += 1
        self.previous = list(messages)
        prefix = approximate_prompt_tokens(messages[:shared], options.tools) if shared else 0
        cached = prefix // 128 * 128 if prefix >= 1024 else 0
        usage = Usage(
            approximate_prompt_tokens(messages, options.tools), 60, cached_input_tokens=cached
        )
        if messages[-1].role == "user" and "order" in (messages[-1].content or ""):
            call = ToolCall(f"c{len(messages)}", "lookup_order", '{"order": "1234"}')
            return AgentResponse((ChatMessage.assistant(tool_calls=[call]),), usage)
        return AgentResponse((ChatMessage.assistant("Here is what I found. " * 10),), usage)


async def report() -> str:
    ledger = ContextLedger()  # prices: genai-prices' data
    agent = Agent(
        Gpt4oMini(),
        instructions="You are ACME's support agent. Follow the refund policy exactly. " * 64,
        tools=[lookup_order],
        stack=[HistoryProvider(), KnowledgeProvider(Guides())],
        observers=[ledger],
    )
    session = InMemorySession("demo")
    for question in ("Hello", "Where is my order?", "Can I return it?"):
        await agent.run(question, session=session)
    return ledger.report()


def main() -> None:
    text = anyio.run(report)
    if sys.argv[1:] == ["--write"]:
        page = PAGE.read_text(encoding="utf-8")
        new, count = MARKS.subn(lambda m: m.group(1) + text + "\n" + m.group(2), page)
        assert count == 1, "docs/costs.md has no <!-- costs-report --> block"
        PAGE.write_text(new, encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
