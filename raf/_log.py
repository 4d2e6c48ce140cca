"""log: raf's structlog logger ``raf``, made on first use (``import raf`` imports no structlog)."""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


class _Log:
    """``structlog.get_logger("raf")``, made the first time an event is logged."""

    __slots__ = ("_logger",)

    def __init__(self) -> None:
        self._logger: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._logger is None:
            import structlog

            self._logger = structlog.get_logger("raf")
        return getattr(self._logger, name)


#: The logger raf's modules log to: ``log.warning("event", key=value)``.
log = _Log()
