"""Middleware for the run and chat stacks: logging and retry."""

from raf.middleware.logging import LoggingMiddleware
from raf.middleware.retry import RetryMiddleware

__all__ = ["LoggingMiddleware", "RetryMiddleware"]
