"""Draw docs/images/ledger.svg: the tokens of a 100-turn run by layer and call, from a ledger.

A support agent (its instructions and a tool, a stepped ``HistoryProvider(max_messages=40)``
and a volatile ``KnowledgeProvider``) answers 100 questions, a tool call every third turn,
with a :class:`raf.observe.ContextLedger` watching. Each call is a bar: its parts stacked in prompt
order, coloured by layer; the part the previous call already sent (what a prompt cache can
serve) is pale, the rest full colour. Plain Python writes the SVG: no plotting library.

    python docs/_ledger_chart.py [OUT.svg]
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
    tool,
)
from raf._providers.knowledge import Passage
from raf.observe import ContextLedger, LedgerEntry

TURNS = 100
COLOURS = {
    "agent": "#4c72b0",
    "HistoryProvider": "#55a868",
    "KnowledgeProvider": "#c44e52",
    "request": "#8172b2",
    "tool loop": "#ccb974",
}
WIDTH, HEIGHT, MARGIN = 960, 360, 48


@tool
def lookup_order(order: str) -> str:
    """The order's status and shipping history."""
    return "\n".join(f"day {day}: parcel {order} scanned at hub {day % 7}" for day in range(30))


class Guides:
    async def retrieve(self, query: str, top_k: int) -> Sequence[Passage]:
        return [
            Passage(f"On {query!r}: " + "check the order first. " * 10, f"g:{n}")
            for n in range(top_k)
        ]


class Model:
    """Every third turn asks for the order, then answers."""

    turn = 0

    async def complete(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        if self.turn % 3 == 2 and messages[-1].role == "user":
            call = ToolCall(f"c{self.turn}", "lookup_order", '{"order": "1234"}')
            return AgentResponse((ChatMessage.assistant(tool_calls=[call]),))
        return AgentResponse((ChatMessage.assistant(f"Answer {self.turn}. " * 12),))


async def record() -> list[LedgerEntry]:
    model, ledger = Model(), ContextLedger()
    agent = Agent(
        model,
        instructions="You are ACME's support agent. Be precise and kind. " * 4,
        tools=[lookup_order],
        stack=[HistoryProvider(max_messages=40), KnowledgeProvider(Guides())],
        observers=[ledger],
    )
    session = InMemorySession()
    for turn in range(TURNS):
        model.turn = turn
        await agent.run(f"Question {turn} about my order", session=session)
    return ledger.calls


def svg(calls: Sequence[LedgerEntry]) -> str:
    top = max(entry.input_tokens for entry in calls)
    plot_w, plot_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN
    bar = plot_w / len(calls)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{MARGIN}" y="20" font-size="13">Tokens of each model call by layer '
        f"(pale: the prefix the previous call sent, which a prompt cache can serve)</text>",
    ]
    for number, entry in enumerate(calls):
        x = MARGIN + number * bar
        below = 0  # tokens stacked so far
        for part in entry.parts:
            cached = max(0, min(part.tokens, entry.shared_prefix_tokens - below))
            colour = COLOURS.get(part.layer, "#999999")
            for tokens, opacity in ((cached, 0.3), (part.tokens - cached, 1.0)):
                if tokens <= 0:
                    continue
                y = MARGIN + plot_h * (1 - (below + tokens) / top)
                h = plot_h * tokens / top
                out.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar - 1, 1):.1f}" '
                    f'height="{h:.1f}" fill="{colour}" fill-opacity="{opacity}"/>'
                )
                below += tokens
    base = MARGIN + plot_h
    out.append(
        f'<line x1="{MARGIN}" y1="{base}" x2="{WIDTH - MARGIN}" y2="{base}" stroke="black"/>'
    )
    out.append(f'<text x="{MARGIN}" y="{base + 16}">call 1</text>')
    out.append(
        f'<text x="{WIDTH - MARGIN}" y="{base + 16}" text-anchor="end">call {len(calls)}</text>'
    )
    out.append(f'<text x="{MARGIN - 4}" y="{MARGIN + 4}" text-anchor="end">{top}</text>')
    for index, (layer, colour) in enumerate(COLOURS.items()):
        x = MARGIN + index * 150
        out.append(f'<rect x="{x}" y="{HEIGHT - 18}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 14}" y="{HEIGHT - 9}">{layer}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> None:
    target = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "images" / "ledger.svg"
    )
    calls = anyio.run(record)
    target.write_text(svg(calls))
    shared = sum(entry.shared_prefix_tokens for entry in calls)
    total = sum(entry.input_tokens for entry in calls)
    print(f"{target}: {len(calls)} calls, {total} tokens, {shared / total:.0%} shared")


if __name__ == "__main__":
    main()
