"""What one long server-sent event line costs the event reader both OpenAI clients use.

A body of one ``data:`` line of N MB, in 16 KiB chunks (as httpx hands them over), read
with ``EventReader.next_events``: the cost must grow linearly with N (it grew with N²:
32 MB took 5.75 s before the reader kept a line's chunks and joined them once).

    python benchmarks/bench_sse.py
    python benchmarks/bench_sse.py --sizes 1 4 16 64 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("RAF_SOURCE", str(ROOT)))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Samples, fmt, median, run_async, table  # noqa: E402

CHUNK = 16 * 1024


class _Body:
    def __init__(self, megabytes: int) -> None:
        self.count = megabytes * 1024 * 1024 // CHUNK

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        yield b"data: "
        piece = b"x" * CHUNK
        for _ in range(self.count):
            yield piece
        yield b"\n\n"

    async def aclose(self) -> None:
        pass


async def _read(megabytes: int) -> float:
    from raf._clients._sse import EventReader

    reader = EventReader(
        _Body(megabytes),
        1 << 40,
        too_large=lambda: ValueError("too large"),
        http_error=lambda exc: exc,
    )
    started = time.perf_counter()
    events = await reader.next_events()
    elapsed = time.perf_counter() - started
    assert events is not None
    assert len(events[0]) == megabytes * 1024 * 1024
    return elapsed * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        samples: Samples = [run_async(lambda s=size: _read(s)) for _ in range(args.repeats)]
        rows.append([f"{size} MB", fmt(samples), f"{median(samples) / size:.2f}"])
    print(table(["one line of", "ms (median, min-max)", "ms per MB"], rows))


if __name__ == "__main__":
    main()
