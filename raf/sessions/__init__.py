"""Sessions: where conversations live between runs."""

from raf.sessions.base import Session, request_hash
from raf.sessions.memory import InMemorySession

__all__ = ["InMemorySession", "Session", "request_hash"]
