"""McpToolsProvider: the tools of an MCP server (over stdio) offered to the model."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TextIO

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs

from raf._agent.tools import build_validator
from raf._log import log as _log
from raf._onion.compose import ContextProvider
from raf._providers.mcp_stdio import (
    MAX_MESSAGE_BYTES,
    ServerFault,
    StdioConnection,
    cut,
    open_stdio,
    quote,
)
from raf._sessions.base import Session
from raf._values.context import ContextResult
from raf._values.messages import ChatMessage
from raf._values.options import AgentRunOptions
from raf.errors import McpError, ToolError, ToolSchemaError

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__ = ["McpToolsProvider"]

#: The most tools a server may list: a model cannot use thousands anyway, and each
#: costs a schema check (about 0.75 ms).
DEFAULT_MAX_TOOLS: Final = 1000

#: The longest tool name the protocol allows (model APIs take 64 to 128 characters): a
#: longer one is skipped, as no model could be offered it.
MAX_NAME_CHARS: Final = 128
#: A listed tool's schema longer than this (as JSON) is checked in a worker thread; most are
#: shorter, and checked inline (a thread costs more than their check).
CHECK_INLINE_CHARS: Final = 4096


@attrs.frozen(slots=True)
class McpTool:
    """One tool of an MCP server, as a raf :class:`raf.Tool`.

    ``name`` is what the model sees (``tool_prefix`` + the server's name);
    ``remote_name`` is what the server is asked to run.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    remote_name: str
    provider: McpToolsProvider = attrs.field(repr=False, eq=False)
    #: The jsonschema validator of ``parameters``, built when the server listed the tool.
    schema_validator: Any = attrs.field(default=None, kw_only=True, repr=False, eq=False)

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Call the tool on the server; a result flagged as an error raises :class:`ToolError`."""
        return await self.provider.call_tool(self.remote_name, arguments)


class McpToolsProvider(ContextProvider):
    """The tools of an MCP server started as ``command args...`` and spoken to over stdio.

    The server's tools are listed on first use and offered to the model on
    every run (``tool_prefix`` is put in front of each name, to keep them
    apart from other tools). raf speaks the protocol itself (JSON-RPC over
    the server's stdin and stdout): no package is needed for it.

    Two ways to run it:

    * ``async with McpToolsProvider(...) as mcp:`` keeps one server process
      for the whole block; every run and tool call inside it uses it. This
      is the way for anything but a one-off run.
    * Without ``async with``, each use starts the server, does its work
      (list the tools, or call one) and stops it: slower, but nothing to
      manage, and nothing outlives the call.

    ``timeout`` bounds starting the server, listing its tools (every page
    and every schema check together) and each tool call. A server that
    lists more than ``max_tools`` tools, or sends one message (a line) of
    more than ``max_message_bytes``, is an :class:`raf.errors.McpError`; a
    malformed tool, or one whose schema raf refuses, is left out (warning
    ``mcp.tool_skipped``), and the others are offered.
    """

    kind = "mcp"

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        tool_prefix: str = "",
        timeout: float | None = 60.0,
        errlog: TextIO | None = None,
        name: str | None = None,
        max_tools: int = DEFAULT_MAX_TOOLS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        if type(max_tools) is not int or max_tools < 1:
            raise ValueError(f"max_tools must be an int >= 1, got {max_tools!r}")
        if type(max_message_bytes) is not int or max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be an int >= 1, got {max_message_bytes!r}")
        if not isinstance(command, str) or not command:
            raise ValueError(f"command must be a non-empty str, got {command!r}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"args must be a list of str, got {args!r}")
        if timeout is not None and (
            not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0
        ):
            raise ValueError(f"timeout must be a number > 0 or None, got {timeout!r}")
        for key, value in (env or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"env must map str to str, got {key!r}: {value!r}")
        if name is not None:
            self.name = name
        self.command = command
        self.args = tuple(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.tool_prefix = tool_prefix
        self.timeout = timeout
        self.max_tools = max_tools
        self.max_message_bytes = max_message_bytes
        self.errlog = errlog
        self._tools: tuple[McpTool, ...] | None = None
        self._connection: StdioConnection | None = None
        self._exit_stack: AsyncExitStack | None = None
        self._lock = anyio.Lock()

    async def __aenter__(self) -> McpToolsProvider:
        if self._exit_stack is not None:
            raise RuntimeError(f"{self.name}: the MCP connection is already open")
        # Taken at once: another task entering meanwhile is refused (two connections, each
        # left from the other's task, corrupted both tasks' cancel scopes).
        stack = self._exit_stack = AsyncExitStack()
        try:
            self._connection = await stack.enter_async_context(self._connect())
        except BaseException:
            self._exit_stack = None
            await stack.aclose()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        stack, self._exit_stack, self._connection = self._exit_stack, None, None
        if stack is not None:
            await stack.aclose()

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[StdioConnection]:
        started = False
        try:
            async with open_stdio(
                self.command,
                self.args,
                env=self.env,
                cwd=self.cwd,
                errlog=self.errlog or sys.stderr,
                max_message_bytes=self.max_message_bytes,
            ) as connection:
                started = True
                try:
                    with self._deadline():
                        await connection.initialize()
                except (ServerFault, TimeoutError) as exc:
                    why = self._why(exc, "answer the initialize request")
                    raise McpError(
                        f"{self.name}: the MCP server {self.command!r} did not start: {why}"
                    ) from exc
                yield connection
        except OSError as exc:
            if started:
                raise
            why = exc.strerror or str(exc)
            if exc.filename is not None and str(exc.filename) != self.command:
                why += f": {str(exc.filename)!r}"  # not the command's: its cwd, ...
            raise McpError(
                f"{self.name}: cannot start the MCP server {self.command!r}: {why}"
            ) from exc

    def _deadline(self) -> AbstractContextManager[Any]:
        """``timeout`` as an anyio deadline (none when ``timeout`` is None)."""
        return anyio.fail_after(self.timeout) if self.timeout is not None else nullcontext()

    def _why(self, error: BaseException, what: str) -> str:
        """What went wrong, as a clause about the server."""
        if isinstance(error, TimeoutError):
            return f"it did not {what} within timeout={self.timeout}s"
        return str(error)  # a ServerFault's clause ("it exited with code 3 ...")

    @asynccontextmanager
    async def _use(self) -> AsyncIterator[StdioConnection]:
        """The open connection, or one just for this use."""
        if self._connection is not None:
            yield self._connection
            return
        async with self._connect() as connection:
            yield connection

    async def tools(self) -> tuple[McpTool, ...]:
        """The server's tools (listed once, then kept)."""
        if self._tools is None:
            async with self._lock:
                if self._tools is None:
                    self._tools = await self._list_tools()
        return self._tools

    async def refresh_tools(self) -> tuple[McpTool, ...]:
        """List the server's tools again."""
        async with self._lock:
            self._tools = await self._list_tools()
        return self._tools

    async def _list_tools(self) -> tuple[McpTool, ...]:
        found: list[McpTool] = []
        opened = self._connection is not None
        try:
            with self._deadline():  # start-up (when not open) and every page, together
                await self._list_pages(found)
        except ServerFault as exc:
            raise McpError(
                f"{self.name}: listing the tools of {self.command!r} failed: {exc}"
            ) from exc
        except TimeoutError as exc:
            raise McpError(
                f"{self.name}: listing the tools of {self.command!r} failed: "
                + self._why(exc, "list its tools" if opened else "start and list its tools")
            ) from exc
        return tuple(found)

    async def _list_pages(self, found: list[McpTool]) -> None:
        async with self._use() as connection:
            cursor: str | None = None
            seen: set[str] = set()
            names: set[str] = set()
            while True:
                page = await connection.request(
                    "tools/list", None if cursor is None else {"cursor": cursor}
                )
                tools = page.get("tools")
                if not isinstance(tools, list):
                    raise ServerFault("it answered tools/list without a list of tools")
                if len(found) + len(tools) > self.max_tools:
                    raise McpError(
                        f"{self.name}: the MCP server {self.command!r} lists more than "
                        f"max_tools={self.max_tools} tools; raise max_tools to use them all"
                    )
                for remote in tools:
                    # The checks are CPU work: yield, so the loop runs and the deadline lands.
                    await anyio.lowlevel.checkpoint()
                    tool = await self._tool(remote, names)
                    if tool is not None:
                        found.append(tool)
                        names.add(tool.name)
                following = page.get("nextCursor")
                if not isinstance(following, str) or not following:
                    break
                if following in seen:  # pages in a circle would be listed for ever
                    raise ServerFault(f"it answered the cursor {following[:100]!r} a second time")
                seen.add(following)
                cursor = following

    async def _tool(self, remote: object, taken: set[str]) -> McpTool | None:
        """One tool of a ``tools/list`` page as a raf tool; ``None``, with a warning, when
        it is malformed, raf refuses its schema or its name is ``taken`` by a tool listed
        before it (only that tool: the others still work)."""
        named = remote.get("name") if isinstance(remote, dict) else None
        name = self.tool_prefix + (named if isinstance(named, str) else quote(named))
        problem = _tool_problem(remote)
        if problem is None and name in taken:
            # Two tools of one name fail every run (ToolConflictError): the first is kept.
            problem = "a tool of this name was listed before it"
        if problem is not None:
            tool = cut(name, _WARNED_CHARS)
            _log.warning("mcp.tool_skipped", provider=self.name, tool=tool, reason=problem)
            return None
        assert isinstance(remote, dict)  # what _tool_problem checked
        assert isinstance(named, str)
        schema: dict[str, Any] = remote["inputSchema"]
        try:
            validator = await _checked(name, schema)
        except ToolSchemaError as exc:
            # jsonschema's message quotes the schema's value (a list of 2,000 items, whole).
            reason = cut(str(exc), _WARNED_CHARS)
            _log.warning("mcp.tool_skipped", provider=self.name, tool=name, reason=reason)
            return None
        description = remote.get("description")
        return McpTool(name, description or "", schema, named, self, schema_validator=validator)

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run the server's tool ``name``; its content as text, or :class:`ToolError`."""
        try:
            async with self._use() as connection:
                with self._deadline():
                    result = await connection.request(
                        "tools/call", {"name": name, "arguments": dict(arguments)}
                    )
        except (ServerFault, TimeoutError) as exc:
            # The model reads this: the provider is named, not the command (a local path).
            raise McpError(
                f"{self.name}: the MCP server failed to run {quote(name)}: "
                + self._why(exc, "answer")
            ) from exc
        try:
            text = await _result_text(result)
        except RecursionError:  # structured content as deep as the stack has room for
            raise McpError(
                f"{self.name}: the MCP server answered {quote(name)} "
                "with a result nested too deeply to read"
            ) from None
        if result.get("isError") is True:
            raise ToolError(text or f"the MCP tool {name!r} failed without a message")
        return text

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """The server's tools."""
        tools = await self.tools()
        return ContextResult(tools=tools) if tools else ContextResult()


async def _checked(name: str, schema: dict[str, Any]) -> Any:
    """The validator of a listed tool's schema (:func:`build_validator`); a big schema is
    checked in a worker thread, the loop running meanwhile: jsonschema's check, pure Python,
    costs up to some 85 µs per item of a hostile schema (a list of 20,000 wrong types: 1.7 s),
    and a deadline cannot land inside it."""
    try:
        small = len(json.dumps(schema)) <= CHECK_INLINE_CHARS
    except RecursionError:  # too deep for this stack (a run inside many layers): a thread's
        small = False
    if small:
        return build_validator(name, schema)
    return await anyio.to_thread.run_sync(build_validator, name, schema, abandon_on_cancel=True)


def _tool_problem(remote: object) -> str | None:
    """What makes a listed tool unusable (before its schema is checked), or ``None``."""
    if not isinstance(remote, dict):
        return f"a tool must be an object, got {type(remote).__name__}"
    name = remote.get("name")
    if not isinstance(name, str) or not name:
        return f"its name must be a non-empty string, got {quote(name)}"
    if len(name) > MAX_NAME_CHARS:
        return f"its name is longer than {MAX_NAME_CHARS} characters ({len(name):,})"
    if not isinstance(remote.get("inputSchema"), dict):
        return f"its inputSchema must be an object, got {quote(remote.get('inputSchema'))}"
    description = remote.get("description")
    if description is not None and not isinstance(description, str):
        return f"its description must be a string, got {quote(description)}"
    return None


async def _result_text(result: Mapping[str, Any]) -> str:
    """The content blocks of a ``tools/call`` result as text; other media are named, not
    inlined; with no content, its structured content as JSON. The blocks are read in
    steps, the loop running between them (a million held it 0.5 s)."""
    parts: list[str] = []
    content = result.get("content")
    for index, block in enumerate(content if isinstance(content, list) else ()):
        if index % _BLOCKS_PER_STEP == _BLOCKS_PER_STEP - 1:
            await anyio.lowlevel.checkpoint()
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(_text(block.get("text")))
        elif kind == "resource":
            resource = block.get("resource")
            resource = resource if isinstance(resource, dict) else {}
            text = resource.get("text")
            parts.append(
                text if isinstance(text, str) else f"[resource {_text(resource.get('uri'))}]"
            )
        elif kind == "resource_link":
            parts.append(f"[resource link {_text(block.get('uri'))}]")
        else:
            kind = kind if isinstance(kind, str) and kind else "content"
            parts.append(f"[{kind}: {_text(block.get('mimeType'))}]".replace(": ]", "]"))
    structured = result.get("structuredContent")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, default=str))
    return "\n".join(parts)


#: How much of a server's value a warning quotes.
_WARNED_CHARS: Final = 500
#: A result's content blocks read per step.
_BLOCKS_PER_STEP: Final = 256


def _text(value: object) -> str:
    """A text field of a block: what it holds, or nothing when it is not a string."""
    return value if isinstance(value, str) else ""
