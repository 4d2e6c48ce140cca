"""Sessions: where conversations live between runs.

The base and the in-memory session are the core's; the stores (``raf._sessions.sqlite``,
``raf._sessions.redis``) are loaded when first used.
"""

from raf._sessions.base import REQUEST_HASH_LIMIT, RequestHash, Session, request_hash
from raf._sessions.memory import InMemorySession

__all__ = ["REQUEST_HASH_LIMIT", "InMemorySession", "RequestHash", "Session", "request_hash"]
