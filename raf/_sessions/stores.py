"""open_store: the session store a ``--db`` value names, a SQLite file or a Redis URL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from raf._errors import ConfigError
from raf._sessions.sqlite import SqliteSessionStore

if TYPE_CHECKING:
    from raf._sessions.redis import RedisSessionStore

__all__: list[str] = []

#: URL schemes that name a Redis server rather than a SQLite file.
REDIS_SCHEMES = ("redis://", "rediss://")


def is_redis_url(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` names a Redis server (``redis://`` or ``rediss://``)."""
    return isinstance(db, str) and db.lower().startswith(REDIS_SCHEMES)


async def open_store(db: str | os.PathLike[str]) -> SqliteSessionStore | RedisSessionStore:
    """Open the store ``db`` names: ``redis://HOST:PORT/N`` or a SQLite file's path.

    A SQLite file's folder is created when missing. A Redis store is
    connected (and the server checked) before this returns; close either
    with ``await store.aclose()`` in the same task. Redis needs the extra
    ``raf-agents[redis]``; without it this is a :class:`raf.ConfigError`.
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
    path = Path(db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"--db {path}: cannot create the folder {path.parent}: {reason}"
        ) from None
    return SqliteSessionStore(path)
