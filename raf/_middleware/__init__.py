"""Middleware for the run and chat stacks: logging and retry."""

from raf._middleware.logging import LoggingMiddleware
from raf._middleware.retry import RetryMiddleware

__all__ = ["LoggingMiddleware", "RetryMiddleware"]
