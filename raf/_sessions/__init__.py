"""Sessions: where conversations live between runs."""

from raf._sessions.base import REQUEST_HASH_LIMIT, RequestHash, Session, request_hash
from raf._sessions.memory import InMemorySession
from raf._sessions.sqlite import SqliteSessionStore

__all__ = [
    "REQUEST_HASH_LIMIT",
    "InMemorySession",
    "RequestHash",
    "Session",
    "SqliteSessionStore",
    "request_hash",
]
