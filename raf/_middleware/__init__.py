"""Middleware for the run and chat stacks: logging, retry and fallback.

Nothing is imported here: `raf` loads each module when its middleware is first used.
"""
