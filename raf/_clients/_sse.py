"""Server-sent events: the ``data`` of each event of a ``text/event-stream``, decoded
from its text as it comes, as the HTML standard's parser reads it."""

from __future__ import annotations

__all__: list[str] = []


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
        start, size = 0, len(text)
        if self._skip_lf:
            self._skip_lf = False
            start = 1 if text.startswith("\n") else 0
        completed: list[str] = []
        # The next LF and CR at or after start (-1: none left), each found once: str.find
        # runs at memory speed, where a regular expression walks the text a character at
        # a time (an event of megabytes, a tool call's arguments, comes in many pieces).
        lf = text.find("\n", start)
        cr = text.find("\r", start)
        while lf >= 0 or cr >= 0:
            end = lf if cr < 0 or 0 <= lf < cr else cr
            line = text[start:end]
            if self._line:  # the line began in an earlier piece
                line = "".join((*self._line, line))
                self._line.clear()
            self._event_line(line, completed)
            start = end + 2 if text.startswith("\r\n", end) else end + 1
            if 0 <= lf < start:
                lf = text.find("\n", start)
            if 0 <= cr < start:
                cr = text.find("\r", start)
        if start < size:
            self._line.append(text[start:])
        else:
            self._skip_lf = text.endswith("\r")
        return completed

    def _event_line(self, line: str, completed: list[str]) -> None:
        """Read one whole ``line``; the data of the event it ends goes in ``completed``."""
        if not line:  # the event's end
            if self._data:
                completed.append("\n".join(self._data))
                self._data.clear()
        elif not line.startswith(":"):  # not a comment
            name, _, value = line.partition(":")
            if name == "data":
                self._data.append(value.removeprefix(" "))
