"""How a tool result raf cleared reads: the marker its strategy writes, found by the ledger."""

from __future__ import annotations

from typing import Final

from raf._values.messages import ChatMessage

__all__: list[str] = []

#: How every placeholder of a cleared tool result begins.
CLEARED: Final = "[tool result cleared:"


def cleared_text(name: str, call_id: str, chars: int, read_back: str | None = None) -> str:
    """The placeholder of a result of ``chars`` characters (and how to read it back).

    >>> cleared_text("search", "c1", 9000)
    '[tool result cleared: search, call c1, 9000 characters]'
    """
    hint = f"; {read_back}" if read_back else ""
    return f"{CLEARED} {name}, call {call_id}, {chars} characters{hint}]"


def is_cleared(message: ChatMessage) -> bool:
    """Whether ``message`` is a tool result whose text a placeholder replaced."""
    return message.role == "tool" and (message.content or "").startswith(CLEARED)
