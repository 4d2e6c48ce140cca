"""What a streaming output guardrail costs the reader: the time to the first visible text and to
the whole answer, against no guardrail and against holding the whole answer (MAF's way).

The model is scripted with a realistic cadence: an answer of about 700 characters in chunks of
4 characters (a token), one every 10 ms (100 tokens/s). Two checks: ``pii_redactor`` (local,
microseconds) and a check that takes 30 ms (a moderation endpoint's round trip). Each figure is
the median of ``--repeats`` runs, in milliseconds.

    python benchmarks/bench_guardrails.py
    python benchmarks/bench_guardrails.py --repeats 5 --backend trio
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("RAF_SOURCE", str(ROOT)))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import run_async, table  # noqa: E402

from raf import (  # noqa: E402
    Agent,
    AgentResponse,
    ChatOptions,
    ChatRequest,
    GuardrailContext,
    OutputGuardrail,
    Update,
    Verdict,
    pii_redactor,
)

SENTENCES = [
    "Thanks for reaching out about your order.",
    "I looked at the account and the last payment went through on Monday.",
    "The refund was sent to the card ending in 1111 and should arrive within five days.",
    "If it does not, write to billing@example.com with the order number 4111111111111112.",
    "You can also call us on +44 20 7946 0958 between nine and five.",
    "Our records show the shipping address as the one you gave when you signed up.",
    "The parcel left the warehouse yesterday and the courier expects to deliver it soon.",
    "Please keep the box until the return window closes, in case anything is missing.",
    "We are sorry for the wait and have added a small credit to your account.",
    "Is there anything else I can help you with today?",
]
ANSWER = " ".join(SENTENCES)
CHUNK = 4  # characters per chunk: about one token
CADENCE = 0.010  # seconds between chunks: 100 tokens/s
SLOW_CHECK = 0.030  # seconds: a moderation endpoint's round trip


class PacedModel:
    """Streams ``ANSWER`` in chunks of ``CHUNK`` characters, one every ``CADENCE`` seconds."""

    async def complete(self, messages: Any, options: ChatOptions) -> AgentResponse:
        raise AssertionError("the benchmark streams")

    async def stream(self, messages: Any, options: ChatOptions) -> AsyncIterator[Update]:
        for start in range(0, len(ANSWER), CHUNK):
            await anyio.sleep(CADENCE)
            yield Update("text", ANSWER[start : start + CHUNK])


async def slow_check(text: str, context: GuardrailContext) -> Verdict:
    await anyio.sleep(SLOW_CHECK)
    return Verdict.allow()


class WholeAnswerBuffer:
    """MAF's way: hold every update until the answer is complete, check it once, then send
    it on."""

    def __init__(self, check: Callable[[str, GuardrailContext], Awaitable[Verdict]]) -> None:
        self.check = check

    async def __call__(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        send = request.on_update
        assert send is not None
        held: list[Update] = []

        async def hold(update: Update) -> None:
            held.append(update)

        response = await call_next(
            ChatRequest(request.messages, request.options, hold, invocation=request.invocation)
        )
        verdict = await self.check(response.text, GuardrailContext("buffer", "output"))
        text = verdict.text if verdict.action == "rewrite" and verdict.text else response.text
        await send(Update("text", text))
        return response


async def timed_run(chat_stack: Sequence[Any]) -> tuple[float, float]:
    """(ms to the first visible text, ms to the whole answer) of one streamed run."""
    agent = Agent(PacedModel(), chat_stack=list(chat_stack))
    started = time.perf_counter()
    first: float | None = None

    async def on_update(update: Update) -> None:
        nonlocal first
        if first is None and update.kind == "text" and update.text:
            first = time.perf_counter()

    await agent.run("where is my refund?", on_update=on_update)
    done = time.perf_counter()
    assert first is not None
    return (first - started) * 1000, (done - started) * 1000


SCENARIOS: list[tuple[str, Callable[[], Sequence[Any]]]] = [
    ("no guardrail", lambda: []),
    ("streaming guardrail, pii_redactor, hold_back=200", lambda: [OutputGuardrail(pii_redactor())]),
    ("whole-answer buffer, pii_redactor", lambda: [WholeAnswerBuffer(pii_redactor())]),
    ("streaming guardrail, 30 ms check, hold_back=200", lambda: [OutputGuardrail(slow_check)]),
    ("whole-answer buffer, 30 ms check", lambda: [WholeAnswerBuffer(slow_check)]),
]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def measure(repeats: int) -> list[list[str]]:
    rows = []
    baseline: tuple[float, float] | None = None
    for name, stack in SCENARIOS:
        runs = [await timed_run(stack()) for _ in range(repeats)]
        first, whole = median([r[0] for r in runs]), median([r[1] for r in runs])
        if baseline is None:
            baseline = (first, whole)
        rows.append(
            [
                name,
                f"{first:.0f}",
                f"{first - baseline[0]:+.0f}",
                f"{whole:.0f}",
                f"{whole - baseline[1]:+.0f}",
            ]
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    chunks = -(-len(ANSWER) // CHUNK)
    print(
        f"A {len(ANSWER)}-character answer in {chunks} chunks of {CHUNK}, one every "
        f"{CADENCE * 1000:.0f} ms ({args.backend}; median of {args.repeats} runs, ms)\n"
    )
    rows = run_async(lambda: measure(args.repeats), args.backend)
    headers = ["output guardrail", "first text", "added", "whole answer", "added"]
    print(table(headers, rows))


if __name__ == "__main__":
    main()
