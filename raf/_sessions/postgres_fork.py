"""Forking a session of a PostgresSessionStore: the copy of its first turns, in one transaction."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from raf._sessions.postgres_connection import PostgresConnection, Undo
from raf._values.messages import ChatMessage
from raf.errors import SessionExistsError

__all__: list[str] = []


async def write_fork(
    store: PostgresConnection,
    sql: Mapping[str, str],
    new_id: str,
    messages: Sequence[ChatMessage],
) -> None:
    """Store ``messages`` as the history of ``new_id``, unless it holds messages: then a
    :class:`raf.errors.SessionExistsError`, and nothing is written.

    One transaction that first creates or updates the new session's row (as
    every write does), so it holds the row's lock: a write to ``new_id`` from
    any process waits for it, and the count it reads stays true until the
    commit. ``sql`` is the store's statements (its table prefix in them).
    """
    encoded = [json.dumps(m.to_dict(), ensure_ascii=False, separators=(",", ":")) for m in messages]
    now = time.time()

    def write(conn: psycopg.Connection[tuple[Any, ...]]) -> int:
        session = {"id": new_id, "ttl": store.ttl}
        conn.execute(sql["expired"].encode(), session)  # an expired session holds nothing
        row = conn.execute(sql["upsert"].encode(), {**session, "n": len(encoded), "now": now})
        _, length, _ = row.fetchone() or (0, 0, 0)
        held = int(length) - len(encoded)
        if held:
            raise Undo(held)  # rolled back: not even the row's counters change
        if encoded:
            args = {**session, "first": 1, "messages": encoded}
            conn.execute(sql["append"].encode(), args)
        return 0

    held = await store.call(
        write,
        f"fork {len(encoded)} messages into it",
        new_id,
        write=True,
        writing="nothing or everything of it is stored",
    )
    if held:
        raise SessionExistsError(new_id, held, store.where)
