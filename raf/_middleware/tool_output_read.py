"""read_tool_result: a bounded slice of a spilled tool result, or the lines that match a pattern.

The tool :class:`raf.ToolOutputLimit` offers the model while a result it cut
is in what the model sees; the limit answers the call itself, from the
session. What comes back is bounded: a slice of at most the limit's
``max_chars``, or the matching lines (each cut to :data:`MAX_LINE`) up to
the same size. Patterns are RE2's (google-re2): matched in time linear in
the text, so no pattern backtracks for hours (Python's ``re`` does, holding
the GIL, so not even a thread with a timeout would bound it), and the search
also stops after :data:`SEARCH_SECONDS`, saying where to go on. What goes
wrong (an unknown call id, a pattern RE2 does not take, an offset past the
end) is told to the model as the tool's result, with what to write instead.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Final

import anyio
import attrs
import re2

from raf._agent.tools import check_tool_arguments
from raf._sessions.base import keeps_spills
from raf._values.context import ToolRequest
from raf._values.messages import ChatMessage
from raf._values.spill import READ_TOOL_NAME

__all__: list[str] = []

#: The longest pattern taken, in characters.
MAX_PATTERN: Final = 1000
#: How long one search may run, in seconds, before it stops and says where to go on.
SEARCH_SECONDS: Final = 2.0
#: A matching line is shown up to this many characters.
MAX_LINE: Final = 500
#: Room kept for the header line of an answer.
_HEADER: Final = 240


@attrs.frozen
class ReadToolResult:
    """The ``read_tool_result`` tool: the model's way back to a result that was cut.

    It is answered by :class:`raf.ToolOutputLimit` in the tool stack, which
    has the session; invoked on its own it has nothing to read.
    """

    name: str = READ_TOOL_NAME
    description: str = (
        "Read a tool result that was cut. call_id is the id in the result's "
        "'[raf: ... left out ...]' note. Without pattern, returns the characters from "
        "offset (default 0), at most limit of them. With pattern (a regular expression, "
        "RE2 syntax: no look-around or back-references), returns the lines from offset on "
        "that match it, with their line numbers."
    )
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {
            "type": "object",
            "properties": {
                "call_id": {"type": "string", "description": "The id of the cut tool call."},
                "offset": {
                    "type": ["integer", "null"],
                    "minimum": 0,
                    "description": "The first character to read or search (default 0).",
                },
                "limit": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "description": "At most this many characters (default and most: the limit).",
                },
                "pattern": {
                    "type": ["string", "null"],
                    "description": "A regular expression: return the matching lines instead.",
                },
            },
            "required": ["call_id"],
            "additionalProperties": False,
        }
    )

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Refused: the call is answered by :class:`raf.ToolOutputLimit`, which has the session."""
        raise RuntimeError(
            "read_tool_result is answered by raf.ToolOutputLimit in Agent(tool_stack=[...]); "
            "it reached the tool itself, past the limit"
        )


#: The one read tool every limit offers and answers (one name, one tool).
READ_TOOL: Final = ReadToolResult()


async def read_result(request: ToolRequest, max_chars: int) -> ChatMessage:
    """The answer to a ``read_tool_result`` call, at most about ``max_chars`` characters.

    Arguments that do not fit the tool's schema raise
    :class:`raf.errors.ToolArgumentsError` (the tool loop tells the model);
    everything else that is wrong is the answer itself, an ``Error:`` text.
    """
    arguments = request.arguments
    check_tool_arguments(request.tool, arguments)
    call_id: str = arguments["call_id"]
    offset: int = arguments.get("offset") or 0  # null, as a strict model sends it: the default
    most = max(1, max_chars - _HEADER)  # the answer, its header line included, fits max_chars
    limit: int = min(arguments.get("limit") or most, most)
    pattern: str | None = arguments.get("pattern")
    session = request.invocation.session
    if not keeps_spills(session):
        return _error(
            request,
            f"this session ({type(session).__name__}) keeps no full tool results: "
            "only what the cut result shows is there",
        )
    text = await session.spilled_tool_result(call_id)
    if text is None:
        return _error(
            request,
            f"no full result is kept for call_id {json.dumps(call_id)}; write the call_id "
            "exactly as the '[raf: ...]' note of a cut result gives it",
        )
    if offset > len(text):
        return _error(
            request,
            f"offset {offset} is past the end: the result of {json.dumps(call_id)} has "
            f"{len(text):,} characters; write an offset from 0 to {len(text)}",
        )
    if pattern is None:
        return request.reply(_slice(text, call_id, offset, limit))
    if len(pattern) > MAX_PATTERN:
        return _error(
            request,
            f"the pattern has {len(pattern):,} characters; write one of at most {MAX_PATTERN}",
        )
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        return _error(
            request,
            f"the pattern {json.dumps(pattern)} does not compile ({_reason(exc)}); write an RE2 "
            'regular expression (no look-around or back-references), e.g. "error|warning"',
        )
    found = await anyio.to_thread.run_sync(
        _search, compiled, text, offset, limit, abandon_on_cancel=True
    )
    return request.reply(_matches(found, call_id, pattern, text, offset))


def _slice(text: str, call_id: str, offset: int, limit: int) -> str:
    end = min(len(text), offset + limit)
    where = f"characters {offset:,} to {end:,} of {len(text):,} of the result of call {call_id}"
    if end < len(text):
        onward = f"read_tool_result(call_id={json.dumps(call_id)}, offset={end})"
        return f"[{where}; {onward} reads on]\n{text[offset:end]}"
    return f"[{where}: its end]\n{text[offset:end]}"


@attrs.frozen
class _Found:
    """What one search found: the lines ``(number, text)``, and where it stopped early
    (``stopped_at``, a character offset, with ``why``) or ``None`` when it reached the end."""

    lines: tuple[tuple[int, str], ...]
    stopped_at: int | None
    why: str = ""


def _search(compiled: Any, text: str, offset: int, room: int) -> _Found:
    """In a worker thread: the lines from ``offset`` on that match, within ``room``
    characters shown and :data:`SEARCH_SECONDS`. RE2 runs in time linear in each line."""
    deadline = time.monotonic() + SEARCH_SECONDS
    number = text.count("\n", 0, offset) + 1
    start = offset
    lines: list[tuple[int, str]] = []
    used = 0
    while True:
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end]
        if compiled.search(line) is not None:
            shown = line if len(line) <= MAX_LINE else line[:MAX_LINE] + "…"
            used += len(shown) + len(str(number)) + 8
            if used > room and lines:
                return _Found(tuple(lines), start, "more lines match")
            lines.append((number, shown))
        if end == len(text):
            return _Found(tuple(lines), None)
        start, number = end + 1, number + 1
        if number % 256 == 0 and time.monotonic() > deadline:
            return _Found(tuple(lines), start, f"the search stopped after {SEARCH_SECONDS:g} s")


def _matches(found: _Found, call_id: str, pattern: str, text: str, offset: int) -> str:
    count = len(found.lines)
    head = (
        f"[{count} line{'s' if count != 1 else ''} of the result of call {call_id} "
        f"({len(text):,} characters) from character {offset:,} match {json.dumps(pattern)}]"
    )
    body = "\n".join(f"line {number}: {line}" for number, line in found.lines)
    parts = [head, body] if body else [head]
    if found.stopped_at is not None:
        onward = (
            f"read_tool_result(call_id={json.dumps(call_id)}, offset={found.stopped_at}, "
            f"pattern={json.dumps(pattern)})"
        )
        parts.append(f"[{found.why}: {onward} goes on]")
    return "\n".join(parts)


def _reason(exc: Exception) -> str:
    """RE2's own words for a pattern it does not take (it gives them as bytes)."""
    said = exc.args[0] if exc.args else exc
    return said.decode(errors="replace") if isinstance(said, bytes) else str(said)


def _error(request: ToolRequest, text: str) -> ChatMessage:
    return request.reply(f"Error: {text}")


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a model's bad pattern is its answer, not a line on stderr
    # RE2 compiles holding the GIL, in time about its program's size: 1 MB keeps one
    # compile to milliseconds (as the served schema patterns, raf.serve._schema).
    options.max_mem = 1 << 20
    return options


_OPTIONS: Final = _options()
