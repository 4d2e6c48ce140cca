"""The marker of a tool result cut to its preview: how it is written, and how it is read.

A result that :class:`raf.ToolOutputLimit` cut carries one marker, in the
place of what was left out: how much, where, and (when the full result is
kept with the session) the ``read_tool_result`` call that reads it back. The
marker is written once, from the result's own figures, so the message is the
same bytes on every later call. The agent (whether to offer the read tool),
the context ledger (``raf run --trace=context``) and whatever else places or
clears results read it here.
"""

from __future__ import annotations

import json
import re
from typing import Final

import attrs

__all__: list[str] = []

#: The name of the tool that reads a spilled result back.
READ_TOOL_NAME: Final = "read_tool_result"
#: What every text that points at a spilled result holds: the read tool's call.
_READ_CALL: Final = f"{READ_TOOL_NAME}(call_id="

_MARKER: Final = re.compile(
    r"\[raf: ([\d,]+) characters left out \(characters ([\d,]+) to ([\d,]+) of ([\d,]+)\)"
    r"(?:; read them with " + re.escape(_READ_CALL) + r"(\"(?:[^\"\\]|\\.)*\"), offset=\d+\))?"
)


@attrs.frozen(slots=True)
class CutResult:
    """What a marker says of the result it stands in: ``call_id`` (``None`` when the
    full result was not kept), the result's ``total`` characters, and the characters
    ``start`` to ``end`` that were left out."""

    call_id: str | None
    total: int
    start: int
    end: int

    @property
    def left_out(self) -> int:
        """How many characters were left out."""
        return self.end - self.start


#: The longest call id a marker names, as JSON (with its quotes): a longer one is named
#: by :func:`spill_key`, so that the marker fits any ``ToolOutputLimit``'s room.
MAX_NAMED_ID: Final = 66


def spill_key(call_id: str) -> str:
    """The key a cut result is kept under and its marker names: the call's id, or, for an
    id longer than 64 characters as JSON, a short digest of it (the same every time).

    >>> spill_key("call_1")
    'call_1'
    >>> spill_key("x" * 100)
    'raf-spill-09ecb6ebc8bcefc733f6f2ec'
    """
    if len(json.dumps(call_id)) <= MAX_NAMED_ID:
        return call_id
    import hashlib  # here: `import raf` does not import it

    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"raf-spill-{digest[:24]}"


def cut_marker(call_id: str | None, total: int, start: int, end: int) -> str:
    """The marker for characters ``start`` to ``end`` of a result of ``total`` left out.

    ``call_id`` names the spilled result (then the marker says how to read it
    back); ``None`` says the full result was not kept.

    >>> cut_marker("call_1", 20000, 1000, 19000)
    '[raf: 18,000 characters left out (characters 1,000 to 19,000 of 20,000); read them with read_tool_result(call_id="call_1", offset=1000)]'
    >>> parse_cut(cut_marker("call_1", 20000, 1000, 19000))
    CutResult(call_id='call_1', total=20000, start=1000, end=19000)
    """  # noqa: E501
    figures = f"(characters {start:,} to {end:,} of {total:,})"
    said = f"[raf: {end - start:,} characters left out {figures}"
    if call_id is None:
        return said + "; the full result was not kept]"
    # The id as a JSON string: the model writes it back as the call's JSON argument.
    return f"{said}; read them with {_READ_CALL}{json.dumps(call_id)}, offset={start})]"


def parse_cut(text: str | None) -> CutResult | None:
    """The first marker in ``text``, or ``None`` when it holds none."""
    if not text or "[raf: " not in text:
        return None
    found = _MARKER.search(text)
    if found is None:
        return None
    left, start, end, total, quoted = found.groups()
    call_id = None
    if quoted is not None:
        try:
            call_id = json.loads(quoted)
        except ValueError:
            return None
    figures = [int(value.replace(",", "")) for value in (total, start, end)]
    if figures[2] - figures[1] != int(left.replace(",", "")):
        return None  # not a marker raf wrote
    return CutResult(call_id, *figures)


def mentions_spill(text: str | None) -> bool:
    """Whether ``text`` points at a spilled result (it holds a ``read_tool_result`` call):
    while one is in what the model sees, the agent offers it the read tool."""
    return text is not None and _READ_CALL in text
