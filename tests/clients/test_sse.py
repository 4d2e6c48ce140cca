"""The server-sent event reader both OpenAI clients share: events, lines, and its cost."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from raf._clients._sse import EventReader

pytestmark = pytest.mark.anyio


class Body:
    """A response whose body is ``chunks``; ``on_chunk(n)`` runs before chunk ``n`` goes out."""

    def __init__(self, chunks: list[bytes], on_chunk: Callable[[int], None] | None = None) -> None:
        self.chunks = chunks
        self.on_chunk = on_chunk
        self.closed = False

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        for n, chunk in enumerate(self.chunks):
            if self.on_chunk is not None:
                self.on_chunk(n)
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


def reader_for(body: Body, limit: int = 1 << 30) -> EventReader:
    return EventReader(
        body,
        limit,
        too_large=lambda: ValueError("too large"),
        http_error=lambda exc: exc,
    )


async def events_of(chunks: list[bytes]) -> list[str]:
    reader = reader_for(Body(chunks))
    found: list[str] = []
    while (events := await reader.next_events()) is not None:
        found += events
    await reader.aclose()
    return found


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: a\n\ndata: b\n\n"],
        [b"data: a\n", b"\ndata:", b" b\n\n"],
        [b"da", b"ta: a\r\n\r\n", b"data: b"],
        [b": keep-alive\n\nevent: x\ndata: a\n\n", b"data: b\n", b"\n"],
        [bytes([c]) for c in b"data: a\n\ndata: b\n\n"],
    ],
)
async def test_events_whatever_the_chunks(chunks: list[bytes]) -> None:
    assert await events_of(chunks) == ["a", "b"]


async def test_data_lines_of_one_event_are_joined_with_newlines() -> None:
    assert await events_of([b"data: one\ndata: two\n\n"]) == ["one\ntwo"]


async def test_a_long_line_is_kept_as_its_chunks_and_joined_once() -> None:
    """Linear in the line's length: a line that comes in N chunks is held as those N
    chunks (never copied into one growing buffer per chunk, which costs N²/2 chunk
    copies: 32 MB took 5.75 s) and joined once, when its newline comes."""
    pieces = 2000
    chunks = [b"data: "] + [b"x" * 512] * pieces + [b"\n\n"]
    reader = reader_for(Body([]))
    held: list[int] = []

    def look(n: int) -> None:
        if n == len(chunks) - 1:  # the newline is about to come: what is held so far?
            held.append(len(reader._line))
            held.append(sum(map(len, reader._line)))

    reader = reader_for(Body(chunks, look))
    [event] = await reader.next_events() or []
    assert held == [pieces + 1, 6 + 512 * pieces]
    assert event == "x" * (512 * pieces)
    assert reader._line == []
