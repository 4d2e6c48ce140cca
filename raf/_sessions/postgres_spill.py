"""The spilled tool results of a PostgreSQL session: the table ``{prefix}_spilled``.

:class:`raf.ToolOutputLimit` keeps the full text of a result it cut with the
session, one row per call, deleted with the session (its ttl included). The
table is created on the first spill (under the store's creation lock), so a
database made before it is read as it is. The text is stored as a JSON
string: a tool's output may hold NUL, which a PostgreSQL ``text`` cannot.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Final

from raf.errors import SessionStoreError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import psycopg

    from raf._sessions.postgres_connection import PostgresConnection

__all__: list[str] = []

_TABLE: Final = """CREATE TABLE IF NOT EXISTS {p}_spilled (
    session_id text NOT NULL REFERENCES {p}_sessions (id) ON DELETE CASCADE,
    call_id text NOT NULL,
    result text NOT NULL,
    PRIMARY KEY (session_id, call_id))"""
_WRITE: Final = """
INSERT INTO {p}_spilled (session_id, call_id, result) VALUES (%(id)s, %(call)s, %(text)s)
ON CONFLICT (session_id, call_id) DO UPDATE SET result = EXCLUDED.result"""
_READ: Final = """
SELECT r.result FROM {p}_spilled AS r JOIN {p}_sessions AS s ON s.id = r.session_id
WHERE r.session_id = %(id)s AND r.call_id = %(call)s
    AND (s.expires_at IS NULL OR s.expires_at > now())"""


async def write_spilled(
    store: PostgresConnection, sql: Mapping[str, str], session_id: str, call_id: str, text: str
) -> None:
    """Keep ``text`` as the full result of ``call_id`` (replacing one kept before), in one
    transaction that stores the session (or puts its ttl again) with the store's own
    statements ``sql["expired"]`` and ``sql["upsert"]``, as any write does."""
    if "\x00" in call_id:
        raise ValueError(f"a PostgreSQL tool call id cannot hold NUL (\\x00): {call_id!r}")
    prefix = store.prefix
    args = {"id": session_id, "ttl": store.ttl, "call": call_id, "text": json.dumps(text)}

    def write(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        if not _exists(conn, prefix):
            store.create(conn, [_TABLE.replace("{p}", prefix)])
        conn.execute(sql["expired"].encode(), args)
        conn.execute(sql["upsert"].encode(), {**args, "n": 0, "now": time.time()})
        conn.execute(_WRITE.replace("{p}", prefix).encode(), args)

    what = f"keep the full result of tool call {call_id!r}"
    await store.call(write, what, session_id, write=True, writing="it is kept whole or not at all")


async def read_spilled(store: PostgresConnection, session_id: str, call_id: str) -> str | None:
    """The full result kept for ``call_id`` (of a live session), or ``None``."""
    if "\x00" in call_id:
        return None  # never written
    prefix = store.prefix

    def read(conn: psycopg.Connection[tuple[Any, ...]]) -> Any:
        if not _exists(conn, prefix):
            return None
        sql = _READ.replace("{p}", prefix).encode()
        return conn.execute(sql, {"id": session_id, "call": call_id}).fetchone()

    row = await store.call(read, f"read the full result of tool call {call_id!r}", session_id)
    if row is None:
        return None
    try:
        text = json.loads(row[0])
    except (TypeError, ValueError):
        text = None
    if type(text) is not str:
        raise SessionStoreError(
            f"{store.where}, session {session_id!r}: the spilled result of call {call_id!r} "
            "is not one raf wrote (a JSON string)"
        )
    return text


def _exists(conn: psycopg.Connection[tuple[Any, ...]], prefix: str) -> bool:
    found = conn.execute("SELECT to_regclass(%s)", (f"{prefix}_spilled",)).fetchone()
    return found is not None and found[0] is not None
