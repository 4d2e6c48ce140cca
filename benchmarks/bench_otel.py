"""What raf.otel costs: a run untraced, traced with a no-op tracer provider, and with the SDK.

Each figure is measured in a fresh interpreter; the untraced ones check that
``opentelemetry`` was never imported (``raf.otel`` off costs nothing).

    python benchmarks/bench_otel.py
    python benchmarks/bench_otel.py --repeats 9 --backend trio
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("RAF_SOURCE", str(ROOT)))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Samples, fmt, median, per_op, run_isolated, table  # noqa: E402

import raf  # noqa: E402
from raf import AgentResponse, ChatMessage, ContextProvider, ContextResult, ToolCall  # noqa: E402

REPLY = AgentResponse((ChatMessage.assistant("ok"),))
PROVIDERS = 10
LIMIT = 1.5  # the target: traced with a no-op provider / untraced


class FakeModel:
    """Answers at once; with ``tool_first``, asks for one tool call first on every other call."""

    def __init__(self, tool_first: bool = False) -> None:
        self.tool_first = tool_first
        self.calls = 0

    async def complete(self, messages: Sequence[ChatMessage], options: Any) -> AgentResponse:
        self.calls += 1
        if self.tool_first and self.calls % 2:
            call = ToolCall("c1", "add", '{"a": 1, "b": 2}')
            return AgentResponse((ChatMessage.assistant(None, tool_calls=[call]),))
        return REPLY


class Line(ContextProvider):
    """A trivial provider: one instruction line, no post stage."""

    kind = "bench"

    def __init__(self, index: int) -> None:
        self.name = f"line{index}"
        self.line = f"Rule {index}: be precise."

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        return ContextResult(instructions=self.line)


class Both(Line):
    """A trivial provider with a post stage too."""

    async def on_invoked(self, *args: Any) -> None:
        pass


@raf.tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _agent(shape: str) -> raf.Agent:
    if shape == "pre":
        return raf.Agent(FakeModel(), stack=[Line(i) for i in range(PROVIDERS)])
    if shape == "both":
        return raf.Agent(FakeModel(), stack=[Both(i) for i in range(PROVIDERS)])
    return raf.Agent(FakeModel(tool_first=True), tools=[add], stack=[Both(i) for i in range(3)])


def _traced(agent: raf.Agent, mode: str) -> raf.Agent:
    if mode == "off":
        return agent
    from opentelemetry.trace import NoOpTracerProvider

    import raf.otel

    if mode == "noop":
        return raf.otel.instrument(agent, tracer_provider=NoOpTracerProvider())
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traced = raf.otel.instrument(agent, tracer_provider=provider)
    _KEEP.append(exporter)
    return traced


_KEEP: list[Any] = []

SHAPES = {
    "pre": f"{PROVIDERS} providers, pre stage only",
    "both": f"{PROVIDERS} providers, pre and post stage",
    "tool": "3 providers, a tool call, 2 model calls",
}
MODES = {"off": "untraced", "noop": "raf.otel, no-op provider", "sdk": "raf.otel, SDK + exporter"}


async def measure(shape: str, args: argparse.Namespace) -> dict[str, Any]:
    """The three modes of one shape, their repeats interleaved (the machine's noise is shared).

    The untraced agent runs first on its own, and whether that imported
    ``opentelemetry`` is noted before the traced agents are built.
    """
    off = _traced(_agent(shape), "off")
    for _ in range(200):
        await off.run("hi")
    imported = "opentelemetry" in sys.modules
    agents = {mode: off if mode == "off" else _traced(_agent(shape), mode) for mode in MODES}
    figures: dict[str, Samples] = {mode: [] for mode in MODES}
    for _ in range(args.repeats):
        for mode, agent in agents.items():

            async def run(agent: raf.Agent = agent) -> None:
                await agent.run("hi")

            operation: Callable[[], Awaitable[None]] = run
            figures[mode] += await per_op(operation, ops=1000, repeats=1, warmup=20)
            for exporter in _KEEP:
                exporter.clear()  # the exporter's list would grow for ever
    return {"figures": figures, "otel_imported_untraced": imported}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="samples per figure")
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(anyio.run(measure, args.one, args, backend=args.backend)))
        return
    extra = ["--repeats", str(args.repeats), "--backend", args.backend]
    rows, targets = [], []
    for shape, label in SHAPES.items():
        result = run_isolated(__file__, shape, extra)
        if "figures" not in result:
            rows.append([label, "-", result.get("error", "?"), "-"])
            continue
        figures: dict[str, Samples] = result["figures"]
        off = figures["off"]
        for mode, figure in figures.items():
            paired = median([one / base for one, base in zip(figure, off, strict=True)])
            rows.append([label, MODES[mode], fmt(figure), f"x{paired:.2f}"])
        # Each repeat ran every mode, one after the other: the median of the per-repeat
        # ratios cancels the load that other processes put on the machine meanwhile.
        factor = median([noop / base for noop, base in zip(figures["noop"], off, strict=True)])
        verdict = "met" if factor <= LIMIT else "MISSED"
        targets.append([f"no-op / untraced, {label}", f"x{factor:.2f}", f"<= x{LIMIT}", verdict])
        imported = result["otel_imported_untraced"]
        targets.append(
            [
                f"untraced run imports opentelemetry, {label}",
                "yes" if imported else "no",
                "no",
                "MISSED" if imported else "met",
            ]
        )
        print(f"  measured {label}", file=sys.stderr, flush=True)
    print(
        f"raf on Python {sys.version.split()[0]}, {args.backend}, "
        f"{os.cpu_count()} cores; us/run, median (min-max) of {args.repeats} repeats\n"
    )
    print(table(["run", "tracing", "us/run", "/untraced (paired)"], rows))
    print()
    print(table(["target", "raf", "target", "verdict"], targets))


if __name__ == "__main__":
    main()
