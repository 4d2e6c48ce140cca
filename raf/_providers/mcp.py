"""McpToolsProvider: the tools of an MCP server (over stdio) offered to the model."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager, nullcontext
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TextIO

import anyio
import anyio.lowlevel
import attrs

from raf._agent.tools import build_validator
from raf._log import log as _log
from raf._onion.compose import ContextProvider
from raf._sessions.base import Session
from raf._values.context import ContextResult
from raf._values.messages import ChatMessage
from raf._values.options import AgentRunOptions
from raf.errors import ConfigError, McpError, ToolError, ToolSchemaError

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__ = ["McpToolsProvider"]

#: The most tools a server may list: a model cannot use thousands anyway, and each
#: costs a schema check (about 0.75 ms).
DEFAULT_MAX_TOOLS: Final = 1000

_MISSING = (
    "McpToolsProvider needs the optional 'mcp' package; install it with: "
    "pip install 'raf-agents[mcp]'"
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
    #: The jsonschema validator of ``parameters``, built when the server listed the tool.
    schema_validator: Any = attrs.field(default=None, kw_only=True, repr=False, eq=False)

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Call the tool on the server; a result flagged as an error raises :class:`ToolError`."""
        return await self.provider.call_tool(self.remote_name, arguments)


class McpToolsProvider(ContextProvider):
    """The tools of an MCP server started as ``command args...`` and spoken to over stdio.

    The server's tools are listed on first use and offered to the model on
    every run (``tool_prefix`` is put in front of each name, to keep them
    apart from other tools). Needs the optional ``mcp`` package
    (``pip install 'raf-agents[mcp]'``).

    Two ways to run it:

    * ``async with McpToolsProvider(...) as mcp:`` keeps one server process
      for the whole block; every run and tool call inside it uses it. This
      is the way for anything but a one-off run.
    * Without ``async with``, each use starts the server, does its work
      (list the tools, or call one) and stops it: slower, but nothing to
      manage, and nothing outlives the call.

    ``timeout`` bounds starting the server, listing its tools (every page
    and every schema check together) and each tool call. A server that
    lists more than ``max_tools`` tools is an :class:`raf.errors.McpError`; a tool
    whose schema the MCP SDK or raf refuses is left out (warning
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
    ) -> None:
        _require_mcp()
        if type(max_tools) is not int or max_tools < 1:
            raise ValueError(f"max_tools must be an int >= 1, got {max_tools!r}")
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
        self.max_tools = max_tools
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
            params: PaginatedRequestParams | None = None
            while True:
                tools, cursor = await self._list_page(session, params)
                if len(found) + len(tools) > self.max_tools:
                    raise McpError(
                        f"{self.name}: the MCP server {self.command!r} lists more than "
                        f"max_tools={self.max_tools} tools; raise max_tools to use them all"
                    )
                for remote in tools:
                    # The checks are CPU work: yield, so the loop runs and the deadline lands.
                    await anyio.lowlevel.checkpoint()
                    tool = self._tool(remote)
                    if tool is not None:
                        found.append(tool)
                if not cursor:
                    break
                params = PaginatedRequestParams(cursor=cursor)

    async def _list_page(self, session: Any, params: Any) -> tuple[list[Any], str | None]:
        """One page of ``tools/list``: the SDK's tools, or, when the SDK refuses the page
        for one bad tool, each raw tool as it is (checked one by one in :meth:`_tool`)."""
        import pydantic

        try:
            result = await session.list_tools(params=params)
        except pydantic.ValidationError:
            # The SDK checks the whole page against the protocol's schema, in every path
            # of its public API: ask again through its dispatcher, the raw reply.
            send_raw = getattr(getattr(session, "_dispatcher", None), "send_raw_request", None)
            if send_raw is None:
                raise
            data = None if params is None else params.model_dump(by_alias=True, exclude_none=True)
            raw = await send_raw("tools/list", data, {})
            tools = raw.get("tools") if isinstance(raw, dict) else None
            if not isinstance(tools, list):
                raise
            cursor = raw.get("nextCursor")
            return tools, cursor if isinstance(cursor, str) else None
        return list(result.tools), result.next_cursor

    def _tool(self, remote: Any) -> McpTool | None:
        """``remote`` (an SDK tool, or a raw one the SDK refused) as a raf tool; ``None``,
        with a warning, when the SDK or raf refuses its schema."""
        import pydantic
        from mcp.types import Tool as SdkTool

        if not isinstance(remote, SdkTool):
            try:
                remote = SdkTool.model_validate(remote)
            except pydantic.ValidationError as exc:
                named = remote.get("name") if isinstance(remote, dict) else None
                name = self.tool_prefix + (named if isinstance(named, str) else repr(named))
                problem = exc.errors()[0]
                where = ".".join(str(part) for part in problem["loc"])
                _log.warning(
                    "mcp.tool_skipped",
                    provider=self.name,
                    tool=name,
                    reason=f"the MCP SDK refused it: at {where}: {problem['msg']}",
                )
                return None
        name = self.tool_prefix + remote.name
        schema = dict(remote.input_schema or {"type": "object"})
        try:
            validator = build_validator(name, schema)
        except ToolSchemaError as exc:
            # Refused where it is found, and only that tool: the others still work.
            _log.warning("mcp.tool_skipped", provider=self.name, tool=name, reason=str(exc))
            return None
        return McpTool(
            name, remote.description or "", schema, remote.name, self, schema_validator=validator
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
