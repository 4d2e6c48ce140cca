"""The PostgreSQL store's record of a session's last model call (table ``{p}_last_calls``).

One row per session, deleted with it: ``at`` the time of its last model call,
``cuts`` (jsonb) the starts of its bounded views
(:class:`raf._sessions.cold.LastModelCall`). A write merges its cuts over the
row's in one statement, so a view's start written by another provider is kept.
The table is created when a store opens and finds it missing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from raf._sessions.cold import LastModelCall
from raf.errors import SessionStoreError

if TYPE_CHECKING:
    import psycopg

    from raf._sessions.postgres_connection import PostgresConnection

__all__: list[str] = []

_TABLE: Final = """CREATE TABLE IF NOT EXISTS {p}_last_calls (
    session_id text PRIMARY KEY REFERENCES {p}_sessions (id) ON DELETE CASCADE,
    at double precision NOT NULL,
    cuts jsonb NOT NULL)"""
_WRITE: Final = """
INSERT INTO {p}_last_calls AS t (session_id, at, cuts) VALUES (%(id)s, %(at)s, %(cuts)s::jsonb)
ON CONFLICT (session_id) DO UPDATE SET at = EXCLUDED.at, cuts = t.cuts || EXCLUDED.cuts"""
_READ: Final = """
SELECT t.at, t.cuts::text FROM {p}_last_calls AS t JOIN {p}_sessions AS s ON s.id = t.session_id
WHERE t.session_id = %(id)s AND (s.expires_at IS NULL OR s.expires_at > now())"""



def ensure_table(store: PostgresConnection, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Create the table when the store's database lacks it (a store made before it)."""
    found = conn.execute("SELECT to_regclass(%s)", (f"{store.prefix}_last_calls",)).fetchone()
    if found is None or found[0] is None:
        store.create(conn, [_TABLE.replace("{p}", store.prefix)])


async def read_last_call(store: PostgresConnection, session_id: str) -> LastModelCall | None:
    """The session's record, or ``None`` when none was written (or the session expired)."""
    sql = _READ.replace("{p}", store.prefix).encode()
    row = await store.call(
        lambda conn: conn.execute(sql, {"id": session_id}).fetchone(),
        "read the last model call",
        session_id,
    )
    if row is None:
        return None
    try:
        at, cuts = row
        return LastModelCall(float(at), {str(k): int(v) for k, v in json.loads(cuts).items()})  # type: ignore[arg-type]
    except (TypeError, ValueError, AttributeError) as exc:
        raise SessionStoreError(
            f"{store.where}, session {session_id!r}: its last-model-call row is not raf's "
            f"({exc}); it was left as it is"
        ) from None


async def write_last_call(
    store: PostgresConnection,
    sql: Mapping[str, str],
    session_id: str,
    at: float,
    cuts: Mapping[str, int],
) -> None:
    """Record ``at`` and ``cuts`` over the session's row (the session stored, if it was not,
    with the store's own ``sql["expired"]`` and ``sql["upsert"]``)."""
    write = _WRITE.replace("{p}", store.prefix).encode()
    record = json.dumps(dict(cuts), sort_keys=True)

    def work(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        session = {"id": session_id, "ttl": store.ttl}
        conn.execute(sql["expired"].encode(), session)
        conn.execute(sql["upsert"].encode(), {**session, "n": 0, "now": at})
        conn.execute(write, {"id": session_id, "at": at, "cuts": record})

    await store.call(work, "record the last model call", session_id, write=True)
