"""WorkspaceContextProvider: a folder the model can list, read and write, and never leave."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import anyio.to_thread

from raf._agent.tools import FunctionTool, tool
from raf._onion.compose import ContextProvider
from raf._providers._paths import Sandbox, checked_root, shown
from raf._sessions.base import Session
from raf._values.context import ContextResult
from raf._values.messages import ChatMessage
from raf._values.options import AgentRunOptions
from raf.errors import PathError

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__ = ["WorkspaceContextProvider"]

#: Default size limit of one read or write, in bytes.
DEFAULT_MAX_BYTES = 1_000_000
#: How many entries ``list_files`` and the instructions show before "... and N more".
DEFAULT_LISTING_LIMIT = 200
_INSTRUCTIONS_LISTING = 30


class WorkspaceContextProvider(ContextProvider):
    """Give the model a folder: instructions describe it, tools read and write it.

    Tools: ``read_file(path)``, ``list_files(path=".")`` and, when
    ``writable``, ``write_file(path, content)``, each name preceded by
    ``tool_prefix`` (so two workspaces can serve one agent). Every path is
    relative to ``root`` and walked one name at a time from an open
    descriptor of ``root`` (see ``docs/providers/workspace.md``): ``..``,
    absolute paths, NUL bytes, symlinks that lead outside ``root``, special
    files and files with more than one hard link are refused with an error
    the model sees, which names only the path it gave. Reads and writes are
    limited to ``max_bytes``; writes are atomic (a temporary file renamed
    into place). POSIX only: elsewhere building one is a :class:`ConfigError`.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     [t.name for t in WorkspaceContextProvider(folder).tools]
    ['read_file', 'write_file', 'list_files']
    """

    kind = "workspace"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        writable: bool = True,
        max_bytes: int = DEFAULT_MAX_BYTES,
        tool_prefix: str = "",
        name: str | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        self.root = checked_root(
            "WorkspaceContextProvider", "workspace root", root, max_bytes, tool_prefix
        )
        self.writable = writable
        self.max_bytes = max_bytes
        self.tool_prefix = tool_prefix
        self._sandbox = Sandbox(self.root, "the workspace", given=root)
        self.tools: tuple[FunctionTool, ...] = self._make_tools()

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """The workspace's description (with a short listing) and its tools."""
        listing = await anyio.to_thread.run_sync(
            self._listing, ".", _INSTRUCTIONS_LISTING, abandon_on_cancel=True
        )
        access = "read and write" if self.writable else "read (the workspace is read-only)"
        names = ", ".join(t.name for t in self.tools)
        instructions = (
            f"You have a workspace folder named {self.root.name!r}. You can {access} files "
            f"in it with the tools {names}; paths are relative to the workspace.\n"
            f"Top level of the workspace:\n{listing}"
        )
        return ContextResult(instructions=instructions, tools=self.tools)

    def _make_tools(self) -> tuple[FunctionTool, ...]:
        provider = self

        @tool(name=f"{self.tool_prefix}read_file")
        async def read_file(path: Annotated[str, "path relative to the workspace"]) -> str:
            """Read a UTF-8 text file of the workspace."""
            return await anyio.to_thread.run_sync(provider._read, path, abandon_on_cancel=True)

        @tool(name=f"{self.tool_prefix}write_file")
        async def write_file(
            path: Annotated[str, "path relative to the workspace"],
            content: Annotated[str, "the complete new content of the file"],
        ) -> str:
            """Create or replace a text file of the workspace (missing folders are created)."""
            return await anyio.to_thread.run_sync(
                provider._write, path, content, abandon_on_cancel=True
            )

        @tool(name=f"{self.tool_prefix}list_files")
        async def list_files(
            path: Annotated[str, "folder relative to the workspace"] = ".",
        ) -> str:
            """List a folder of the workspace; folders end with '/'."""
            return await anyio.to_thread.run_sync(
                provider._listing, path, DEFAULT_LISTING_LIMIT, abandon_on_cancel=True
            )

        if self.writable:
            return (read_file, write_file, list_files)
        return (read_file, list_files)

    # The methods below run in a worker thread.

    def _read(self, path: str) -> str:
        where = "the workspace"
        names = self._sandbox.split(path, where)
        label = shown(path)
        _, data = self._sandbox.read(names, label=label, where=where, max_bytes=self.max_bytes)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise PathError(f"{label} is not UTF-8 text") from None

    def _write(self, path: str, content: str) -> str:
        if not self.writable:  # pragma: no cover - the tool is not offered then
            raise PathError("the workspace is read-only")
        where = "the workspace"
        names = self._sandbox.split(path, where)
        label = shown(path)
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise PathError(f"the content for {label} is not valid Unicode text") from None
        if len(data) > self.max_bytes:
            raise PathError(
                f"the content for {label} is {len(data)} bytes, more than the limit of "
                f"{self.max_bytes} bytes"
            )
        written = self._sandbox.write(names, data, label=label, where=where)
        return f"wrote {len(data)} bytes to {written}"

    def _listing(self, path: str, limit: int) -> str:
        names = self._sandbox.split(path, "the workspace", allow_root=True)
        entries = self._sandbox.listing(names, label=shown(path), where="the workspace")
        if not entries:
            return "(empty)"
        shown_entries = entries[:limit]
        if len(entries) > limit:
            shown_entries.append(f"... and {len(entries) - limit} more")
        return "\n".join(shown_entries)
