"""Timing, one-process-per-scenario dispatch and the table: shared by both benchmark scripts."""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

#: A measured figure: the samples of several repeats, in the scenario's unit.
Samples = list[float]


class NotBuilt(Exception):
    """A scenario whose code under test cannot be imported (yet)."""


async def per_op(
    operation: Callable[[], Awaitable[Any]], *, ops: int, repeats: int, warmup: int = 50
) -> Samples:
    """Microseconds per call of ``operation``: one sample per repeat of ``ops`` sequential calls.

    The garbage collector is off inside a timed loop (as in ``timeit``) and runs
    between repeats, so a sample is not one unlucky collection.
    """

    async def timed() -> float:
        start = time.perf_counter()
        for _ in range(ops):
            await operation()
        return (time.perf_counter() - start) / ops * 1e6

    return await _sampled(operation, timed, repeats=repeats, warmup=warmup)


async def per_interval(
    operation: Callable[[], Awaitable[float]], *, ops: int, repeats: int, warmup: int = 50
) -> Samples:
    """Microseconds of the interval that each call of ``operation`` measures and returns.

    For a part of an operation (the time to a run's first update): the
    operation times that part itself with ``time.perf_counter`` and returns
    it in seconds. One sample per repeat of ``ops`` calls, the collector off.
    """

    async def timed() -> float:
        total = 0.0
        for _ in range(ops):
            total += await operation()
        return total / ops * 1e6

    return await _sampled(operation, timed, repeats=repeats, warmup=warmup)


async def _sampled(
    operation: Callable[[], Awaitable[Any]],
    timed: Callable[[], Awaitable[float]],
    *,
    repeats: int,
    warmup: int,
) -> Samples:
    """``warmup`` calls of ``operation``, then ``repeats`` samples of ``timed``, collector off."""
    for _ in range(warmup):
        await operation()
    samples: Samples = []
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            samples.append(await timed())
        finally:
            gc.enable()
    return samples


async def wall(operation: Callable[[], Awaitable[Any]], *, repeats: int, scale: float) -> Samples:
    """Wall-clock time of ``operation`` per repeat, multiplied by ``scale`` (1e3 for ms)."""
    await operation()  # warm-up: imports, first-call caches
    samples: Samples = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        await operation()
        samples.append((time.perf_counter() - start) * scale)
    return samples


def run_async(main: Callable[[], Awaitable[Any]], backend: str = "asyncio") -> Any:
    """``anyio.run`` on ``backend``."""
    return anyio.run(main, backend=backend)


@dataclass
class Row:
    """One scenario's result: a figure per contender (raf, floor, peers)."""

    name: str
    unit: str
    figures: dict[str, Samples | str] = field(default_factory=dict)
    note: str = ""


def run_isolated(script: str, scenario: str, extra: Sequence[str] = ()) -> dict[str, Any]:
    """Run one scenario of ``script`` in a fresh interpreter; its JSON result."""
    completed = subprocess.run(
        [sys.executable, script, "--one", scenario, *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        tail = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"failed: {tail}"}
    return dict(json.loads(completed.stdout.strip().splitlines()[-1]))


def median(samples: Samples) -> float:
    """The median of the samples."""
    return statistics.median(samples)


def fmt(value: Samples | str) -> str:
    """``median (min-max)``, or the text of a figure that could not be measured."""
    if isinstance(value, str):
        return value
    mid, low, high = statistics.median(value), min(value), max(value)
    return f"{_num(mid)} ({_num(low)}-{_num(high)})"


def ratio(value: Samples | str, floor: Samples | str) -> str:
    """``value / floor`` of the medians, as ``x1.23``."""
    if isinstance(value, str) or isinstance(floor, str) or median(floor) == 0:
        return "-"
    return f"x{median(value) / median(floor):.2f}"


def _num(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, columns padded so it also reads well in a terminal."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), rule, *(line(row) for row in rows)])
