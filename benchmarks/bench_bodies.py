"""How long each OpenAI client takes to build its request body over a long history.

No HTTP: ``request_body`` alone, for the history of ``bench_openai.py`` (a system
message, then user and assistant turns with a tool call now and then), in four ways:

- ``next turn, same objects``: the conversation's next turn (two messages more), the
  history the same message objects as the call before (an in-memory history);
- ``next turn, new objects``: the same, the history decoded anew before each turn (equal
  messages, new objects: a store that decodes rows), the decoding not timed;
- ``no prefix``: the stored messages rotated by two each call, so no earlier body is a
  prefix of the new one: only the per-message cache helps;
- ``cold``: a new client and new message objects: everything is encoded.

    python benchmarks/bench_bodies.py                 # 10,000 messages
    python benchmarks/bench_bodies.py --size 1000 --repeats 21
    python benchmarks/bench_bodies.py --structured    # each call asks for an output schema
    RAF_SOURCE=../other-checkout python benchmarks/bench_bodies.py  # measure another raf
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("RAF_SOURCE", str(ROOT)))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_openai import copies, history  # noqa: E402
from harness import Samples, fmt, table  # noqa: E402

#: The options of every call: with ``--structured``, an output schema too.
OPTIONS: list[Any] = []


def options() -> Any:
    """The ChatOptions each call is made with (one object, as in an agent's run)."""
    if not OPTIONS:
        from raf import ChatOptions

        OPTIONS.append(ChatOptions())
    return OPTIONS[0]


def structured() -> Any:
    """ChatOptions asking for a small nested output type (what ``output_type=`` sends)."""
    import pydantic

    from raf import AgentRunOptions, ChatOptions

    class Item(pydantic.BaseModel):
        name: str
        qty: int = 1

    class Order(pydantic.BaseModel):
        items: list[Item]
        note: str | None = None

    return ChatOptions.from_run(AgentRunOptions(output_type=Order), ())


def timed(
    client_for: Callable[[int], Any], inputs: Callable[[int], Sequence[Any]], repeats: int
) -> Samples:
    """Milliseconds of ``client_for(n).request_body(inputs(n))`` for each call ``n``; only
    the ``request_body`` is timed."""
    samples: Samples = []
    for n in range(repeats):
        client, messages = client_for(n), inputs(n)
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            client.request_body(messages, options())
            samples.append((time.perf_counter() - started) * 1e3)
        finally:
            gc.enable()
    return samples


def measure(kind: str, size: int, repeats: int) -> dict[str, Samples]:
    from raf import ChatMessage
    from raf._clients.openai import OpenAIChatClient
    from raf._clients.responses import OpenAIResponsesClient

    client_class = OpenAIChatClient if kind == "chat" else OpenAIResponsesClient
    stored = history(size)
    system = ChatMessage.system("You answer questions about the history. Be brief.")
    base = [system, *stored]

    def warm() -> Callable[[int], Any]:
        """One client for every call, which has sent the history once."""
        client = client_class("bench-model", api_key="sk-bench")
        client.request_body(base, options())
        return lambda n: client

    same = list(base)

    def next_turn(n: int) -> list[Any]:
        same.extend([ChatMessage.user(f"question {n}"), ChatMessage.assistant(f"answer {n}")])
        return list(same)

    decoded = list(base)

    def decoded_turn(n: int) -> list[Any]:
        decoded.extend([ChatMessage.user(f"question {n}"), ChatMessage.assistant(f"answer {n}")])
        return copies(decoded)

    def rotated(n: int) -> list[Any]:
        cut = 2 * (n + 1)
        return [system, *stored[cut:], *stored[:cut]]

    return {
        "next turn, same objects": timed(warm(), next_turn, repeats),
        "next turn, new objects": timed(warm(), decoded_turn, repeats),
        "no prefix": timed(warm(), rotated, repeats),
        "cold": timed(
            lambda n: client_class("bench-model", api_key="sk-bench"),
            lambda n: copies(base),
            repeats,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument(
        "--structured", action="store_true", help="ask for an output schema in every call"
    )
    args = parser.parse_args()
    if args.structured:
        OPTIONS.append(structured())
    rows = []
    for kind in ("chat", "responses"):
        for name, samples in measure(kind, args.size, args.repeats).items():
            rows.append([f"{args.size:,}", kind, name, fmt(samples)])
    what = "structured output" if args.structured else "text"
    print(table(["history", "client", f"body ({what})", "ms median (min-max)"], rows))


if __name__ == "__main__":
    main()
