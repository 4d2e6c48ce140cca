"""Reading a streamed reply, for both OpenAI clients: the bound on each wait on the server,
and the ``data`` of each server-sent event under a size bound.

Each client words its own errors (a chat completion, a response): it passes them in.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import anyio

from raf._errors import ChatTimeoutError

__all__: list[str] = []

T = TypeVar("T")

#: How long a stream may go on after the model's answer is complete (chat completions'
#: finish_reason, Responses' response.completed) before raf stops reading it: the usage
#: may still come; a server that keeps the stream open must not turn an answer into a
#: timeout.
DRAIN_GRACE: Final = 1.0


class Budget:
    """The time a stream may wait on the server: ``idle`` seconds for each wait (the
    request until its reply starts, each read of the body), and, once :meth:`cap` was
    called, a total for all the waits left.

    Each wait runs under its bound, with no yield inside the scope, so the
    deadline never lands in the consumer's code and the time the consumer
    holds an update is not counted. Past it a wait raises
    :class:`raf.ChatTimeoutError` with the text ``expired``.
    """

    __slots__ = ("expired", "idle", "left")

    def __init__(self, idle: float | None, expired: str) -> None:
        self.idle = idle
        self.left: float | None = None
        self.expired = expired

    async def run(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await function(*args)`` within the bound of one wait."""
        left = self.left
        limit = self.idle if left is None else left if self.idle is None else min(left, self.idle)
        if limit is None:
            return await function(*args)
        started = anyio.current_time()
        with anyio.move_on_after(limit) as scope:
            try:
                return await function(*args)
            finally:
                if left is not None:
                    self.left = left - (anyio.current_time() - started)
        # Only the deadline's own cancellation lands here: any other one propagates.
        assert scope.cancelled_caught
        raise ChatTimeoutError(self.expired)

    def cap(self, seconds: float) -> None:
        """Leave at most ``seconds`` for all the waits left."""
        self.left = seconds if self.left is None else min(self.left, seconds)


class EventReader:
    """The ``data`` of each server-sent event of a response, read under a size bound.

    ``too_large()`` is the error past ``limit`` decoded bytes; ``http_error(exc)``
    the error for an error of the HTTP stack while reading.
    """

    __slots__ = (
        "_chunks",
        "_data",
        "_done",
        "_line",
        "http_error",
        "limit",
        "response",
        "size",
        "too_large",
    )

    def __init__(
        self,
        response: Any,
        limit: int,
        *,
        too_large: Callable[[], Exception],
        http_error: Callable[[Exception], Exception],
    ) -> None:
        self.response = response
        self.limit = limit
        self.too_large = too_large
        self.http_error = http_error
        self.size = 0
        self._chunks: AsyncIterator[bytes] = response.aiter_bytes()
        self._done = False
        # The pieces of the line not finished yet: kept as they came and joined once, when
        # its newline comes (a growing buffer copied per chunk is quadratic in its length).
        self._line: list[bytes] = []
        self._data: list[bytes] = []

    async def _next_bytes(self) -> bytes | None:
        """The next decoded piece of the body; ``None`` at its end."""
        import httpx2

        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._done = True
            return None
        except httpx2.HTTPError as exc:
            self._done = True  # the exception went through the stream's generators
            raise self.http_error(exc) from exc
        self.size += len(chunk)
        if self.size > self.limit:
            raise self.too_large()
        return chunk

    async def read_all(self) -> bytes:
        """The rest of the body (a reply that is not a stream)."""
        pieces, self._line = self._line, []
        while (chunk := await self._next_bytes()) is not None:
            pieces.append(chunk)
        return b"".join(pieces)

    async def next_events(self) -> list[str] | None:
        """The data (``data:`` lines joined) of the events that the next read completes,
        at least one; ``None`` at the end of the body.

        One call per read of the body, not per event: the caller's deadline
        scope is then paid once for all the events that came together. Linear
        in the body's length: each chunk is searched for its last newline once,
        and a line that spans chunks is joined once.
        """
        events: list[str] = []
        while not events:
            chunk = await self._next_bytes()
            if chunk is None:
                if self._line:  # a last line without its newline
                    self._lines(self._take_line(b""), events)
                if self._data:  # a last event without its blank line
                    events.append(self._event())
                return events or None
            cut = chunk.rfind(b"\n")
            if cut < 0:
                self._line.append(chunk)
                continue
            text = self._take_line(chunk[:cut]) if self._line else chunk[:cut]
            if cut + 1 < len(chunk):
                self._line.append(chunk[cut + 1 :])
            self._lines(text, events)
        return events

    def _take_line(self, end: bytes) -> bytes:
        """The held pieces and ``end``, joined: the held line is then empty."""
        self._line.append(end)
        text, self._line = b"".join(self._line), []
        return text

    def _lines(self, text: bytes, events: list[str]) -> None:
        """Read whole lines: an empty one ends an event."""
        for raw in text.split(b"\n"):
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data:
                    events.append(self._event())
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # Comments (": keep-alive"), "event:", "id:" and "retry:" lines carry no data.

    def _event(self) -> str:
        data, self._data = b"\n".join(self._data), []
        return data.decode("utf-8", "replace")

    async def aclose(self) -> None:
        """Stop reading and close the response (call shielded)."""
        if not self._done:
            # Stop inside the HTTP stack: a cancellation raised at its next read ends each
            # of its generators in turn; closing only the outer one from here would leave
            # the inner ones to the garbage collector (trio warns). Pieces already decoded
            # come first.
            with anyio.CancelScope() as stop:
                stop.cancel()
                with contextlib.suppress(Exception):
                    async for _ in self._chunks:
                        pass
            self._done = True
        await self.response.aclose()
