"""WorkspaceContextProvider: a folder the model can list, read and write, and never leave."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio.to_thread

from raf.builtin._paths import confined_path, display_path, os_error_text, read_confined_text
from raf.context import ContextResult
from raf.errors import ConfigError, PathError
from raf.messages import ChatMessage
from raf.options import AgentRunOptions
from raf.providers import ContextProvider
from raf.sessions.base import Session
from raf.tools import FunctionTool, tool

if TYPE_CHECKING:
    from raf.context import AgentLike

__all__ = ["WorkspaceContextProvider"]

#: Default size limit of one read or write, in bytes.
DEFAULT_MAX_BYTES = 1_000_000
#: How many entries ``list_files`` and the instructions show before "... and N more".
DEFAULT_LISTING_LIMIT = 200
_INSTRUCTIONS_LISTING = 30


class WorkspaceContextProvider(ContextProvider):
    """Give the model a folder: instructions describe it, tools read and write it.

    Tools: ``read_file(path)``, ``list_files(path=".")`` and, when
    ``writable``, ``write_file(path, content)``. Every path is taken relative
    to ``root`` and resolved; ``..``, absolute paths, NUL bytes and symlinks
    that lead outside ``root`` are refused with an error the model sees,
    which names only the path it gave. Reads and writes are limited to
    ``max_bytes``; writes are atomic (a temporary file renamed into place).

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
        name: str | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ConfigError(f"workspace root {str(root)!r} is not a directory")
        self.writable = writable
        self.max_bytes = max_bytes
        self.tools: tuple[FunctionTool, ...] = self._make_tools()

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """The workspace's description (with a short listing) and its tools."""
        listing = await anyio.to_thread.run_sync(self._listing, ".", _INSTRUCTIONS_LISTING)
        access = "read and write" if self.writable else "read (the workspace is read-only)"
        instructions = (
            f"You have a workspace folder named {self.root.name!r}. You can {access} files "
            "in it with the file tools; paths are relative to the workspace.\n"
            f"Top level of the workspace:\n{listing}"
        )
        return ContextResult(instructions=instructions, tools=self.tools)

    def _make_tools(self) -> tuple[FunctionTool, ...]:
        provider = self

        @tool(name="read_file")
        async def read_file(path: Annotated[str, "path relative to the workspace"]) -> str:
            """Read a UTF-8 text file of the workspace."""
            return await anyio.to_thread.run_sync(provider._read, path)

        @tool(name="write_file")
        async def write_file(
            path: Annotated[str, "path relative to the workspace"],
            content: Annotated[str, "the complete new content of the file"],
        ) -> str:
            """Create or replace a text file of the workspace (missing folders are created)."""
            return await anyio.to_thread.run_sync(provider._write, path, content)

        @tool(name="list_files")
        async def list_files(
            path: Annotated[str, "folder relative to the workspace"] = ".",
        ) -> str:
            """List a folder of the workspace; folders end with '/'."""
            return await anyio.to_thread.run_sync(provider._listing, path, DEFAULT_LISTING_LIMIT)

        if self.writable:
            return (read_file, write_file, list_files)
        return (read_file, list_files)

    # The methods below run in a worker thread.

    def _resolve(self, path: str) -> Path:
        return confined_path(self.root, path, where="the workspace")

    def _read(self, path: str) -> str:
        return read_confined_text(self.root, path, where="the workspace", max_bytes=self.max_bytes)

    def _write(self, path: str, content: str) -> str:
        if not self.writable:  # pragma: no cover - the tool is not offered then
            raise PathError("the workspace is read-only")
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:
            raise PathError(f"the content for {path!r} is not valid Unicode text") from None
        if len(data) > self.max_bytes:
            raise PathError(
                f"the content for {path!r} is {len(data)} bytes, more than the limit of "
                f"{self.max_bytes} bytes"
            )
        real = self._resolve(path)
        if real == self.root:
            raise PathError(f"{path!r} is the workspace folder itself, not a file")
        if real.is_dir():
            raise PathError(f"{path!r} is a folder; give a file path")
        try:
            real.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(real, data)
        except OSError as exc:
            raise PathError(f"cannot write {path!r}: {os_error_text(exc)}") from None
        return f"wrote {len(data)} bytes to {display_path(self.root, real)}"

    def _listing(self, path: str, limit: int) -> str:
        real = self._resolve(path) if path not in ("", ".") else self.root
        try:
            if not real.is_dir():
                if real.exists():
                    raise PathError(f"{path!r} is a file, not a folder; use read_file")
                raise PathError(f"there is no folder {path!r} in the workspace")
            entries = sorted(
                (entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
                for entry in os.scandir(real)
            )
        except OSError as exc:
            raise PathError(f"cannot list {path!r}: {os_error_text(exc)}") from None
        if not entries:
            return "(empty)"
        shown = entries[:limit]
        if len(entries) > limit:
            shown.append(f"... and {len(entries) - limit} more")
        return "\n".join(shown)


def _atomic_write(target: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``target``, then rename it over ``target``."""
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
