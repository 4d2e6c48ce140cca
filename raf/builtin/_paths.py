"""Resolve a path a model gave inside a root folder, or refuse it without leaking where root is."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from raf.errors import PathError

__all__ = ["confined_path", "display_path", "os_error_text", "read_confined_text"]


def confined_path(root: Path, path: str, *, where: str) -> Path:
    """The real path of ``path`` inside ``root`` (which must already be resolved).

    Refuses NUL bytes, empty paths, absolute paths, ``..`` components and
    anything that, once symlinks are followed, lies outside ``root``. The
    error names only the path as given, never ``root`` or a symlink's target.
    ``where`` names the folder in messages ("the workspace", "skill 'x'").
    """
    if not isinstance(path, str):
        raise PathError(f"the path must be a string, got {type(path).__name__}")
    if "\x00" in path:
        raise PathError(f"the path {_shown(path)} contains a NUL byte")
    if not path.strip():
        raise PathError("the path is empty")
    if (
        PurePosixPath(path).is_absolute()
        or PureWindowsPath(path).is_absolute()
        or (PureWindowsPath(path).drive)
    ):
        raise PathError(f"the path {_shown(path)} is absolute; give a path relative to {where}")
    parts = PurePosixPath(path.replace("\\", "/")).parts
    if ".." in parts:
        raise PathError(f"the path {_shown(path)} uses '..'; paths must stay inside {where}")
    try:
        real = (root / path).resolve(strict=False)
    except (OSError, RuntimeError, ValueError):  # symlink loops, names the OS refuses
        raise PathError(f"the path {_shown(path)} cannot be resolved") from None
    if real != root and not real.is_relative_to(root):
        raise PathError(f"the path {_shown(path)} leads outside {where}")
    return real


def read_confined_text(root: Path, path: str, *, where: str, max_bytes: int) -> str:
    """The UTF-8 text of the file ``path`` inside ``root``, at most ``max_bytes`` long.

    Blocking: call it in a worker thread. Every refusal is a
    :class:`PathError` that names ``path`` as given.
    """
    real = confined_path(root, path, where=where)
    try:
        info = real.stat()
        if stat.S_ISDIR(info.st_mode):
            raise PathError(f"{path!r} is a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise PathError(f"{path!r} is not a regular file")
        if info.st_size > max_bytes:
            raise PathError(
                f"{path!r} is {info.st_size} bytes, more than the limit of {max_bytes} bytes"
            )
        # O_NOFOLLOW: if the last component became a symlink after the check
        # above, refuse rather than follow it.
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise PathError(f"there is no file {path!r} in {where}") from None
    except OSError as exc:
        raise PathError(f"cannot read {path!r}: {os_error_text(exc)}") from None
    if len(data) > max_bytes:
        raise PathError(f"{path!r} is larger than the limit of {max_bytes} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PathError(f"{path!r} is not UTF-8 text") from None


def display_path(root: Path, real: Path) -> str:
    """``real`` relative to ``root``, POSIX style; ``"."`` for root itself."""
    relative = real.relative_to(root)
    return relative.as_posix() if relative.parts else "."


def os_error_text(error: OSError) -> str:
    """An OS error's reason without the absolute file names it carries."""
    return error.strerror or type(error).__name__


def _shown(path: str) -> str:
    text = path.replace("\x00", "\\0")
    if len(text) > 200:
        text = text[:197] + "..."
    return repr(text)
