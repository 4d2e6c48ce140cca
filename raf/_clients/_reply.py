"""What both OpenAI clients read replies with: a reply's bytes as a JSON object, and a
JSON object as the SDK's own type, checked where raf reads it."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any, Final

from raf._errors import ChatProtocolError

__all__: list[str] = []

# How much of a reply that is not JSON an error message quotes.
_QUOTE: Final = 120
# What pydantic's error types expect, in the words of an error message.
_NOUNS: Final = {
    "string_type": "a string",
    "int_type": "an int",
    "list_type": "a list",
    "model_type": "an object",
    "dict_type": "an object",
}


def json_object(data: bytes | str, content_type: str | None, where: str, what: str) -> Any:
    """A reply's (or an event's: ``what``) bytes as a JSON object, or a ChatProtocolError
    that quotes them."""
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    try:
        # Invalid UTF-8 in a text is replaced, not fatal: the rest of the answer stands.
        reply = json.loads(text)
    except (ValueError, RecursionError) as exc:
        kind = f"{content_type or 'no content-type'}; " if content_type is not None else ""
        raise ChatProtocolError(
            f"{where}: {what} is not JSON ({kind}{exc}): {quote(text)}"
        ) from None
    if not isinstance(reply, dict):
        raise ChatProtocolError(
            f"{where}: {what} is {json_type(reply)}, not a JSON object: {quote(text)}"
        )
    return reply


def parse(kind: Any, reply: dict[str, Any], where: str, reads: Collection[str]) -> Any:
    """``reply`` as the SDK's ``kind``, built as the SDK builds it (``construct``: compatible
    servers leave out or vary fields raf does not need), after a strict check of the
    fields raf reads: ``reads`` names them as dotted paths, ``*`` for any index, a
    trailing ``?`` for one that may be missing or null (a count of tokens, say).
    A field raf reads that is not what the SDK says is a ChatProtocolError naming it."""
    import pydantic

    try:
        return kind.model_validate(reply, strict=True)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        # A union's members name themselves in the path; one whose "type" differs is not
        # what the value is, and its errors are none.
        others = [e["loc"][:-1] for e in errors if e["type"] == "literal_error" and _tagged(e)]
        for error in errors:
            loc = error["loc"]
            if any(loc[: len(other)] == other for other in others):
                continue
            loc = tuple(p for p in loc if not (isinstance(p, str) and p[:1].isupper()))
            path = ".".join("*" if isinstance(p, int) else str(p) for p in loc)
            absent = error["type"] == "missing" or error["input"] is None
            if path in reads or (f"{path}?" in reads and not absent):
                at = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
                raise ChatProtocolError(f"{where}: {at[1:]} {_problem(error)}") from None
    return kind.construct(**reply)


def _tagged(error: Any) -> bool:
    loc = error["loc"]
    return len(loc) > 1 and loc[-1] == "type" and str(loc[-2])[:1].isupper()


def _problem(error: Any) -> str:
    if error["type"] == "missing":
        return "is missing"
    noun = _NOUNS.get(error["type"])
    return f"is {json_type(error['input'])}, not {noun}" if noun else f"is wrong: {error['msg']}"


def tokens(usage: Any, path: str, where: str) -> int:
    """The count of tokens at ``path`` (dotted) of a usage ``parse`` checked: 0 when
    absent, a ChatProtocolError when negative."""
    value = usage
    for key in path.split("."):
        value = getattr(value, key, None)
    if value is None:
        return 0
    if value < 0:
        raise ChatProtocolError(
            f"{where}: usage.{path} is {json_type(value)}, not a count of tokens"
        )
    return int(value)


def json_type(value: object) -> str:
    """What a JSON value is, for an error message: ``"a string"``, ``"null"``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    nouns: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return nouns.get(type(value), type(value).__name__)


def quote(data: bytes | str) -> str:
    """The start of a reply, quoted for an error message."""
    text = data if isinstance(data, str) else data[: _QUOTE * 4].decode("utf-8", "replace")
    return repr(text[:_QUOTE]) + ("..." if len(text) > _QUOTE else "")
