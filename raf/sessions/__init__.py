"""Sessions: where conversations live between runs."""

from raf.sessions.base import REQUEST_HASH_LIMIT, RequestHash, Session, request_hash
from raf.sessions.memory import InMemorySession
from raf.sessions.sqlite import SqliteSession, SqliteSessionStore

__all__ = [
    "REQUEST_HASH_LIMIT",
    "InMemorySession",
    "RequestHash",
    "Session",
    "SqliteSession",
    "SqliteSessionStore",
    "request_hash",
]
