"""Server-sent events: the ``data`` of each event of a ``text/event-stream``, decoded
from its text as it comes, as the HTML standard's parser reads it."""

from __future__ import annotations

import re
from typing import Final

__all__: list[str] = []

# A line ends at CRLF, LF or CR.
_LINE_END: Final = re.compile(r"\r\n|\r|\n")


class EventData:
    """The data of the events a stream's text completes, a piece of text at a time.

    Lines end at CRLF, LF or CR, a CRLF split between two pieces included; a
    line that opens with ``:`` is a comment; the ``data`` lines of an event
    are joined with LF and the event is dispatched at the empty line after
    them (an event with no ``data`` line is none). The other fields
    (``event``, ``id``, ``retry``) are not read: raf reads each event's type
    from its data. An event the stream ends before its empty line is not
    dispatched (the standard's rule; the reader then finds its answer
    incomplete).

    >>> events = EventData()
    >>> events.feed('event: delta\\ndata: {"a": 1}\\n\\n: keep-alive\\n\\ndata: x\\r')
    ['{"a": 1}']
    >>> events.feed("\\ndata: y\\n\\n")
    ['x\\ny']
    """

    __slots__ = ("_data", "_line", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._data: list[str] = []  # the data lines of the event being read
        self._line: list[str] = []  # the pieces of a line not ended yet
        self._skip_lf = False  # the last piece ended with CR: a LF opening the next is its end
        self._started = False

    def feed(self, text: str) -> list[str]:
        """The data of each event that ``text``, the next piece of the stream, completes."""
        if not text:
            return []
        if not self._started:
            self._started = True
            text = text.removeprefix("\ufeff")  # a byte order mark opening the stream
        start = 0
        if self._skip_lf:
            self._skip_lf = False
            start = 1 if text.startswith("\n") else 0
        completed: list[str] = []
        for end in _LINE_END.finditer(text, start):
            self._line.append(text[start : end.start()])
            start = end.end()
            line = "".join(self._line)
            self._line.clear()
            if not line:  # the event's end
                if self._data:
                    completed.append("\n".join(self._data))
                    self._data.clear()
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                if name == "data":
                    self._data.append(value.removeprefix(" "))
        if start < len(text):
            self._line.append(text[start:])
        else:
            self._skip_lf = text.endswith("\r")
        return completed
