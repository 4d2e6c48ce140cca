"""The SQL the PostgreSQL session store runs: its tables, and each statement by name.

Kept apart from :mod:`raf._sessions.postgres`, which says when each runs (in
which transaction, after which lock); the statements say what each does.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SCHEMA", "STATEMENTS"]

#: The tables, created on first use (``{p}``: the store's prefix).
SCHEMA: Final = [
    """CREATE TABLE IF NOT EXISTS {p}_sessions (
        id text PRIMARY KEY,
        gen bigint GENERATED ALWAYS AS IDENTITY,
        length bigint NOT NULL,
        writes bigint NOT NULL,
        created_at double precision NOT NULL,
        expires_at timestamptz)""",
    "CREATE INDEX IF NOT EXISTS {p}_sessions_expiry ON {p}_sessions (expires_at) "
    "WHERE expires_at IS NOT NULL",
    """CREATE TABLE IF NOT EXISTS {p}_messages (
        session_id text NOT NULL REFERENCES {p}_sessions (id) ON DELETE CASCADE,
        seq bigint NOT NULL,
        message text NOT NULL,
        PRIMARY KEY (session_id, seq))""",
    """CREATE TABLE IF NOT EXISTS {p}_requests (
        session_id text NOT NULL REFERENCES {p}_sessions (id) ON DELETE CASCADE,
        hash text NOT NULL,
        seen_at double precision NOT NULL,
        turn bigint NOT NULL,
        PRIMARY KEY (session_id, hash))""",
    """CREATE TABLE IF NOT EXISTS {p}_pending (
        session_id text NOT NULL REFERENCES {p}_sessions (id) ON DELETE CASCADE,
        token text NOT NULL,
        turn bigint NOT NULL,
        idx bigint NOT NULL,
        call text NOT NULL,
        PRIMARY KEY (session_id, token))""",
    """CREATE TABLE IF NOT EXISTS {p}_once (
        session_id text NOT NULL REFERENCES {p}_sessions (id) ON DELETE CASCADE,
        key text NOT NULL,
        PRIMARY KEY (session_id, key))""",
]

_LIVE: Final = "(s.expires_at IS NULL OR s.expires_at > now())"

# The session's row, created or updated (locked until the transaction ends): it numbers the
# batch and puts the expiry again. ttl None keeps the expiry another store put.
_UPSERT: Final = """
INSERT INTO {p}_sessions AS s (id, length, writes, created_at, expires_at)
VALUES (%(id)s, %(n)s, 1, %(now)s, now() + %(ttl)s * interval '1 second')
ON CONFLICT (id) DO UPDATE SET
    length = s.length + EXCLUDED.length,
    writes = s.writes + 1,
    expires_at = coalesce(EXCLUDED.expires_at, s.expires_at)
RETURNING s.gen, s.length, s.writes"""
_EXPIRED: Final = "DELETE FROM {p}_sessions WHERE id = %(id)s AND expires_at <= now()"
_SWEEP: Final = (
    "DELETE FROM {p}_sessions WHERE id IN (SELECT id FROM {p}_sessions "
    "WHERE expires_at <= now() LIMIT 1000)"
)
_APPEND: Final = """
INSERT INTO {p}_messages (session_id, seq, message)
SELECT %(id)s, %(first)s + t.n - 1, t.message
FROM unnest(%(messages)s::text[]) WITH ORDINALITY AS t(message, n)"""
_RECORD: Final = """
INSERT INTO {p}_pending (session_id, token, turn, idx, call)
SELECT %(id)s, t.token, %(turn)s, t.n, t.call
FROM unnest(%(tokens)s::text[], %(calls)s::text[]) WITH ORDINALITY AS t(token, call, n)
ON CONFLICT (session_id, token) DO UPDATE SET
    turn = EXCLUDED.turn, idx = EXCLUDED.idx, call = EXCLUDED.call"""
# The messages after %(after)s (when the reader's generation is still the session's: else
# from the first), and within the newest %(keep)s; with the session's length and generation.
_READ: Final = f"""
SELECT s.gen, s.length, m.seq, m.message
FROM {{p}}_sessions AS s
LEFT JOIN {{p}}_messages AS m ON m.session_id = s.id
    AND m.seq > (CASE WHEN s.gen = %(gen)s THEN %(after)s ELSE 0 END)
    AND m.seq > s.length - %(keep)s
WHERE s.id = %(id)s AND {_LIVE}
ORDER BY m.seq"""
_LENGTH: Final = f"SELECT s.length FROM {{p}}_sessions AS s WHERE s.id = %(id)s AND {_LIVE}"
_LOCK: Final = f"""
UPDATE {{p}}_sessions AS s SET expires_at = coalesce(now() + %(ttl)s * interval '1 second',
    s.expires_at)
WHERE s.id = %(id)s AND {_LIVE}
RETURNING s.id"""
_PENDING: Final = f"""
SELECT p.token, p.call FROM {{p}}_pending AS p JOIN {{p}}_sessions AS s ON s.id = p.session_id
WHERE p.session_id = %(id)s AND {_LIVE}
ORDER BY p.turn, p.idx"""
_CLAIM: Final = "DELETE FROM {p}_pending WHERE session_id = %(id)s AND token = ANY(%(tokens)s)"
_SEEN: Final = "SELECT 1 FROM {p}_requests WHERE session_id = %(id)s AND hash = %(hash)s"
_TOUCH: Final = """
INSERT INTO {p}_requests (session_id, hash, seen_at, turn)
VALUES (%(id)s, %(hash)s, %(seen_at)s, %(turn)s)
ON CONFLICT (session_id, hash) DO UPDATE SET seen_at = EXCLUDED.seen_at, turn = EXCLUDED.turn"""
_TRIM: Final = """
DELETE FROM {p}_requests WHERE session_id = %(id)s AND turn < (
    SELECT min(turn) FROM (SELECT turn FROM {p}_requests WHERE session_id = %(id)s
    ORDER BY turn DESC LIMIT %(limit)s) AS kept)"""
_HASHES: Final = f"""
SELECT r.hash, r.seen_at FROM {{p}}_requests AS r JOIN {{p}}_sessions AS s ON s.id = r.session_id
WHERE r.session_id = %(id)s AND {_LIVE}
ORDER BY r.turn"""
_ONCE: Final = """
INSERT INTO {p}_once (session_id, key) VALUES (%(id)s, %(key)s) ON CONFLICT DO NOTHING"""
_IDS: Final = f"SELECT s.id FROM {{p}}_sessions AS s WHERE {_LIVE} ORDER BY s.created_at, s.id"

#: Each statement by name (``{p}``: the store's prefix; the store formats them once).
STATEMENTS: Final = {
    "upsert": _UPSERT,
    "expired": _EXPIRED,
    "sweep": _SWEEP,
    "append": _APPEND,
    "record": _RECORD,
    "read": _READ,
    "length": _LENGTH,
    "lock": _LOCK,
    "pending": _PENDING,
    "claim": _CLAIM,
    "seen": _SEEN,
    "touch": _TOUCH,
    "trim": _TRIM,
    "hashes": _HASHES,
    "once": _ONCE,
    "ids": _IDS,
}
