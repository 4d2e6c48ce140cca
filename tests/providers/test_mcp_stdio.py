"""raf's own stdio MCP client (under McpToolsProvider), at the protocol's edges.

The main behaviour is checked against the ``mcp`` SDK's server in
``test_mcp.py`` and at the end of this file. The edges (a server that pings
the client, dies mid-call, sends an endless line, speaks an unknown protocol
version, ignores SIGTERM) need a server that misbehaves on purpose: a small
raw JSON-RPC server written here with the standard library.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from raf import McpToolsProvider, ToolError, check_tool_schema
from raf.errors import McpError

pytestmark = pytest.mark.anyio

RAW_SERVER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time

    MODE, LOG, COUNT = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ADD = {"name": "add", "description": "Add two integers.",
           "inputSchema": {"type": "object", "required": ["a", "b"],
                           "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}

    def note(text):
        with open(LOG, "a") as log:
            log.write(text + "\\n")

    def send(message):
        sys.stdout.write(json.dumps(message) + "\\n")
        sys.stdout.flush()

    note(f"pid {os.getpid()}")
    if MODE == "stubborn":  # ignores SIGTERM and has a child that holds stdout open
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        note(f"pid {child.pid}")
    lines = iter(sys.stdin.readline, "")
    for line in lines:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        params = message.get("params") or {}
        note(f"method {method}")
        if ident is None or method is None:  # a notification, or an answer to its ping
            continue
        if method == "initialize":
            version = "1999-01-01" if MODE == "unknown version" else params["protocolVersion"]
            send({"jsonrpc": "2.0", "id": ident,
                  "result": {"protocolVersion": version, "capabilities": {"tools": {}},
                             "serverInfo": {"name": "raw", "version": "1"}}})
        elif method == "tools/list":
            if MODE == "asks":  # a log line, a ping and a request the client does not offer
                send({"jsonrpc": "2.0", "method": "notifications/message",
                      "params": {"level": "info", "data": "listing"}})
                send({"jsonrpc": "2.0", "id": "p1", "method": "ping"})
                send({"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage",
                      "params": {}})
                for _ in range(2):
                    note("answer " + next(lines).strip())
            if MODE == "batch":  # a JSON-RPC batch of COUNT pings, in one line
                sys.stdout.write(json.dumps(
                    [{"jsonrpc": "2.0", "id": f"b{n}", "method": "ping"} for n in range(COUNT)]
                ) + "\\n")
            if MODE == "ping flood":  # COUNT pings, one a line, then the page
                sys.stdout.write("".join(json.dumps({"jsonrpc": "2.0", "id": f"p{n}",
                                                     "method": "ping"}) + "\\n"
                                         for n in range(COUNT)))
            if MODE == "chatty":  # COUNT lines that are not JSON (a server that prints), one a line
                sys.stdout.write("".join(f"debug: listing {n}\\n" for n in range(COUNT)))
            if MODE == "endless line":
                sys.stdout.write("[" + "1," * COUNT)
                sys.stdout.flush()
                time.sleep(600)
            tools = [dict(ADD, name=f"add{n}")
                     for n in range(1 if MODE in ("batch", "ping flood", "chatty") else COUNT)]
            if MODE == "costly schema":  # valid JSON, a schema jsonschema checks slowly
                tools = [dict(ADD, name="costly", inputSchema={
                    "type": "object", "properties": {"a": {"type": [1] * COUNT}}}), ADD]
            page = {"tools": tools, "nextCursor": "again"} if MODE == "circle" else {"tools": tools}
            send({"jsonrpc": "2.0", "id": ident, "result": page})
        elif method == "tools/call":
            if MODE == "dies":
                os._exit(5)
            elif MODE == "many blocks":  # COUNT content blocks of no known type
                send({"jsonrpc": "2.0", "id": ident, "result": {"content": [{}] * COUNT}})
            elif MODE == "long error":
                send({"jsonrpc": "2.0", "id": ident,
                      "error": {"code": -32000, "message": "no " * 50_000}})
            elif MODE != "stubborn":  # a stubborn server never answers
                arguments = params["arguments"]
                send({"jsonrpc": "2.0", "id": ident,
                      "result": {"content": [
                          {"type": "text", "text": str(arguments["a"] + arguments["b"])}]}})
        else:
            send({"jsonrpc": "2.0", "id": ident,
                  "error": {"code": -32601, "message": f"no method {method}"}})
    if MODE == "stubborn":
        time.sleep(600)  # and does not exit when its stdin closes
    """
)

BOUND = 30  # generous: proves "does not hang", not a speed


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    with open(tmp_path / "server-stderr.log", "w") as log:
        yield log


class Raw:
    """The raw server in one ``mode``, and what it wrote to its log."""

    def __init__(self, tmp_path: Path, mode: str, count: int = 1) -> None:
        script = tmp_path / "raw_server.py"
        script.write_text(RAW_SERVER)
        self.log = tmp_path / f"raw-{mode.replace(' ', '-')}.log"
        self.log.touch()
        self.args = [str(script), mode, str(self.log), str(count)]

    def lines(self, prefix: str) -> list[str]:
        return [
            line.removeprefix(prefix)
            for line in self.log.read_text().splitlines()
            if line.startswith(prefix)
        ]

    def pids(self) -> list[int]:
        return [int(pid) for pid in self.lines("pid ")]


async def gone(pid: int) -> bool:
    for _ in range(200):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await anyio.sleep(0.05)
    return False


@pytest.mark.slow
async def test_a_large_page_is_listed_in_steps_the_loop_running_between_them(
    tmp_path: Path,
) -> None:
    # How long the loop is held cannot be asserted (tests never time); what the listing builds
    # between two turns of the loop can: the SDK's client built the whole page (all 1,000 tools
    # as pydantic models, some 25,000 memory blocks) in one go; raf builds a step of it (4,000
    # to 8,000 here).
    raw = Raw(tmp_path, "plain", count=1_000)
    check_tool_schema("warm", {"type": "object"})  # jsonschema imported before the count
    most = turns = 0
    listed = False

    async def ticker() -> None:
        nonlocal most, turns
        before = sys.getallocatedblocks()
        while not listed:
            await anyio.lowlevel.checkpoint()
            now = sys.getallocatedblocks()
            most, before, turns = max(most, now - before), now, turns + 1

    async with McpToolsProvider(sys.executable, raw.args, max_tools=5_000) as mcp:
        with anyio.fail_after(BOUND * 4):
            async with anyio.create_task_group() as group:
                group.start_soon(ticker)
                tools = await mcp.tools()
                listed = True
    assert len(tools) == 1_000
    assert turns > 1_000  # the loop turned at least once per tool
    assert most < 15_000, f"{most:,} memory blocks built between two turns of the loop"


@pytest.mark.slow
async def test_a_schema_costly_to_check_does_not_hold_the_loop(tmp_path: Path) -> None:
    # jsonschema checked this schema (a list of 20,000 wrong types, 120 KB) for some 1.7 s, on
    # the event loop, and a list ten times longer for minutes: every other task waited, and
    # ``timeout`` could not land. How long cannot be asserted; that the loop turned while the
    # check ran can: the whole listing turned it some 650 times (its reads and steps); a big
    # schema checked in a worker thread lets it turn thousands of times meanwhile.
    raw = Raw(tmp_path, "costly schema", count=20_000)
    check_tool_schema("warm", {"type": "object"})
    turns = 0
    listed = False

    async def ticker() -> None:
        nonlocal turns
        while not listed and turns < 5_000:  # then it stops spinning: the thread runs freely
            await anyio.lowlevel.checkpoint()
            turns += 1

    with capture_logs() as events, anyio.fail_after(BOUND * 4):
        async with (
            McpToolsProvider(sys.executable, raw.args) as mcp,
            anyio.create_task_group() as group,
        ):
            group.start_soon(ticker)
            tools = await mcp.tools()
            listed = True
    assert [tool.name for tool in tools] == ["add"]
    assert turns == 5_000, f"the loop turned {turns} times while the tools were listed"
    (skipped,) = [e for e in events if e["event"] == "mcp.tool_skipped"]
    assert skipped["tool"] == "costly"


async def test_the_servers_ping_is_answered_and_other_requests_are_refused(
    tmp_path: Path,
) -> None:
    raw = Raw(tmp_path, "asks")
    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args) as mcp:
            assert [tool.name for tool in await mcp.tools()] == ["add0"]
    answers = {answer["id"]: answer for answer in map(json.loads, raw.lines("answer "))}
    assert answers["p1"] == {"jsonrpc": "2.0", "id": "p1", "result": {}}
    assert answers[7]["error"]["code"] == -32601  # method not found: raf offers no sampling
    assert raw.lines("method ")[:2] == ["initialize", "notifications/initialized"]


async def test_a_batch_of_requests_does_not_hold_the_loop_or_flood_the_log(
    tmp_path: Path,
) -> None:
    # A batch (one line) of 20,000 pings was handled with no pause (the loop held 0.4 s; 4.4 s
    # for 200,000) and logged a warning for each ping past the 16 answered at once.
    raw = Raw(tmp_path, "batch", count=20_000)
    turns = 0
    listed = False

    async def ticker() -> None:
        nonlocal turns
        while not listed and turns < 5_000:
            await anyio.lowlevel.checkpoint()
            turns += 1

    with capture_logs() as events, anyio.fail_after(BOUND):
        async with (
            McpToolsProvider(sys.executable, raw.args) as mcp,
            anyio.create_task_group() as group,
        ):
            group.start_soon(ticker)
            tools = await mcp.tools()
            listed = True
    assert [tool.name for tool in tools] == ["add0"]
    assert turns == 5_000, f"the loop turned {turns} times while the batch was handled"
    # How many pings find the 16 answers in flight full depends on the scheduling (none, on
    # some anyio versions); those that do are logged at the 1st, 2nd, 4th, 8th, ... only.
    unanswered = [e for e in events if e["event"] == "mcp.request_unanswered"]
    assert len(unanswered) <= 15


@pytest.mark.slow
async def test_a_result_of_many_blocks_does_not_hold_the_loop(tmp_path: Path) -> None:
    # A result's content blocks were read with no pause: 0.5 s for a million. How long cannot
    # be asserted; how much was built between two turns of the loop can (each block of these
    # is named, "[content]": 7.6 MB for 100,000 in one go, 1-1.4 MB a step now).
    raw = Raw(tmp_path, "many blocks", count=100_000)
    most = 0
    called = False

    async def ticker() -> None:
        nonlocal most
        while not called:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            await anyio.lowlevel.checkpoint()
            most = max(most, tracemalloc.get_traced_memory()[1] - before)

    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args) as mcp:
            tracemalloc.start()
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(ticker)
                    text = await mcp.call_tool("add", {})
                    called = True
            finally:
                tracemalloc.stop()
    assert text == "\n".join(["[content]"] * 100_000)
    assert most < 4_000_000, f"{most:,} bytes built between two turns of the loop"


async def test_no_answer_is_written_to_a_server_being_stopped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Pings still read while the server was being stopped were answered into its closed
    # stdin: asyncio warned "pipe closed by peer or os.write(pipe, data) raised exception."
    raw = Raw(tmp_path, "ping flood", count=5_000)
    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args) as mcp:
            await mcp.tools()
    assert not [r for r in caplog.records if "pipe closed" in r.getMessage()]


async def test_a_server_that_prints_to_stdout_does_not_flood_the_log(tmp_path: Path) -> None:
    # Each line that is not JSON was skipped with a warning of its own: 10,000 of them.
    raw = Raw(tmp_path, "chatty", count=10_000)
    with capture_logs() as events, anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args) as mcp:
            assert [tool.name for tool in await mcp.tools()] == ["add0"]
    bad = [e for e in events if e["event"] == "mcp.bad_line"]
    assert 1 <= len(bad) <= 14  # the 1st, 2nd, 4th, 8th, ... of them
    assert bad[0]["line"] == "'debug: listing 0'"


async def test_a_server_that_dies_mid_call_is_an_mcp_error_and_is_gone(
    tmp_path: Path, errlog: TextIO
) -> None:
    raw = Raw(tmp_path, "dies")
    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args, errlog=errlog) as mcp:
            await mcp.tools()
            with pytest.raises(McpError, match=r"failed to run 'add': it exited with code 5"):
                await mcp.call_tool("add", {"a": 1, "b": 2})
            with pytest.raises(McpError, match=r"it exited with code 5"):
                await mcp.call_tool("add", {"a": 1, "b": 2})  # the connection stays ended
    assert await gone(raw.pids()[0])


@pytest.mark.parametrize("mode", ["plain", "endless line"])
async def test_a_message_over_max_message_bytes_is_an_mcp_error_and_stops_the_server(
    tmp_path: Path, errlog: TextIO, mode: str
) -> None:
    raw = Raw(tmp_path, mode, count=5_000)  # a page of some 900 KB, or a line that never ends
    provider = McpToolsProvider(
        sys.executable,
        raw.args,
        errlog=errlog,
        max_message_bytes=10_000,
        name="big",
        max_tools=10_000,
    )
    with anyio.fail_after(BOUND):
        async with provider:
            with pytest.raises(McpError) as caught:
                await provider.tools()
            assert await gone(raw.pids()[0])  # stopped at once, not when the block ends
    assert str(caught.value).startswith("big: listing the tools of")
    assert "a message of more than 10,000 bytes" in str(caught.value)


async def test_an_unknown_protocol_version_is_a_clear_mcp_error(tmp_path: Path) -> None:
    raw = Raw(tmp_path, "unknown version")
    with anyio.fail_after(BOUND), pytest.raises(McpError) as caught:
        async with McpToolsProvider(sys.executable, raw.args, name="old"):
            pass
    message = str(caught.value)
    assert message.startswith("old: the MCP server")
    assert "did not start: it answered with protocol version '1999-01-01'" in message
    assert "2025-11-25" in message  # what raf speaks


async def test_pages_in_a_circle_are_an_mcp_error_not_an_endless_listing(
    tmp_path: Path,
) -> None:
    raw = Raw(tmp_path, "circle", count=0)
    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args, timeout=None) as mcp:
            with pytest.raises(McpError, match="it answered the cursor 'again' a second time"):
                await mcp.tools()
    assert raw.lines("method ").count("tools/list") == 2


async def test_a_long_error_from_the_server_is_cut(tmp_path: Path) -> None:
    raw = Raw(tmp_path, "long error")
    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args, name="long") as mcp:
            with pytest.raises(McpError) as caught:
                await mcp.call_tool("add", {"a": 1, "b": 2})
    message = str(caught.value)
    # Which provider, as the other MCP errors say (a call's did not); not the command, as
    # the model reads it.
    assert message.startswith("long: the MCP server failed to run 'add': it answered with error")
    assert len(message) < 2_200
    assert message.endswith("(148,000 more characters)")


async def test_a_call_does_not_list_the_tools_again(tmp_path: Path) -> None:
    # The SDK's client listed every tool before a call whose tool it had not listed itself
    # (each call of an unopened provider): a server of thousands of tools, listed per call.
    raw = Raw(tmp_path, "plain")
    provider = McpToolsProvider(sys.executable, raw.args)
    with anyio.fail_after(BOUND):
        assert await provider.call_tool("add", {"a": 2, "b": 3}) == "5"
    assert raw.lines("method ") == ["initialize", "notifications/initialized", "tools/call"]


@pytest.mark.slow
async def test_a_server_that_ignores_sigterm_is_killed_with_its_children(
    tmp_path: Path, errlog: TextIO
) -> None:
    raw = Raw(tmp_path, "stubborn")
    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, raw.args, timeout=0.5, errlog=errlog) as mcp:
            await mcp.tools()
            with pytest.raises(McpError, match=r"did not answer within timeout=0\.5s"):
                await mcp.call_tool("add", {"a": 1, "b": 2})
        server, child = raw.pids()
        assert await gone(server)
        assert await gone(child)  # it held the server's stdout open: no hang, and stopped too
    assert "notifications/cancelled" in raw.lines("method ")  # the server was told


async def test_a_cancelled_caller_leaves_no_server_behind(tmp_path: Path) -> None:
    raw = Raw(tmp_path, "plain")
    with anyio.fail_after(BOUND):
        with anyio.CancelScope() as scope:
            async with McpToolsProvider(sys.executable, raw.args) as mcp:
                await mcp.tools()
                scope.cancel()
                await anyio.sleep_forever()
        assert await gone(raw.pids()[0])


async def test_a_call_in_a_cancelled_scope_is_cancelled_not_an_mcp_error(
    tmp_path: Path,
) -> None:
    # The caller's scope holds the connection, so the reader is cancelled with the caller. A
    # caller that went on (shielded, or not yet reached by its cancellation: on asyncio the
    # reader's end could land first) called into the ended connection and got
    # McpError("... the connection was closed") out of a scope that was only cancelled.
    raw = Raw(tmp_path, "plain")
    with anyio.fail_after(BOUND):
        with anyio.CancelScope() as scope:
            async with McpToolsProvider(sys.executable, raw.args) as mcp:
                with anyio.CancelScope(shield=True):
                    scope.cancel()
                    await anyio.wait_all_tasks_blocked()  # the reader has ended
                await mcp.call_tool("add", {"a": 1, "b": 2})
        assert scope.cancelled_caught


# -- the mcp SDK's own server ----------------------------------------------------------------

SDK_SERVER = textwrap.dedent(
    '''
    from mcp.server import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("sdk")

    @server.tool()
    def weather(city: str) -> dict[str, object]:
        """The weather in a city."""
        return {"city": city, "degrees": 21}

    @server.tool()
    def refuse(reason: str) -> str:
        """Always refuses."""
        raise ToolError(f"refused: {reason}")

    server.run("stdio")
    '''
)


@pytest.mark.slow
async def test_the_sdk_server_structured_results_errors_and_unknown_tools(
    tmp_path: Path, errlog: TextIO
) -> None:
    pytest.importorskip("mcp")
    script = tmp_path / "sdk_server.py"
    script.write_text(SDK_SERVER)
    with anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, [str(script)], errlog=errlog) as mcp:
            tools = {tool.name: tool for tool in await mcp.tools()}
            weather = await tools["weather"].invoke({"city": "Oslo"})
            with pytest.raises(ToolError, match="refused: no"):
                await tools["refuse"].invoke({"reason": "no"})
            with pytest.raises(ToolError, match="Unknown tool: nope"):
                await mcp.call_tool("nope", {})
    assert tools["weather"].description == "The weather in a city."
    assert tools["weather"].parameters["required"] == ["city"]
    assert json.loads(weather) == {"city": "Oslo", "degrees": 21}
