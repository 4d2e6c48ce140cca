"""What both OpenAI clients read replies with: a reply's bytes as a JSON object, the
name of a JSON value's type for error messages, token counts, and the SDK's object kept
as ``raw``.
"""

from __future__ import annotations

import json
from typing import Any, Final

from raf._errors import ChatProtocolError

__all__: list[str] = []

#: What ``dict.get`` gives for a key that is absent (``json_type`` says "missing").
MISSING: Final = object()
# How much of a reply that is not JSON an error message quotes.
_QUOTE: Final = 120


def json_object(data: bytes, content_type: str | None, where: str) -> dict[str, Any]:
    """A reply's bytes as a JSON object, or a ChatProtocolError that quotes them."""
    try:
        # Invalid UTF-8 in a text is replaced, not fatal: the rest of the answer stands.
        reply = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError) as exc:
        raise ChatProtocolError(
            f"{where}: the reply is not JSON ({content_type or 'no content-type'}; "
            f"{exc}): {quote(data)}"
        ) from None
    if not isinstance(reply, dict):
        raise ChatProtocolError(
            f"{where}: the reply is {json_type(reply)}, not a JSON object: {quote(data)}"
        )
    return reply


def tokens(usage: dict[str, Any], path: str, where: str) -> int:
    """The count of tokens at ``path`` (dotted, e.g. ``input_tokens_details.cached_tokens``)
    of a reply's usage; 0 when absent, a ChatProtocolError when it is not a count."""
    value: Any = usage
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ChatProtocolError(
            f"{where}: usage.{path} is {json_type(value)}, not a count of tokens"
        )
    return value


_NOUNS: Final[dict[type, str]] = {str: "a string", list: "a list", dict: "an object", int: "an int"}


def typed(
    value: Any, kind: type, where: str, path: str, *, required: bool = False, noun: str = ""
) -> Any:
    """``value`` if it is a ``kind`` (or ``None``, unless ``required``), else a
    ChatProtocolError naming ``path`` (``choices[0].message.content``, say).

    ``MISSING`` (what ``dict.get(key, MISSING)`` gives) is ``None`` here; an
    ``int`` is a count, never a boolean.
    """
    if (value is MISSING or value is None) and not required:
        return None
    if not isinstance(value, kind) or (kind is int and type(value) is not int):
        noun = noun or _NOUNS.get(kind, kind.__name__)
        raise ChatProtocolError(f"{where}: {path} is {json_type(value)}, not {noun}")
    return value


def sdk_object(model: Any, reply: dict[str, Any]) -> Any:
    """``model`` (an SDK pydantic type) for ``reply``: validated, or built leniently."""
    try:
        return model.model_validate(reply)
    except Exception:
        # Compatible servers leave out or vary fields raf does not need: keep them all.
        try:
            return model.construct(**reply)
        except Exception:
            return reply


def json_type(value: object) -> str:
    """What a JSON value is, for an error message: ``"a string"``, ``"missing"``, ..."""
    if value is MISSING or value is None:
        return "missing" if value is MISSING else "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    return _NOUNS.get(type(value), type(value).__name__)


def quote(data: bytes) -> str:
    """The start of a reply, quoted for an error message."""
    text = data[:_QUOTE].decode("utf-8", "replace")
    return repr(text) + ("..." if len(data) > _QUOTE else "")
