"""Assembly: what a stream of updates amounts to, kept as the updates come, not the updates."""

from __future__ import annotations

import attrs

from raf._values.messages import AgentResponse, Update

__all__: list[str] = []  # the run's own: no public name


class Assembly:
    """The response that the updates :meth:`add`-ed so far amount to (:meth:`response`:
    :meth:`raf.AgentResponse.from_updates` of them).

    It keeps the answer, not the updates: the text as its pieces, the other
    updates without their vendor chunk (``Update.raw``). A run that kept
    every update kept every chunk, some seven times the size of the stream on
    the wire when a server sends its text a character at a time.

    >>> assembly = Assembly()
    >>> for piece in ("Hel", "lo"):
    ...     assembly.add(Update.of_text(piece, raw={"a vendor's": "chunk"}))
    >>> assembly.response().text
    'Hello'
    """

    __slots__ = ("_kept", "_text")

    def __init__(self) -> None:
        self._kept: list[Update] = []  # the updates but text, without their raw
        self._text: list[str] = []  # the text pieces since the last other update

    def add(self, update: Update) -> None:
        """Take ``update`` into the response."""
        if update.kind == "text":
            self._text.append(update.text)
            return
        if update.kind == "agent":
            return  # a child's (an agent called as a tool): none of this run's answer
        self._flush()
        self._kept.append(update if update.raw is None else attrs.evolve(update, raw=None))

    def response(self) -> AgentResponse:
        """The response so far (``raw`` is ``None``); the assembly may go on after it."""
        self._flush()
        return AgentResponse.from_updates(self._kept)

    def _flush(self) -> None:
        # The pieces as one text update: from_updates joins the text of a turn, whatever
        # other updates come between its pieces.
        if self._text:
            self._kept.append(Update.of_text("".join(self._text)))
            self._text = []
