"""Sessions: where conversations live between runs."""

from raf.sessions.base import Session, request_hash
from raf.sessions.memory import InMemorySession
from raf.sessions.sqlite import SqliteSession, SqliteSessionStore

__all__ = ["InMemorySession", "Session", "SqliteSession", "SqliteSessionStore", "request_hash"]
