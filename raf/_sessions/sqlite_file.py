"""Opening a session store's SQLite file: the schema, the checks of its soundness, error codes."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Final
from urllib.parse import quote

from raf.errors import SessionStoreError

__all__: list[str] = []

#: Written to ``raf_meta`` when a store is created; a file without it is not ours.
SCHEMA: Final = "raf.sessions/1"

_TABLES: Final = "SELECT name FROM sqlite_master WHERE type = 'table'"
_CREATE: Final = """
CREATE TABLE raf_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE raf_sessions (id TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE raf_messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX raf_messages_by_session ON raf_messages (session_id, seq);
CREATE TABLE raf_request_hashes (
    session_id TEXT NOT NULL,
    hash TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (session_id, hash)
);
"""

# SQLite's primary result codes (the low byte of an extended code).
_BUSY: Final = 5
_READONLY: Final = 8
_CORRUPT: Final = 11
_CANTOPEN: Final = 14
_NOTADB: Final = 26

#: SQLite's own busy wait, per attempt: between attempts the worker thread checks whether
#: its caller is still waiting and within its deadline, which SQLite's wait cannot do.
_BUSY_SLICE: Final = 0.05

#: What a problem list from ``PRAGMA quick_check`` may say in an error, at most.
_PROBLEMS_SHOWN: Final = 3


def _code(exc: sqlite3.Error) -> int:
    """The primary SQLite result code of an error (-1 when sqlite3 did not say)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else -1


def _connect(
    path: str | Path, *, read_only: bool = False, immutable: bool = False
) -> sqlite3.Connection:
    if path == ":memory:":
        target, uri = ":memory:", False
    elif read_only:
        flags = "mode=ro&immutable=1" if immutable else "mode=ro"
        target, uri = f"file:{quote(os.fspath(Path(path).absolute()))}?{flags}", True
    else:
        target, uri = os.fspath(path), False
    return sqlite3.connect(
        target, timeout=_BUSY_SLICE, isolation_level=None, check_same_thread=False, uri=uri
    )


def _open(path: str | Path, read_only: bool) -> sqlite3.Connection:
    """Open (or create) the store's file and check that it is a sound raf session store."""
    if read_only and path != ":memory:" and not Path(path).is_file():
        raise SessionStoreError(
            f"session store {path}: cannot open the file read-only: it does not exist"
        )
    try:
        db = _connect(path, read_only=read_only)
    except sqlite3.Error as exc:
        raise SessionStoreError(f"session store {path}: cannot open the file: {exc}") from exc
    try:
        _prepare(db, path, writable=not read_only)
    except sqlite3.Error as exc:
        db.close()
        if not _cannot_write(exc, path):
            raise
        # A WAL file in a folder we cannot write: SQLite cannot make its shared-memory file
        # next to it. With no -wal file the database file holds everything (the last writer
        # checkpointed and closed), so it can be read as an immutable file.
        try:
            db = _connect(path, read_only=True, immutable=not _has_wal(path))
            _prepare(db, path, writable=False)
        except BaseException:
            db.close()
            raise
    except BaseException:
        db.close()
        raise
    return db


def _cannot_write(exc: sqlite3.Error, path: str | Path) -> bool:
    return path != ":memory:" and _code(exc) in (_READONLY, _CANTOPEN) and Path(path).is_file()


def _has_wal(path: str | Path) -> bool:
    return Path(f"{os.fspath(path)}-wal").exists()


def _prepare(db: sqlite3.Connection, path: str | Path, *, writable: bool) -> None:
    """Check the schema (creating it in an empty file) and the file's soundness.

    A ``sqlite3.Error`` that says the file cannot be written propagates, so
    that ``_open`` can fall back to reading; every other problem is a
    :class:`SessionStoreError`.
    """
    try:
        tables = {row[0] for row in db.execute(_TABLES)}
        if not tables:
            if not writable:
                raise SessionStoreError(
                    f"session store {path}: the file holds no raf session store, and it is "
                    "opened read-only, so none can be created"
                )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")
            # Another process may have created the store between our look and our lock.
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                # Not executescript: it would commit first, outside our transaction.
                for statement in _CREATE.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute("INSERT INTO raf_meta (key, value) VALUES ('schema', ?)", (SCHEMA,))
            db.execute("COMMIT")
            tables = {row[0] for row in db.execute(_TABLES)}
        if "raf_meta" not in tables:
            raise SessionStoreError(
                f"session store {path}: the file is a SQLite database but not a raf session "
                f"store (tables: {', '.join(sorted(tables))}); refusing to touch it"
            )
        row = db.execute("SELECT value FROM raf_meta WHERE key = 'schema'").fetchone()
        if row is None or row[0] != SCHEMA:
            found = row[0] if row is not None else "none"
            raise SessionStoreError(
                f"session store {path}: unknown schema {found!r} (this raf reads {SCHEMA!r})"
            )
        if writable:
            try:
                db.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                if _code(exc) != _READONLY:
                    raise
                # A file we may not write (opened read-only by SQLite): read it as it is.
            db.execute("PRAGMA synchronous=NORMAL")
        _check_sound(db, path)
    except sqlite3.Error as exc:
        if db.in_transaction:
            db.rollback()
        if (_cannot_write(exc, path) and writable) or _code(exc) == _BUSY:
            raise  # _open falls back to reading; the caller's loop waits for the lock
        if not writable and _code(exc) in (_READONLY, _CANTOPEN) and _has_wal(path):
            raise SessionStoreError(
                f"session store {path}: cannot be read where it is: its folder cannot be written, "
                f"and SQLite needs to create {path}-shm to read the {path}-wal file left next to "
                "it; open the store once where the folder can be written, and it is checkpointed"
            ) from exc
        if _code(exc) == _CORRUPT:
            raise SessionStoreError(
                f"session store {path}: the database file is corrupt ({exc}). The file is left "
                "as it is: restore it from a backup (sqlite3's .recover can salvage what is "
                "readable)"
            ) from exc
        raise SessionStoreError(
            f"session store {path}: not a usable SQLite database ({exc}); "
            "check the path, the file is left as it is"
        ) from exc


def _check_sound(db: sqlite3.Connection, path: str | Path) -> None:
    """``PRAGMA quick_check``: a corrupt file is refused before it can hand out a short history."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        shown = "; ".join(str(p) for p in problems[:_PROBLEMS_SHOWN])
        more = len(problems) - _PROBLEMS_SHOWN
        raise SessionStoreError(
            f"session store {path}: the database file is corrupt (quick_check: {shown}"
            + (f"; and {more} more" if more > 0 else "")
            + "). The file is left as it is: restore it from a backup "
            "(sqlite3's .recover can salvage what is readable)"
        )
