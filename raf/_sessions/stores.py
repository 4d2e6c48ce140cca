"""open_store: the session store a ``--db`` value names, a SQLite file or a server's URL."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from raf._sessions.sqlite import SqliteSessionStore
from raf.errors import ConfigError

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
    this is a :class:`raf.errors.ConfigError`.
    """
    if is_redis_url(db):
        return await server_store("redis", str(db)).open()
    if is_postgres_url(db):
        return await server_store("postgres", str(db)).open()
    path = Path(db)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"--db {path}: cannot create the folder {path.parent}: {reason}"
        ) from None
    return SqliteSessionStore(path)


def server_store(
    kind: Literal["redis", "postgres"], location: str, **options: Any
) -> RedisSessionStore | PostgresSessionStore:
    """A :class:`raf.RedisSessionStore` or :class:`raf.PostgresSessionStore` of
    ``location`` (a URL, a connection string), not yet opened; ``options`` go to it.

    Their modules import an optional extra (coredis, psycopg), so they load here, on
    first use; without the extra, a :class:`raf.errors.ConfigError` that says what to install.
    """
    name = {"redis": "a Redis", "postgres": "a PostgreSQL"}[kind]
    try:  # Local: coredis and psycopg are optional extras.
        if kind == "redis":
            from raf._sessions.redis import RedisSessionStore

            return RedisSessionStore(location, **options)
        from raf._sessions.postgres import PostgresSessionStore

        return PostgresSessionStore(location, **options)
    except ImportError as exc:
        raise ConfigError(
            f"--db: {name} store needs the {kind} extra: pip install 'raf-agents[{kind}]' ({exc})"
        ) from None


def server_store_of(
    session: object,
) -> tuple[Literal["redis", "postgres"], str, str, float | None] | None:
    """Where a session of a Redis or PostgreSQL store lives, as :func:`server_store` takes
    it back (the kind, the URL or connection string, the prefix, the ttl); ``None`` for
    any other session."""
    # Only when the extra is there: a session of its store means its module is loaded.
    redis = sys.modules.get("raf._sessions.redis")
    if redis is not None and isinstance(session, redis.RedisSession):
        return "redis", session.store.url, session.store.prefix, session.store.ttl
    postgres = sys.modules.get("raf._sessions.postgres")
    if postgres is not None and isinstance(session, postgres.PostgresSession):
        return "postgres", session.store.dsn, session.store.prefix, session.store.ttl
    return None
