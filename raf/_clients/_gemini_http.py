"""Gemini's HTTP transport: every reply bounded in decoded bytes, and a stream's SSE
comment lines dropped before the google-genai SDK reads it.

The SDK reads a reply whole (and a stream for as long as it goes), so the
bound must sit below it, where the bytes come in: counted once decoded (a
gzip reply of 600 MB came back whole), a reply past ``max_response_bytes``
is a :class:`raf.errors.ChatProtocolError` raised through the SDK. The SDK's SSE
reader takes any line that is not ``data: ...`` for the start of an error
object, so a comment (``: keep-alive``, which SSE allows anywhere) failed
the stream: such lines never reach it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2

from raf._clients._sdk import BoundedErrors, decoded_reply, read_bounded, too_large

__all__: list[str] = []

_WHERE = "GeminiChatClient"


class BoundedTransport(BoundedErrors):
    """``BoundedErrors`` (an error reply read at most its bound), and a 200 reply too: a
    stream passed on chunk by chunk as it is decoded, a plain reply read whole, each at
    most ``max_response_bytes`` decoded bytes."""

    def __init__(self, max_response_bytes: int) -> None:
        super().__init__(
            max_response_bytes, httpx2.Limits(max_connections=100, max_keepalive_connections=20)
        )  # httpx's own
        self.limit = max_response_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        if response.status_code >= 400:
            return response  # read already, within the error bound
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return decoded_reply(response, request, stream=_Stream(response, self.limit))
        data, more = await read_bounded(response, self.limit)
        if more:
            raise too_large(_WHERE, self.limit)
        return decoded_reply(response, request, content=data)


class _Stream(httpx2.AsyncByteStream):
    """A stream's decoded bytes, at most ``limit`` of them, its comment lines left out."""

    def __init__(self, response: httpx2.Response, limit: int) -> None:
        self.response = response
        self.limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size, line = 0, bytearray()  # the line not yet ended
        async for chunk in self.response.aiter_bytes():
            size += len(chunk)
            if size > self.limit:
                raise too_large(_WHERE, self.limit)
            end = chunk.rfind(b"\n")
            if end < 0:
                line += chunk
                continue
            line += chunk[: end + 1]
            lines = bytes(line).splitlines(keepends=True)
            line = bytearray(chunk[end + 1 :])
            kept = b"".join(each for each in lines if not each.startswith(b":"))
            if kept:
                yield kept
        if line and not line.startswith(b":"):
            yield bytes(line)

    async def aclose(self) -> None:
        await self.response.aclose()
