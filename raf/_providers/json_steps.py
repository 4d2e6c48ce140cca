"""JSON text parsed in steps, the event loop running between them.

:func:`json.loads` holds the event loop for the whole text: some 0.1 s for
the 3.7 MB of an MCP server's page of 20,000 tools. Here the outer containers
(the message, its result, the list in it) are taken apart in Python and each
value inside them is parsed whole by :mod:`json`'s C scanner, with a pause
after about every :data:`STEP_CHARS` characters. The result is what
:func:`json.loads` returns for the same text, and a text it refuses is refused
here too, with a :class:`json.JSONDecodeError`.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from collections.abc import Callable
from typing import Any, Final

import anyio.lowlevel

__all__: list[str] = []

#: Containers this near the top are taken apart here; values deeper down (one tool, one
#: content block) are parsed whole, in C.
SPLIT_DEPTH: Final = 3
#: About this many characters are parsed between two pauses (a millisecond or so).
STEP_CHARS: Final = 32_768

# json's own C functions (typeshed does not describe them as they are).
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]
)
_SCAN_STRING: Final[Callable[[str, int], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")


async def loads_in_steps(text: str, *, step_chars: int = STEP_CHARS) -> Any:
    """The value of the JSON ``text``, as :func:`json.loads` gives it, parsed in steps of
    about ``step_chars`` characters (a text no longer than that: in one)."""
    if len(text) <= step_chars:
        return json.loads(text)
    parser = _Parser(text, step_chars)
    value, end = await parser.value(parser.skip(0), 0)
    if parser.skip(end) != len(text):
        raise json.JSONDecodeError("Extra data", text, parser.skip(end))
    return value


class _Parser:
    def __init__(self, text: str, step_chars: int) -> None:
        self.text = text
        self.step_chars = step_chars
        self.paused_at = 0

    def skip(self, index: int) -> int:
        """The index of the first character at or after ``index`` that is not whitespace."""
        match = _WHITESPACE.match(self.text, index)
        assert match is not None  # the pattern matches the empty string
        return match.end()

    def expect(self, index: int, char: str, what: str) -> None:
        if self.text[index : index + 1] != char:
            raise json.JSONDecodeError(f"Expecting {what}", self.text, index)

    async def value(self, index: int, depth: int) -> tuple[Any, int]:
        first = self.text[index : index + 1]
        if depth < SPLIT_DEPTH and first == "{":
            return await self.object(index + 1, depth + 1)
        if depth < SPLIT_DEPTH and first == "[":
            return await self.array(index + 1, depth + 1)
        try:
            value, end = _SCAN(self.text, index)
        except StopIteration as stop:
            raise json.JSONDecodeError("Expecting value", self.text, stop.value) from None
        if end - self.paused_at >= self.step_chars:
            self.paused_at = end
            await anyio.lowlevel.checkpoint()
        return value, end

    async def array(self, index: int, depth: int) -> tuple[list[Any], int]:
        items: list[Any] = []
        index = self.skip(index)
        if self.text[index : index + 1] == "]":
            return items, index + 1
        while True:
            item, index = await self.value(index, depth)
            items.append(item)
            index = self.skip(index)
            if self.text[index : index + 1] == "]":
                return items, index + 1
            self.expect(index, ",", "',' delimiter")
            index = self.skip(index + 1)

    async def object(self, index: int, depth: int) -> tuple[dict[str, Any], int]:
        pairs: dict[str, Any] = {}
        index = self.skip(index)
        if self.text[index : index + 1] == "}":
            return pairs, index + 1
        while True:
            self.expect(index, '"', "property name enclosed in double quotes")
            key, index = _SCAN_STRING(self.text, index + 1)
            index = self.skip(index)
            self.expect(index, ":", "':' delimiter")
            pairs[key], index = await self.value(self.skip(index + 1), depth)
            index = self.skip(index)
            if self.text[index : index + 1] == "}":
                return pairs, index + 1
            self.expect(index, ",", "',' delimiter")
            index = self.skip(index + 1)
