"""McpToolsProvider: the tools of an MCP server (over stdio) offered to the model."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import attrs

from raf._context import ContextResult
from raf._errors import ConfigError, McpError, ToolError, ToolSchemaError
from raf._log import log as _log
from raf._messages import ChatMessage
from raf._options import AgentRunOptions
from raf._providers import ContextProvider
from raf._sessions.base import Session
from raf._tools import check_tool_schema

if TYPE_CHECKING:
    from raf._context import AgentLike

__all__ = ["McpToolsProvider"]

_MISSING = (
    "McpToolsProvider needs the optional 'mcp' package; install it with: pip install 'raf[mcp]'"
)


def _require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ConfigError(_MISSING) from exc


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

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Call the tool on the server; a result flagged as an error raises :class:`ToolError`."""
        return await self.provider.call_tool(self.remote_name, arguments)


class McpToolsProvider(ContextProvider):
    """The tools of an MCP server started as ``command args...`` and spoken to over stdio.

    The server's tools are listed on first use and offered to the model on
    every run (``tool_prefix`` is put in front of each name, to keep them
    apart from other tools). Needs the optional ``mcp`` package
    (``pip install 'raf[mcp]'``).

    Two ways to run it:

    * ``async with McpToolsProvider(...) as mcp:`` keeps one server process
      for the whole block; every run and tool call inside it uses it. This
      is the way for anything but a one-off run.
    * Without ``async with``, each use starts the server, does its work
      (list the tools, or call one) and stops it: slower, but nothing to
      manage, and nothing outlives the call.
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
    ) -> None:
        _require_mcp()
        if not isinstance(command, str) or not command:
            raise ValueError(f"command must be a non-empty str, got {command!r}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"args must be a list of str, got {args!r}")
        if name is not None:
            self.name = name
        self.command = command
        self.args = tuple(args)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.tool_prefix = tool_prefix
        self.timeout = timeout
        self.errlog = errlog
        self._tools: tuple[McpTool, ...] | None = None
        self._session: Any = None
        self._exit_stack: AsyncExitStack | None = None
        self._lock = anyio.Lock()

    async def __aenter__(self) -> McpToolsProvider:
        if self._exit_stack is not None:
            raise RuntimeError(f"{self.name}: the MCP connection is already open")
        stack = AsyncExitStack()
        try:
            self._session = await stack.enter_async_context(self._connect())
        except BaseException:
            await stack.aclose()
            raise
        self._exit_stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        stack, self._exit_stack, self._session = self._exit_stack, None, None
        if stack is not None:
            await stack.aclose()

    @asynccontextmanager
    async def _connect(self) -> AsyncIterator[Any]:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        parameters = StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=self.env,
            cwd=os.fspath(self.cwd) if self.cwd is not None else None,
        )
        started = False
        try:
            async with (
                stdio_client(parameters, errlog=self.errlog or sys.stderr) as (read, write),
                ClientSession(read, write) as session,
            ):
                with self._deadline():
                    await session.initialize()
                started = True
                yield session
        except OSError as exc:
            if started:
                raise
            raise McpError(
                f"{self.name}: cannot start the MCP server {self.command!r}: {exc.strerror or exc}"
            ) from exc
        except Exception as exc:
            # The SDK's task groups wrap a server that exits or never answers in exception
            # groups; errors of the work done once it started are reported by that work.
            if started or isinstance(exc, McpError):
                raise
            why = self._why(exc, "answer the initialize request")
            if not isinstance(_leaf(exc), TimeoutError):
                why += " (did it exit? its stderr shows why)"
            raise McpError(
                f"{self.name}: the MCP server {self.command!r} did not start: {why}"
            ) from exc

    def _deadline(self) -> AbstractContextManager[Any]:
        """``timeout`` as an anyio deadline (none when ``timeout`` is None)."""
        return anyio.fail_after(self.timeout) if self.timeout is not None else nullcontext()

    def _why(self, error: BaseException, what: str) -> str:
        if isinstance(_leaf(error), TimeoutError):
            return f"it did not {what} within timeout={self.timeout}s"
        return _innermost(error)

    @asynccontextmanager
    async def _use(self) -> AsyncIterator[Any]:
        """The open session, or a connection just for this use."""
        if self._session is not None:
            yield self._session
            return
        async with self._connect() as session:
            yield session

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
        opened = self._session is not None
        try:
            with self._deadline():  # start-up (when not open) and every page, together
                await self._list_pages(found)
        except (McpError, ToolError):
            raise
        except Exception as exc:
            raise McpError(
                f"{self.name}: listing the tools of {self.command!r} failed: "
                + self._why(exc, "list its tools" if opened else "start and list its tools")
            ) from exc
        return tuple(found)

    async def _list_pages(self, found: list[McpTool]) -> None:
        from mcp.types import PaginatedRequestParams

        async with self._use() as session:
            result = await session.list_tools()
            while True:
                for remote in result.tools:
                    name = self.tool_prefix + remote.name
                    schema = dict(remote.input_schema or {"type": "object"})
                    try:
                        check_tool_schema(name, schema)
                    except ToolSchemaError as exc:
                        # Refused where it is found, and only that tool: the others still work.
                        _log.warning(
                            "mcp.tool_skipped", provider=self.name, tool=name, reason=str(exc)
                        )
                        continue
                    found.append(McpTool(name, remote.description or "", schema, remote.name, self))
                if not result.next_cursor:
                    break
                result = await session.list_tools(
                    params=PaginatedRequestParams(cursor=result.next_cursor)
                )

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Run the server's tool ``name``; its content as text, or :class:`ToolError`."""
        try:
            async with self._use() as session:
                result = await session.call_tool(
                    name, dict(arguments), read_timeout_seconds=self.timeout
                )
        except McpError:
            raise
        except Exception as exc:
            raise McpError(f"the MCP server failed to run {name!r}: {_innermost(exc)}") from exc
        text = _result_text(result)
        if result.is_error:
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


def _leaf(error: BaseException) -> BaseException:
    """The first leaf of nested exception groups (the SDK wraps errors)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _innermost(error: BaseException) -> str:
    """The type and message of the first leaf of nested exception groups."""
    error = _leaf(error)
    return f"{type(error).__name__}: {error}"


def _result_text(result: Any) -> str:
    """The content blocks of a tool result as text; other media are named, not inlined."""
    import json

    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(f"[{kind or 'content'}: {getattr(block, 'mime_type', '')}]".strip())
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)
