"""open_store: the session store a ``--db`` value names, a SQLite file or a server's URL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from raf._errors import ConfigError
from raf._sessions.sqlite import SqliteSessionStore

if TYPE_CHECKING:
    from raf._sessions.postgres import PostgresSessionStore
    from raf._sessions.redis import RedisSessionStore

__all__: list[str] = []

#: URL schemes that name a Redis server rather than a SQLite file.
REDIS_SCHEMES = ("redis://", "rediss://")
#: URL schemes that name a PostgreSQL database.
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_redis_url(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` names a Redis server (``redis://`` or ``rediss://``)."""
    return isinstance(db, str) and db.lower().startswith(REDIS_SCHEMES)


def is_postgres_url(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return isinstance(db, str) and db.lower().startswith(POSTGRES_SCHEMES)


async def open_store(
    db: str | os.PathLike[str],
) -> SqliteSessionStore | RedisSessionStore | PostgresSessionStore:
    """Open the store ``db`` names: ``redis://HOST:PORT/N``, ``postgresql://...`` or a
    SQLite file's path.

    A SQLite file's folder is created when missing. A Redis or PostgreSQL
    store is connected (and the server checked) before this returns; close
    any with ``await store.aclose()`` in the same task. Redis needs the extra
    ``raf-agents[redis]``, PostgreSQL ``raf-agents[postgres]``; without it
    this is a :class:`raf.ConfigError`.
    """
    if is_redis_url(db):
        try:  # Local: coredis is an optional extra.
            from raf._sessions.redis import RedisSessionStore
        except ImportError as exc:
            raise ConfigError(
                "--db: a Redis store needs the redis extra: "
                f"pip install 'raf-agents[redis]' ({exc})"
            ) from None
        return await RedisSessionStore(str(db)).open()
    if is_postgres_url(db):
        try:  # Local: psycopg is an optional extra.
            from raf._sessions.postgres import PostgresSessionStore
        except ImportError as exc:
            raise ConfigError(
                "--db: a PostgreSQL store needs the postgres extra: "
                f"pip install 'raf-agents[postgres]' ({exc})"
            ) from None
        return await PostgresSessionStore(str(db)).open()
    path = Path(db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"--db {path}: cannot create the folder {path.parent}: {reason}"
        ) from None
    return SqliteSessionStore(path)
