"""Middleware for the run and chat stacks: logging, retry and fallback."""

from raf._middleware.fallback import FallbackMiddleware
from raf._middleware.logging import LoggingMiddleware
from raf._middleware.retry import RetryMiddleware

__all__ = ["FallbackMiddleware", "LoggingMiddleware", "RetryMiddleware"]
