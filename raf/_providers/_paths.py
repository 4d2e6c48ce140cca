"""Files beneath a root folder, reached only through descriptors opened from the root.

A path a model gives is never handed to the OS whole. It is walked one
name at a time from an open descriptor of the root: each folder is opened
with ``O_NOFOLLOW | O_DIRECTORY`` relative to the folder before it, the file
with ``O_NOFOLLOW`` relative to its folder, listings read the open folder
and writes rename inside it. So nothing is checked apart from its use: a
folder swapped for a symlink between two steps is met as a symlink by the
next ``open`` itself. Symlinks met on the way are followed by hand, and only
while they stay beneath the root (a ``..`` in a target may climb back to the
root, never above it; an absolute target counts when it names a place beneath
the root), much as Linux's ``openat2(RESOLVE_BENEATH)`` does.

Every refusal is a :class:`PathError` that names the path as the model gave
it, never the root's absolute location or a symlink's target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections import deque
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Literal

from raf.errors import ConfigError, PathError

__all__: list[str] = []

#: Symlinks followed in one path before it is refused, as Linux's own limit.
_MAX_SYMLINKS = 40
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a FIFO met where a folder or a file was expected opens at once
# instead of waiting for a writer; it is then refused for what it is.
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW | _NONBLOCK | _CLOEXEC
_FILE_FLAGS = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC


def require_dir_fd(what: str) -> None:
    """Refuse to build ``what`` where the OS cannot open files relative to a folder."""
    needed = (os.open, os.stat, os.mkdir, os.rename, os.unlink, os.readlink)
    if (
        not all(f in os.supports_dir_fd for f in needed)
        or os.stat not in os.supports_follow_symlinks
        or not hasattr(os, "O_NOFOLLOW")
        or not hasattr(os, "O_DIRECTORY")
    ):
        raise ConfigError(
            f"{what} needs a POSIX system that opens files relative to a folder "
            "(os.open with dir_fd and O_NOFOLLOW); this one cannot confine paths safely"
        )


def checked_root(
    owner: str, what: str, root: str | os.PathLike[str], max_bytes: object, tool_prefix: object
) -> Path:
    """The folder a file-tool provider (``owner``) is confined to, resolved, with the
    options every such provider takes checked: a ``ConfigError`` when ``root`` is not a
    folder (``what`` names it), a ``ValueError`` / ``TypeError`` for the others."""
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
    if not isinstance(tool_prefix, str):
        raise TypeError(f"tool_prefix must be a str, got {type(tool_prefix).__name__}")
    require_dir_fd(owner)
    resolved = Path(root).resolve()
    if not resolved.is_dir():
        raise ConfigError(f"{what} {str(root)!r} is not a directory")
    return resolved


def shown(path: str) -> str:
    """``path`` quoted for a message: NUL bytes visible, at most about 200 characters."""
    text = path.replace("\x00", "\\0")
    if len(text) > 200:
        text = text[:197] + "..."
    return repr(text)


def lone_surrogate(text: str) -> str | None:
    """The first lone surrogate of ``text`` (``"U+D800 at 3"``), or ``None`` when it is
    text UTF-8 can encode (JSON's ``"\\ud800"`` escapes make such strings)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"U+{ord(text[exc.start]):04X} at {exc.start}"
    return None


def _reason(error: OSError) -> str:
    """An OS error's reason without the absolute file names it carries."""
    return error.strerror or type(error).__name__


def read_regular(dir_fd: int, name: str, *, max_bytes: int, label: str, where: str) -> bytes:
    """The bytes of the regular file ``name`` in the open folder ``dir_fd``.

    Refuses (:class:`PathError`, naming ``label``) a symlink, a folder, a
    FIFO, a device or a socket, a file with more than one hard link (another
    link may lie outside the root: the sandbox cannot tell), and a file over
    ``max_bytes``; reads at most ``max_bytes + 1`` bytes whatever the file
    claims its size is. Never blocks on a special file.
    """
    try:
        # A first look by name, so a special file is not even opened (opening
        # some devices has effects); the fstat after the open is what counts.
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        _check_regular(before, label, max_bytes)
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise PathError(f"there is no file {label} in {where}") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # became a symlink since the look above
            raise PathError(f"{label} changed while it was being read; try again") from None
        raise PathError(f"cannot read {label}: {_reason(exc)}") from None
    try:
        info = os.fstat(fd)
        _check_regular(info, label, max_bytes)
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise PathError(f"cannot read {label}: {_reason(exc)}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise PathError(f"{label} is larger than the limit of {max_bytes} bytes")
    return data


def _check_regular(info: os.stat_result, label: str, max_bytes: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise PathError(f"{label} is a folder, not a file")
    if stat.S_ISLNK(info.st_mode):  # only a file that became a symlink since it was resolved
        raise PathError(f"{label} changed while it was being read; try again")
    if not stat.S_ISREG(info.st_mode):
        raise PathError(f"{label} is not a regular file")
    if info.st_nlink > 1:
        raise PathError(
            f"{label} has {info.st_nlink} hard links; a file with more than one is not read, "
            "since another link to it may lie outside the folder"
        )
    if info.st_size > max_bytes:
        raise PathError(
            f"{label} is {info.st_size} bytes, more than the limit of {max_bytes} bytes"
        )


_Last = Literal["folder", "file", "entry"]


class _Walk:
    """The folders opened so far, root first; each was opened from the one before it."""

    def __init__(self, root_fd: int) -> None:
        self.fds = [root_fd]
        self.names: list[str] = []

    @property
    def top(self) -> int:
        return self.fds[-1]

    def push(self, fd: int, name: str) -> None:
        self.fds.append(fd)
        self.names.append(name)

    def up(self) -> bool:
        """Go to the parent folder; ``False`` at the root."""
        if len(self.fds) == 1:
            return False
        os.close(self.fds.pop())
        self.names.pop()
        return True

    def to_root(self) -> None:
        while self.up():
            pass

    def close_all_but_top(self) -> int:
        """Close every folder but the last, which the caller now owns."""
        top = self.fds.pop()
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        return top

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class Sandbox:
    """A root folder and the blocking file operations confined beneath it.

    ``root`` must be resolved. ``boundary`` names the root in messages ("the
    workspace", "the skills folder"). Call the methods in a worker thread.
    """

    def __init__(self, root: Path, boundary: str, *, given: str | os.PathLike[str] = "") -> None:
        self.root = root
        self.boundary = boundary
        # The absolute spellings of root that an absolute symlink target may start with.
        spellings = {str(root)}
        if given:
            spellings.add(os.path.normpath(os.path.abspath(given)))
        self._spellings = tuple(sorted(spellings, key=len, reverse=True))

    # -- the model's path ---------------------------------------------------

    def split(self, path: object, where: str, *, allow_root: bool = False) -> tuple[str, ...]:
        """The names of ``path``, or a refusal of a path that is not relative and plain.

        Refuses non-strings, NUL bytes, lone surrogates, empty paths, absolute
        paths and ``..``;
        ``.`` and empty names are dropped. ``where`` says what the path is
        relative to in messages. The root itself (``()``) only with ``allow_root``.
        """
        if not isinstance(path, str):
            raise PathError(f"the path must be a string, got {type(path).__name__}")
        if "\x00" in path:
            raise PathError(f"the path {shown(path)} contains a NUL byte")
        surrogate = lone_surrogate(path)
        if surrogate is not None:
            raise PathError(
                f"the path {shown(path)} holds a lone surrogate ({surrogate}), "
                "which is not text a file name can have"
            )
        if not path.strip():
            if allow_root:
                return ()
            raise PathError("the path is empty")
        windows = PureWindowsPath(path)
        if PurePosixPath(path).is_absolute() or windows.is_absolute() or windows.drive:
            raise PathError(f"the path {shown(path)} is absolute; give a path relative to {where}")
        if ".." in PurePosixPath(path.replace("\\", "/")).parts:
            raise PathError(f"the path {shown(path)} uses '..'; paths must stay inside {where}")
        names = tuple(name for name in path.split("/") if name not in ("", "."))
        if not names and not allow_root:
            raise PathError(f"the path {shown(path)} is {where} itself, not a file")
        return names

    # -- the three operations -----------------------------------------------

    def read(
        self, names: tuple[str, ...], *, label: str, where: str, max_bytes: int
    ) -> tuple[str, bytes]:
        """The path beneath the root that ``names`` lead to, and the bytes of that file."""
        walk, name = self._walk(names, "file", label=label, where=where, verb="read")
        try:
            data = read_regular(walk.top, name, max_bytes=max_bytes, label=label, where=where)
            return "/".join([*walk.names, name]), data
        finally:
            walk.close()

    def listing(self, names: tuple[str, ...], *, label: str, where: str) -> list[str]:
        """The entries of a folder, sorted, folders (not symlinks to them) ending in ``/``."""
        fd = self.open_folder(names, label=label, where=where, verb="list")
        try:
            with os.scandir(fd) as entries:
                return sorted(
                    entry.name + ("/" if entry.is_dir(follow_symlinks=False) else "")
                    for entry in entries
                )
        except OSError as exc:
            raise PathError(f"cannot list {label}: {_reason(exc)}") from None
        finally:
            os.close(fd)

    def write(self, names: tuple[str, ...], data: bytes, *, label: str, where: str) -> str:
        """Replace the file ``names`` lead to with ``data``, atomically; its path beneath root.

        Missing folders are created. The bytes go to a temporary file made in
        the target's own open folder and renamed over the target within it,
        so neither can land outside the root; on any failure the temporary
        file is removed. An existing file keeps its permission bits.
        """
        walk, name = self._walk(names, "entry", label=label, where=where, verb="write")
        try:
            parent = walk.top
            try:
                info: os.stat_result | None = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                info = None
            except OSError as exc:
                raise PathError(f"cannot write {label}: {_reason(exc)}") from None
            if info is not None and stat.S_ISDIR(info.st_mode):
                raise PathError(f"{label} is a folder; give a file path")
            mode = stat.S_IMODE(info.st_mode) if info and stat.S_ISREG(info.st_mode) else 0o644
            try:
                _replace(parent, name, data, mode)
            except OSError as exc:
                raise PathError(f"cannot write {label}: {_reason(exc)}") from None
            return "/".join([*walk.names, name])
        finally:
            walk.close()

    def open_folder(self, names: tuple[str, ...], *, label: str, where: str, verb: str) -> int:
        """A descriptor of the folder ``names`` lead to (the caller closes it)."""
        walk, _ = self._walk(names, "folder", label=label, where=where, verb=verb)
        return walk.close_all_but_top()

    # -- the walk -------------------------------------------------------------

    def _open_root(self) -> int:
        # The root's own parents are trusted (they are outside what the
        # sandbox guards); the root itself must still be a real folder.
        try:
            return os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise PathError(f"{self.boundary} cannot be opened: {_reason(exc)}") from None

    def _walk(
        self, names: tuple[str, ...], last: _Last, *, label: str, where: str, verb: str
    ) -> tuple[_Walk, str]:
        """Open the folders of ``names`` from the root, following symlinks beneath it.

        For ``last == "folder"`` every name is a folder and the result's name
        is ``""``; otherwise the last name is returned unopened, with the
        walk standing in its folder (for ``"file"`` it is not a symlink at
        the time of the walk; for ``"entry"`` it may be missing, and missing
        folders on the way are created).
        """
        walk = _Walk(self._open_root())
        try:
            name = self._walk_from(walk, deque(names), last, label, where, verb)
        except BaseException:
            walk.close()
            raise
        return walk, name

    def _walk_from(
        self, walk: _Walk, todo: deque[str], last: _Last, label: str, where: str, verb: str
    ) -> str:
        turns = 0  # symlinks followed and names looked at again: bounded

        def again(name: str, why: str) -> None:
            """Look at ``name`` once more, unless that happened too often already."""
            nonlocal turns
            turns += 1
            if turns > _MAX_SYMLINKS:
                raise PathError(f"cannot {verb} {label}: {why}")
            todo.appendleft(name)

        def follow(name: str) -> bool:
            """Put the target of the symlink ``name`` in front of ``todo``; ``False`` if none."""
            nonlocal turns
            try:
                target = os.readlink(name, dir_fd=walk.top)
            except OSError:
                return False  # not a symlink (any more): the caller looks again
            turns += 1
            if turns > _MAX_SYMLINKS:
                raise PathError(f"cannot {verb} {label}: too many levels of symbolic links")
            if os.path.isabs(target):
                inside = self._beneath(target)
                if inside is None:
                    raise PathError(f"the path {label} leads outside {self.boundary}")
                walk.to_root()
                todo.extendleft(reversed(inside))
            else:
                todo.extendleft(reversed(target.split("/")))
            return True

        while todo:
            name = todo.popleft()
            if name in ("", "."):
                continue
            if name == "..":  # only a symlink's target puts one here
                if not walk.up():
                    raise PathError(f"the path {label} leads outside {self.boundary}")
                continue
            if not todo and last != "folder":
                try:
                    info = os.stat(name, dir_fd=walk.top, follow_symlinks=False)
                except FileNotFoundError:
                    if last == "entry":
                        return name
                    raise PathError(f"there is no file {label} in {where}") from None
                except OSError as exc:
                    raise PathError(f"cannot {verb} {label}: {_reason(exc)}") from None
                if stat.S_ISLNK(info.st_mode):
                    if not follow(name):
                        again(name, "it keeps changing")  # a symlink no more: look again
                    continue
                return name
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=walk.top)
            except FileNotFoundError:
                if last == "entry":
                    try:
                        os.mkdir(name, 0o777, dir_fd=walk.top)
                    except FileExistsError:
                        pass  # made by someone else meanwhile: open whatever it is
                    except OSError as exc:
                        raise PathError(f"cannot {verb} {label}: {_reason(exc)}") from None
                    again(name, "its folders keep changing")
                    continue
                kind = "folder" if last == "folder" else "file"
                raise PathError(f"there is no {kind} {label} in {where}") from None
            except OSError as exc:
                # ELOOP (or EMLINK, ENOTDIR elsewhere) for a symlink under O_NOFOLLOW
                if follow(name):
                    continue
                if exc.errno == errno.ENOTDIR:
                    if last == "folder" and not todo:
                        raise PathError(f"{label} is a file, not a folder") from None
                    raise PathError(f"cannot {verb} {label}: {_reason(exc)}") from None
                if exc.errno in (errno.ELOOP, errno.EMLINK):  # it was a symlink a moment ago
                    again(name, "it keeps changing")
                    continue
                raise PathError(f"cannot {verb} {label}: {_reason(exc)}") from None
            walk.push(fd, name)
        if last != "folder":  # a symlink led back to the root itself
            raise PathError(f"{label} is a folder, not a file")
        return ""

    def _beneath(self, target: str) -> list[str] | None:
        """The names of an absolute symlink target below the root, or ``None``."""
        normal = os.path.normpath(target)
        for spelling in self._spellings:
            if normal == spelling:
                return []
            if normal.startswith(spelling.rstrip("/") + "/"):
                return normal[len(spelling.rstrip("/")) + 1 :].split("/")
        return None


def _replace(parent: int, name: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a new temporary file in ``parent``, then rename it to ``name``."""
    # A short fixed-size name: a target near the longest allowed name still gets one.
    temp = f".raf-{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=parent)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=parent)
        raise
