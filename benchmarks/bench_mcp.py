"""Listing an MCP server's tools: the total, and the longest the event loop was held.

A raw JSON-RPC server (started over stdio, as ``McpToolsProvider`` starts any)
lists N tools in one page. Meanwhile a task asks the loop to wake it every
5 ms; the longest gap between two wake-ups, less those 5 ms, is the worst
stall: how long every other task of the process (a served request, a
heartbeat) waited. Rows:

- ``raf``: ``McpToolsProvider(...).tools()``, raf's own stdio client: the
  page read in steps, each tool checked (its JSON Schema too) with a pause
  between tools.
- ``mcp SDK``: the ``mcp`` SDK's ``stdio_client`` + ``ClientSession.list_tools()``
  alone, the client raf used before (it parses and validates the whole page
  with no pause; raf's checks of each tool came after it).

    python benchmarks/bench_mcp.py [--tools 1000 20000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from raf import McpToolsProvider, check_tool_schema

SERVER = """
import json, sys
COUNT = int(sys.argv[1])
ADD = {"name": "add", "description": "Add two integers.",
       "inputSchema": {"type": "object", "required": ["a", "b"],
                       "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
for line in sys.stdin:
    message = json.loads(line)
    ident, params = message.get("id"), message.get("params") or {}
    if ident is None:
        continue
    if message["method"] == "initialize":
        result = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "bench", "version": "1"}}
    else:
        result = {"tools": [dict(ADD, name=f"add{n}") for n in range(COUNT)]}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\\n")
    sys.stdout.flush()
"""

TICK = 0.005


async def measured(listing: Callable[[], Awaitable[int]]) -> tuple[int, float, float]:
    """Tools listed, seconds in all, and the worst stall of the loop in seconds."""
    worst = 0.0
    done = False

    async def ticker() -> None:
        nonlocal worst
        last = time.perf_counter()
        while not done:
            await anyio.sleep(TICK)
            now = time.perf_counter()
            worst, last = max(worst, now - last - TICK), now

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        start = time.perf_counter()
        count = await listing()
        elapsed = time.perf_counter() - start
        done = True
    return count, elapsed, worst


async def with_raf(server: Path, count: int) -> tuple[int, float, float]:
    args = [str(server), str(count)]
    async with McpToolsProvider(sys.executable, args, max_tools=count, timeout=None) as mcp:

        async def listing() -> int:
            return len(await mcp.tools())

        return await measured(listing)


async def with_sdk(server: Path, count: int) -> tuple[int, float, float]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    parameters = StdioServerParameters(command=sys.executable, args=[str(server), str(count)])
    async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        async def listing() -> int:
            return len((await session.list_tools()).tools)

        return await measured(listing)


async def main(server: Path, counts: list[int]) -> None:
    check_tool_schema("warm", {"type": "object"})  # jsonschema imported before the rows
    rows = []
    for count in counts:
        for client, run in (("raf", with_raf), ("mcp SDK", with_sdk)):
            listed, elapsed, worst = await run(server, count)
            rows.append((count, client, listed, elapsed, worst))
    print("| tools | client | listed | total | worst loop stall |")
    print("|---:|---|---:|---:|---:|")
    for count, client, listed, elapsed, worst in rows:
        print(f"| {count:,} | {client} | {listed:,} | {elapsed:.2f} s | {worst * 1000:.0f} ms |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, nargs="+", default=[1_000, 20_000])
    counts = parser.parse_args().tools
    with tempfile.TemporaryDirectory() as folder:
        server = Path(folder, "server.py")
        server.write_text(SERVER)
        anyio.run(main, server, counts)
