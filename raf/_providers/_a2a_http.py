"""A2AAgentTool's HTTP transport: every reply read within a bound before the a2a-sdk keeps
it, and a compressed reply refused (it could inflate past any bound).

The SDK reads an agent's card whole and buffers an event until its blank line: a
300 MB event cost 1.7 GB before raf's bound on the answer's characters ever saw it.
Imported with the a2a extra (httpx is the SDK's HTTP client).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import httpx

from raf.errors import ToolError

__all__: list[str] = []

#: The bytes of an agent's card read at most.
MAX_CARD_BYTES: Final = 1024 * 1024


class BoundedTransport(httpx.AsyncHTTPTransport):
    """An httpx transport whose every reply is read within a bound before the SDK keeps it:
    the card's at :data:`MAX_CARD_BYTES`, each event of a stream's (the bytes between two
    blank lines) and any other reply's at ``limit``; a compressed reply is refused."""

    def __init__(self, url: str, limit: int) -> None:
        super().__init__()
        self.url = url
        self.limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            await response.aclose()
            raise ToolError(
                f"the agent at {self.url} sent a {encoding!r:.40}-encoded reply, not the "
                "uncompressed one raf asked for"
            )
        card = request.url.path.endswith("/agent-card.json")
        events = response.headers.get("content-type", "").startswith("text/event-stream")
        what = "its card" if card else ("an event" if events else "a reply")
        capped = _Capped(
            response, MAX_CARD_BYTES if card else self.limit, events, f"{self.url}: {what}"
        )
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=capped,
            extensions=response.extensions,
        )


class _Capped(httpx.AsyncByteStream):
    """A reply's bytes, raising a :class:`ToolError` past ``limit`` (with ``events``: past
    ``limit`` bytes in one event, the bytes since the last blank line)."""

    def __init__(self, response: httpx.Response, limit: int, events: bool, what: str) -> None:
        self.response = response
        self.limit = limit
        self.events = events
        self.what = what

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size, last = 0, b""
        async for chunk in self.response.aiter_raw():
            if self.events:
                joined = last + chunk  # a blank line split over two chunks is seen too
                end = max(joined.rfind(b"\n\n"), joined.rfind(b"\n\r\n"))
                size = len(joined) - end - 2 if end >= 0 else size + len(chunk)
                last = chunk[-2:]
            else:
                size += len(chunk)
            if size > self.limit:
                raise ToolError(
                    f"the agent at {self.what} is over {self.limit} bytes; raf stopped reading"
                )
            yield chunk

    async def aclose(self) -> None:
        await self.response.aclose()
