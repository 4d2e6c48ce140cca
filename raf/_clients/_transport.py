"""The transport of the HTTP client raf builds for the SDK: the SDK's own, with error
replies read under a bound."""

from __future__ import annotations

import zlib
from typing import Final

import anyio
import httpx2

__all__: list[str] = []

#: The most of an error reply (4xx, 5xx) raf lets the SDK read: enough to quote it.
ERROR_REPLY_MAX: Final = 1024 * 1024


class BoundedErrors(httpx2.AsyncHTTPTransport):
    """The SDK's transport, reading an error reply itself, at most ``ERROR_REPLY_MAX``
    bytes (or ``max_response_bytes``) once decoded.

    The SDK reads an error reply whole to quote it; a hostile or broken server
    could make that gigabytes (a gzip bomb). The SDK gets a reply of the
    bounded bytes, already decoded (a longer one is cut: only its start is
    quoted).
    """

    def __init__(self, max_response_bytes: int) -> None:
        import openai

        super().__init__(limits=openai.DEFAULT_CONNECTION_LIMITS)
        self.cap = min(max_response_bytes, ERROR_REPLY_MAX)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        if response.status_code < 400:
            return response
        raw = bytearray()
        try:
            # Stop by cancelling: raised inside the HTTP stack's next read, it ends each of
            # its generators (breaking out would leave them to the garbage collector).
            with anyio.CancelScope() as stop:
                async for chunk in response.stream:  # type: ignore[union-attr]
                    if not stop.cancel_called:
                        raw += chunk
                        if len(raw) > self.cap:
                            stop.cancel()
        finally:
            await response.aclose()
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        headers = [
            (key, value)
            for key, value in response.headers.multi_items()
            if key.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx2.Response(
            response.status_code,
            headers=headers,
            content=_decode_capped(bytes(raw[: self.cap]), coding, self.cap),
            request=request,
            extensions=response.extensions,
        )


def _decode_capped(raw: bytes, coding: str, cap: int) -> bytes:
    """``raw`` decoded per its content-encoding, at most ``cap`` bytes of it."""
    if coding in ("", "identity"):
        return raw[:cap]
    if coding in ("gzip", "x-gzip", "deflate"):
        # gzip, a zlib stream, then raw deflate (servers send both as "deflate").
        for wbits in (16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS):
            try:
                return zlib.decompressobj(wbits).decompress(raw, cap)
            except zlib.error:
                continue
    return b""  # an encoding raf does not decode: the SDK then names the status only
