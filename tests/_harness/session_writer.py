"""Another process that writes to a session (``python -m tests._harness.session_writer``).

    python -m tests._harness.session_writer sqlite PATH SESSION TEXT...
    python -m tests._harness.session_writer redis URL SESSION TEXT...   (appends, one batch)
    python -m tests._harness.session_writer redis-replace URL SESSION TEXT...
    python -m tests._harness.session_writer postgres DSN SESSION TEXT...  (prefix "raf")

Appends one user message per TEXT to the session, in one batch, and exits.
``redis-replace`` deletes the session's list first and writes the TEXTs as a
new history: the reader's cache must not take it for the old one grown.
"""

from __future__ import annotations

import sys

import anyio

from raf import ChatMessage, SqliteSessionStore


async def main(kind: str, target: str, session_id: str, texts: list[str]) -> None:
    batch = [ChatMessage.user(text) for text in texts]
    if kind == "sqlite":
        async with SqliteSessionStore(target) as sqlite_store:
            await (await sqlite_store.get(session_id)).add_messages(batch)
        return
    if kind == "postgres":
        from raf._sessions.postgres import PostgresSessionStore

        async with PostgresSessionStore(target) as postgres_store:
            await (await postgres_store.get(session_id)).add_messages(batch)
        return
    from raf._sessions.redis import RedisSessionStore

    async with RedisSessionStore(target) as redis_store:
        session = await redis_store.get(session_id)
        if kind == "redis-replace":
            await redis_store.client().delete([session.keys[0]])
        await session.add_messages(batch)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
