"""The one rule for text entering raf (lone surrogates replaced), and the checks of a
value's str fields."""

from __future__ import annotations

import re
from typing import Any, Final

import attrs

__all__: list[str] = []

# Python strings can hold lone surrogates (from "\ud800" in JSON, or surrogateescape'd
# argv), which no UTF-8 encoder accepts: one such reply would break every later turn.
_SURROGATES: Final = re.compile("[\ud800-\udfff]")


def clean_text(value: Any) -> Any:
    r"""``value`` with each lone surrogate replaced by U+FFFD; non-strings unchanged.

    The one rule for text entering raf: every string field of a
    :class:`raf.ChatMessage` and :class:`raf.ToolCall` goes through it, so whatever
    a client, a session or the command line hands over can be encoded.

    >>> clean_text("bad \udcff byte")
    'bad \ufffd byte'
    """
    if type(value) is str and not value.isascii() and _SURROGATES.search(value):
        return _SURROGATES.sub("\ufffd", value)
    return value


def check_optional_str(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: ``value`` is a str or ``None``, else a TypeError naming the field."""
    if value is not None and type(value) is not str:
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str or None, "
            f"got {type(value).__name__}"
        )


def check_str(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An attrs validator: ``value`` is a str, else a TypeError naming the field."""
    if type(value) is not str:
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str, got {type(value).__name__}"
        )
