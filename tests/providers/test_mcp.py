"""McpToolsProvider against real MCP stdio servers, on both backends.

Most tests use a tiny MCP server written here with the standard library
(newline-delimited JSON-RPC over stdio, as the protocol specifies): it
starts in milliseconds. Some use the ``mcp`` SDK's own server (here and in
``test_mcp_stdio.py``, with the protocol's edges).
"""

from __future__ import annotations

import io
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import anyio
import pytest
from structlog.testing import capture_logs

import raf._providers.mcp
from raf import Agent, McpToolsProvider, ProviderError, ScriptedChatClient, ToolCall, ToolError
from raf.config import ContextProviderDecl, build_provider
from raf.errors import ConfigError, McpError

pytestmark = pytest.mark.anyio

TINY_SERVER = textwrap.dedent(
    """
    import json, os, sys

    LOG = sys.argv[1]
    ADD = {"name": "add", "description": "Add two integers.",
           "inputSchema": {"type": "object", "required": ["a", "b"],
                           "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
    OTHERS = [
        {"name": "fail", "description": "Always fails.",
         "inputSchema": {"type": "object", "properties": {"reason": {"type": "string"}}}},
        {"name": "picture", "inputSchema": {"type": "object"}},
        {"name": "crash", "description": "Exits.", "inputSchema": {"type": "object"}},
    ]

    def send(message):
        sys.stdout.write(json.dumps(message) + "\\n")
        sys.stdout.flush()

    with open(LOG, "a") as log:
        log.write(f"start {os.getpid()}\\n")
    for line in sys.stdin:
        message = json.loads(line)
        method, ident = message.get("method"), message.get("id")
        with open(LOG, "a") as log:
            log.write(f"{method}\\n")
        if ident is None:
            continue
        params = message.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": params["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "tiny", "version": "1"}}
        elif method == "tools/list":
            # two pages, to exercise the cursor
            if params.get("cursor") == "page2":
                result = {"tools": OTHERS}
            else:
                result = {"tools": [ADD], "nextCursor": "page2"}
        elif method == "tools/call":
            name, arguments = params["name"], params.get("arguments") or {}
            if name == "add":
                total = arguments["a"] + arguments["b"]
                result = {"content": [{"type": "text", "text": str(total)}], "isError": False}
            elif name == "fail":
                text = "cannot do that: " + arguments.get("reason", "")
                result = {"content": [{"type": "text", "text": text}], "isError": True}
            elif name == "picture":
                result = {"content": [{"type": "text", "text": "a cat"},
                                      {"type": "image", "data": "AAAA", "mimeType": "image/png"}]}
            elif name == "crash":
                sys.exit(3)
            else:
                send({"jsonrpc": "2.0", "id": ident,
                      "error": {"code": -32602, "message": f"unknown tool {name}"}})
                continue
        else:
            send({"jsonrpc": "2.0", "id": ident,
                  "error": {"code": -32601, "message": f"no method {method}"}})
            continue
        send({"jsonrpc": "2.0", "id": ident, "result": result})
    """
)

SDK_SERVER = textwrap.dedent(
    '''
    from mcp.server import MCPServer

    server = MCPServer("sdk")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    server.run("stdio")
    '''
)


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[list[str], Path]:
    script = tmp_path / "tiny_server.py"
    script.write_text(TINY_SERVER)
    log = tmp_path / "server.log"
    return [str(script), str(log)], log


def started(log: Path) -> int:
    return sum(line.startswith("start") for line in log.read_text().splitlines())


async def test_model_calls_server_tools_over_one_connection(tiny: tuple[list[str], Path]) -> None:
    args, log = tiny
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(
                ToolCall("1", "m_add", '{"a": 2, "b": 40}'),
                ToolCall("2", "m_fail", '{"reason": "no"}'),
                ToolCall("3", "m_picture", "{}"),
            ),
            "done",
            "again",
        ]
    )
    async with McpToolsProvider(sys.executable, args, tool_prefix="m_", name="tiny") as mcp:
        agent = Agent(client, stack=[mcp])
        response = await agent.run("go")
        await agent.run("once more")
    tools = {t.name: t for t in client.requests[0].options.tools}
    assert list(tools) == ["m_add", "m_fail", "m_picture", "m_crash"]
    assert tools["m_add"].description == "Add two integers."
    assert tools["m_add"].parameters["required"] == ["a", "b"]
    results = [m.content for m in response.messages if m.role == "tool"]
    assert results == [
        "42",
        "Error: tool 'm_fail' failed: ToolError: cannot do that: no",
        "a cat\n[image: image/png]",
    ]
    assert started(log) == 1  # one process for both runs and all calls
    assert log.read_text().count("tools/list") == 2  # two pages, listed once


async def test_arguments_are_checked_against_the_server_schema(
    tiny: tuple[list[str], Path],
) -> None:
    args, _ = tiny
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(ToolCall("1", "add", '{"a": "two"}')), "done"]
    )
    async with McpToolsProvider(sys.executable, args) as mcp:
        response = await Agent(client, stack=[mcp]).run("go")
    assert response.messages[1].content is not None
    assert response.messages[1].content.startswith("Error: invalid arguments for 'add'")


async def test_without_async_with_each_use_starts_the_server(
    tiny: tuple[list[str], Path],
) -> None:
    args, log = tiny
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(ToolCall("1", "add", '{"a": 1, "b": 2}')), "3"]
    )
    response = await Agent(client, stack=[McpToolsProvider(sys.executable, args)]).run("go")
    assert response.messages[1].content == "3"
    assert started(log) == 2  # one to list the tools, one for the call


async def test_a_crashing_server_is_a_tool_error_not_a_hang(tiny: tuple[list[str], Path]) -> None:
    args, _ = tiny
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(ToolCall("1", "crash", "{}")), "sorry"]
    )
    response = await Agent(client, stack=[McpToolsProvider(sys.executable, args)]).run("go")
    content = response.messages[1].content or ""
    assert content.startswith(
        "Error: tool 'crash' failed: McpError: McpToolsProvider: the MCP server failed"
    )
    assert sys.executable not in content  # the model is not shown a local path
    assert response.text == "sorry"


async def test_a_server_that_cannot_start_fails_the_run_clearly(tmp_path: Path) -> None:
    provider = McpToolsProvider(str(tmp_path / "no-such-server"), name="ghost")
    with pytest.raises(ProviderError) as caught:
        await Agent(ScriptedChatClient(["never"]), stack=[provider]).run("go")
    assert caught.value.provider == "ghost"
    assert isinstance(caught.value.__cause__, McpError)
    assert "no-such-server" in str(caught.value.__cause__)


async def test_a_missing_cwd_is_named_in_the_error(tiny: tuple[list[str], Path]) -> None:
    # It said "cannot start the MCP server '.../python': No such file or directory", of a
    # command that exists: the missing directory was not named.
    args, _ = tiny
    missing = str(Path(args[0]).parent / "missing")
    provider = McpToolsProvider(sys.executable, args, cwd=missing, name="lost")
    with anyio.fail_after(BOUND), pytest.raises(McpError) as caught:
        await provider.tools()
    assert str(caught.value) == (
        f"lost: cannot start the MCP server {sys.executable!r}: "
        f"No such file or directory: {missing!r}"
    )


@pytest.mark.parametrize("timeout", [float("nan"), -1.0, 0, "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused_where_it_is_given(
    timeout: object,
) -> None:
    # NaN was a ValueError from anyio at first use, "5" a TypeError, -1 an McpError saying
    # the server "did not start within timeout=-1s".
    with pytest.raises(ValueError, match=r"timeout must be a number > 0 or None, got "):
        McpToolsProvider("server", timeout=timeout)  # type: ignore[arg-type]


async def test_errlog_may_be_a_stream_with_no_file_behind_it(tmp_path: Path) -> None:
    # A StringIO (pytest's capsys, a notebook's stream) was "cannot start the MCP server
    # '...python': fileno": the server's stderr needs a file; it is copied into it now.
    script = tmp_path / "noisy_server.py"
    script.write_text(
        TINY_SERVER.replace(
            "for line in sys.stdin:",
            "print('the server says h\\u00e9llo', file=sys.stderr)\nfor line in sys.stdin:",
        )
    )
    errlog = io.StringIO()
    with anyio.fail_after(BOUND):
        provider = McpToolsProvider(
            sys.executable, [str(script), str(tmp_path / "log")], errlog=errlog
        )
        assert (await provider.tools())[0].name == "add"
    assert errlog.getvalue() == "the server says h\u00e9llo\n"


async def test_a_second_task_entering_at_once_is_refused_clearly(
    tiny: tuple[list[str], Path],
) -> None:
    # Both entered (each started a server; the second's replaced the first's), and leaving
    # corrupted the cancel scopes: a raw RuntimeError from anyio, trio's "corrupted" report.
    args, log = tiny
    mcp = McpToolsProvider(sys.executable, args, name="shared")
    outcomes: list[str] = []

    async def use() -> None:
        try:
            async with mcp:
                outcomes.append(await mcp.call_tool("add", {"a": 1, "b": 2}))
        except RuntimeError as exc:
            outcomes.append(str(exc))

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as group:
            group.start_soon(use)
            group.start_soon(use)
    assert sorted(outcomes) == ["3", "shared: the MCP connection is already open"]
    assert started(log) == 1


def test_an_env_that_is_not_of_strings_is_refused_where_it_is_given() -> None:
    # It was a TypeError ("expected str, bytes or os.PathLike object, not int") at first use.
    with pytest.raises(ValueError, match=r"env must map str to str, got 'PORT': 8080"):
        McpToolsProvider("server", env={"PORT": 8080})  # type: ignore[dict-item]


@pytest.mark.slow
async def test_the_sdk_server_works_too(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    script = tmp_path / "sdk_server.py"
    script.write_text(SDK_SERVER)
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(ToolCall("1", "shout", '{"text": "hi"}')), "done"]
    )
    async with McpToolsProvider(sys.executable, [str(script)]) as mcp:
        response = await Agent(client, stack=[mcp]).run("go")
    assert response.messages[1].content == "HI"


def test_declared_from_data(tiny: tuple[list[str], Path]) -> None:
    args, _ = tiny
    decl = ContextProviderDecl(
        "mcp", "tools", {"command": sys.executable, "args": args, "tool_prefix": "t_"}
    )
    provider = build_provider(decl)
    assert isinstance(provider, McpToolsProvider)
    assert (provider.name, provider.kind, provider.tool_prefix) == ("tools", "mcp", "t_")
    with pytest.raises(ConfigError, match="option 'args' must be a list of strings"):
        build_provider(ContextProviderDecl("mcp", options={"command": "x", "args": "a b"}))


async def test_the_mcp_package_is_not_needed(
    tiny: tuple[list[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # raf speaks the protocol itself: before, building the provider without the mcp package
    # was a ConfigError that asked for it.
    monkeypatch.setitem(sys.modules, "mcp", None)
    monkeypatch.setitem(sys.modules, "mcp_types", None)
    args, _ = tiny
    async with McpToolsProvider(sys.executable, args) as mcp:
        assert len(await mcp.tools()) == 4
        assert await mcp.call_tool("add", {"a": 1, "b": 2}) == "3"


# -- servers that never answer or exit at once: a McpError within ``timeout`` -------------------

SILENT_SERVER = textwrap.dedent(
    """
    import os, sys
    with open(sys.argv[1], "w") as pid:
        pid.write(str(os.getpid()))
    for line in sys.stdin:  # reads every request, answers none
        pass
    """
)

QUITTING_SERVER = textwrap.dedent(
    """
    import sys
    sys.stderr.write("quitting server: no configuration\\n")
    sys.exit(3)
    """
)

MUTE_AFTER_HELLO = textwrap.dedent(
    """
    import json, sys
    for line in sys.stdin:  # answers initialize, then nothing
        message = json.loads(line)
        if message.get("method") == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"],
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "mute", "version": "1"}}
            sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}))
            sys.stdout.write("\\n")
            sys.stdout.flush()
    """
)

BOUND = 30  # generous: proves "does not hang", not a speed


@pytest.fixture
def errlog(tmp_path: Path) -> Iterator[TextIO]:
    with open(tmp_path / "server-stderr.log", "w") as log:
        yield log


def server(tmp_path: Path, source: str, *args: str) -> list[str]:
    script = tmp_path / "server.py"
    script.write_text(source)
    return [str(script), *args]


async def wait_until_gone(pid: int) -> bool:
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        await anyio.sleep(0.05)
    return False


async def use_provider(provider: McpToolsProvider, use: str) -> None:
    if use == "async with":
        async with provider:
            pass
    elif use == "one-off listing":
        await provider.tools()
    else:
        await Agent(ScriptedChatClient(["never"]), stack=[provider]).run("go")


@pytest.mark.parametrize("use", ["async with", "one-off listing"])
@pytest.mark.slow
async def test_a_server_that_never_answers_is_an_mcp_error_within_timeout(
    tmp_path: Path, errlog: TextIO, use: str
) -> None:
    pid_file = tmp_path / "server.pid"
    provider = McpToolsProvider(
        sys.executable, server(tmp_path, SILENT_SERVER, str(pid_file)), timeout=0.5, errlog=errlog
    )
    with anyio.fail_after(BOUND), pytest.raises(McpError) as caught:
        await use_provider(provider, use)
    message = str(caught.value)
    assert "within timeout=0.5s" in message
    assert ("did not start" if use == "async with" else "start and list its tools") in message
    assert await wait_until_gone(int(pid_file.read_text()))  # the server was stopped, not leaked


@pytest.mark.parametrize("use", ["async with", "one-off listing", "agent run"])
async def test_a_server_that_exits_at_once_is_an_mcp_error(
    tmp_path: Path, errlog: TextIO, use: str
) -> None:
    provider = McpToolsProvider(
        sys.executable, server(tmp_path, QUITTING_SERVER), timeout=5, errlog=errlog, name="quits"
    )
    with anyio.fail_after(BOUND), pytest.raises((McpError, ProviderError)) as caught:
        await use_provider(provider, use)
    error = caught.value
    if use == "agent run":
        assert isinstance(error, ProviderError)
        assert error.provider == "quits"
        error = error.__cause__  # type: ignore[assignment]
    assert type(error) is McpError  # not an ExceptionGroup from the SDK's task groups
    assert str(error).startswith("quits: the MCP server")
    assert "did not start" in str(error)
    errlog.flush()
    assert "quitting server: no configuration" in (tmp_path / "server-stderr.log").read_text()


async def test_an_open_server_that_stops_answering_is_an_mcp_error_within_timeout(
    tmp_path: Path, errlog: TextIO
) -> None:
    provider = McpToolsProvider(
        sys.executable, server(tmp_path, MUTE_AFTER_HELLO), timeout=0.5, errlog=errlog
    )
    with anyio.fail_after(BOUND):
        async with provider:
            with pytest.raises(McpError, match=r"did not list its tools within timeout=0\.5s"):
                await provider.tools()


async def test_a_tool_with_a_malformed_schema_is_skipped_with_a_warning_naming_it(
    tmp_path: Path,
) -> None:
    script = tmp_path / "bad_schema_server.py"
    script.write_text(
        TINY_SERVER.replace(
            '{"name": "picture", "inputSchema": {"type": "object"}}',
            '{"name": "picture", "inputSchema": '
            '{"type": "object", "properties": {"x": {"type": 5}}}}',
        )
    )
    log = tmp_path / "log.txt"
    with capture_logs() as events:
        async with McpToolsProvider(
            sys.executable, [str(script), str(log)], tool_prefix="m_"
        ) as mcp:
            names = [tool.name for tool in await mcp.tools()]
    assert names == ["m_add", "m_fail", "m_crash"]
    skipped = [e for e in events if e["event"] == "mcp.tool_skipped"]
    assert [e["tool"] for e in skipped] == ["m_picture"]
    assert "at properties.x.type" in skipped[0]["reason"]


@pytest.mark.parametrize(
    "schema",
    ['"a string"', "[1, 2]", '{"type": "object", "properties": 5}'],
    ids=["string", "list", "properties not an object"],
)
async def test_a_tool_the_sdk_rejects_is_skipped_and_the_others_are_listed(
    tmp_path: Path, schema: str
) -> None:
    script = tmp_path / "sdk_rejects_server.py"
    script.write_text(
        TINY_SERVER.replace(
            '{"name": "picture", "inputSchema": {"type": "object"}}',
            '{"name": "picture", "inputSchema": ' + schema + "}",
        )
    )
    log = tmp_path / "log.txt"
    with capture_logs() as events, anyio.fail_after(BOUND):
        async with McpToolsProvider(
            sys.executable, [str(script), str(log)], tool_prefix="m_"
        ) as mcp:
            names = [tool.name for tool in await mcp.tools()]
            assert await mcp.call_tool("add", {"a": 2, "b": 3}) == "5"
    assert names == ["m_add", "m_fail", "m_crash"]
    skipped = [e for e in events if e["event"] == "mcp.tool_skipped"]
    assert [e["tool"] for e in skipped] == ["m_picture"]


async def test_a_hostile_tool_is_skipped_with_a_bounded_warning(tmp_path: Path) -> None:
    # The warnings quoted a server's values whole: a name that is a list of 200,000 numbers
    # (written out whole: 1.3 MB, the loop held), a name of 200,000 characters, the whole
    # inputSchema list, jsonschema's message quoting a 2,000-item list. A name longer than
    # the 128 characters the protocol allows is skipped too: no model API takes it.
    script = tmp_path / "hostile_tools_server.py"
    script.write_text(
        TINY_SERVER.replace(
            "OTHERS = [",
            "OTHERS = [\n"
            '    {"name": list(range(200_000)), "inputSchema": {"type": "object"}},\n'
            '    {"name": "n" * 200_000, "inputSchema": {"type": "object"}},\n'
            '    {"name": "listy", "inputSchema": list(range(200_000))},\n'
            '    {"name": "typed", "inputSchema": {"type": "object", "properties": {'
            '"a": {"type": [1] * 2_000}}}},\n',
        )
    )
    with capture_logs() as events, anyio.fail_after(BOUND):
        async with McpToolsProvider(
            sys.executable, [str(script), str(tmp_path / "log.txt")], name="hostile"
        ) as mcp:
            names = [tool.name for tool in await mcp.tools()]
    assert names == ["add", "fail", "picture", "crash"]
    skipped = [e for e in events if e["event"] == "mcp.tool_skipped"]
    assert len(skipped) == 4
    assert all(len(repr(event)) < 1_500 for event in skipped), [len(repr(e)) for e in skipped]
    assert "longer than 128 characters" in skipped[1]["reason"]
    assert [e["tool"] for e in skipped][2:] == ["listy", "typed"]


async def test_a_tool_listed_twice_is_offered_once(tmp_path: Path) -> None:
    # Both were offered, and every run failed: ToolConflictError, "two tools are named 'add'".
    script = tmp_path / "twice_server.py"
    script.write_text(TINY_SERVER.replace("OTHERS = [", "OTHERS = [dict(ADD, description='2'),"))
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(ToolCall("1", "add", '{"a": 2, "b": 3}')), "done"]
    )
    with capture_logs() as events, anyio.fail_after(BOUND):
        async with McpToolsProvider(sys.executable, [str(script), str(tmp_path / "log")]) as mcp:
            response = await Agent(client, stack=[mcp]).run("go")
    offered = client.requests[0].options.tools
    assert [(t.name, t.description) for t in offered][:2] == [
        ("add", "Add two integers."),
        ("fail", "Always fails."),
    ]
    assert [m.content for m in response.messages if m.role == "tool"] == ["5"]
    (skipped,) = [e for e in events if e["event"] == "mcp.tool_skipped"]
    assert skipped["tool"] == "add"
    assert skipped["reason"] == "a tool of this name was listed before it"


async def test_a_deep_schema_listed_from_a_deep_stack_is_no_raw_recursion_error(
    tmp_path: Path,
) -> None:
    # The size of a schema (to check a big one in a thread) was measured by writing it as
    # JSON, where the listing runs: from a deep stack (a run inside many layers), a schema
    # nested 800 deep raised a raw RecursionError out of the listing.
    script = tmp_path / "deep_server.py"
    script.write_text(
        TINY_SERVER.replace(
            "OTHERS = [",
            'OTHERS = [{"name": "deep", "inputSchema": {"type": "object", '
            '"default": json.loads("[" * 800 + "]" * 800)}},',
        )
    )

    async def deep(depth: int) -> tuple[str, ...]:
        if depth:
            return await deep(depth - 1)
        provider = McpToolsProvider(sys.executable, [str(script), str(tmp_path / "log")])
        return tuple(tool.name for tool in await provider.tools())

    with anyio.fail_after(BOUND):
        names = await deep(300)
    assert names[0] == "add"
    assert names[-3:] == ("fail", "picture", "crash")


async def test_a_result_too_deep_to_write_is_an_mcp_error(tmp_path: Path) -> None:
    # Structured content nested 800 deep, written as JSON from a deep stack, was a raw
    # RecursionError out of call_tool.
    script = tmp_path / "deep_result_server.py"
    script.write_text(
        TINY_SERVER.replace(
            '        elif name == "crash":',
            '        elif name == "deep":\n'
            '            result = {"content": [], '
            '"structuredContent": json.loads("[" * 800 + "]" * 800)}\n'
            '        elif name == "crash":',
        )
    )

    async def deep(depth: int, mcp: McpToolsProvider) -> str:
        return await deep(depth - 1, mcp) if depth else await mcp.call_tool("deep", {})

    with anyio.fail_after(BOUND):
        async with McpToolsProvider(
            sys.executable, [str(script), str(tmp_path / "log")], name="deep"
        ) as mcp:
            with pytest.raises(McpError) as caught:
                await deep(300, mcp)
            assert await mcp.call_tool("add", {"a": 1, "b": 2}) == "3"
    assert str(caught.value) == (
        "deep: the MCP server answered 'deep' with a result nested too deeply to read"
    )


def _many_tools_server(tmp_path: Path, count: int) -> list[str]:
    script = tmp_path / "many_tools_server.py"
    script.write_text(
        TINY_SERVER.replace(
            '    {"name": "crash", "description": "Exits.", "inputSchema": {"type": "object"}},\n]',
            '    {"name": "crash", "description": "Exits.", "inputSchema": {"type": "object"}},\n'
            f"] + [dict(ADD, name=f'add{{n}}') for n in range({count})]",
        )
    )
    return [str(script), str(tmp_path / "log.txt")]


async def test_a_server_with_too_many_tools_is_a_clear_error(tmp_path: Path) -> None:
    args = _many_tools_server(tmp_path, 1_000)  # and the first page's one: 1,001
    with anyio.fail_after(BOUND), pytest.raises(McpError, match=r"more than max_tools=1000"):
        async with McpToolsProvider(sys.executable, args) as mcp:
            await mcp.tools()


async def test_listing_many_tools_yields_to_the_loop_and_honours_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Few tools, each slow to check: listing them takes some 15 ms, a small part of the second
    # even on a loaded machine (a page of 3,000 took all of it under load, and the deadline
    # landed at the first check).
    args = _many_tools_server(tmp_path, 300)
    checked = 0
    check = raf._providers.mcp.build_validator

    def counted(name: str, schema: object) -> object:
        nonlocal checked
        checked += 1
        time.sleep(0.01)  # a slow check (a big schema): 3 s of CPU for the page
        return check(name, schema)

    monkeypatch.setattr(raf._providers.mcp, "build_validator", counted)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    async with McpToolsProvider(sys.executable, args, max_tools=50_000, timeout=1.0) as mcp:
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(tick)
                with pytest.raises(McpError, match=r"within timeout=1\.0s"):
                    await mcp.tools()
                group.cancel_scope.cancel()
    assert ticks > 0  # the loop ran other tasks while the tools were listed
    # The deadline landed between two checks (after the first one is enough): without a
    # checkpoint it could land only after all 303 of them.
    assert 0 < checked < 300


async def test_arguments_with_a_lone_surrogate_reach_the_server(
    tiny: tuple[list[str], Path],
) -> None:
    # json.loads makes a lone surrogate of the model's "\ud800"; written as UTF-8 it would fail.
    args, _ = tiny
    async with McpToolsProvider(sys.executable, args) as mcp:
        with pytest.raises(ToolError, match="cannot do that: \ud800"):
            await mcp.call_tool("fail", {"reason": "\ud800"})
