"""The OpenAI SDK plumbing both clients share: the SDK client they build, the POST of a
body raf wrote, the reading of its reply under a size bound, and the SDK's and the HTTP
stack's errors as raf's.

What can fail on a call takes ``where`` (``"OpenAI response (model 'm')"``, say): the
words that open its errors, so each client names its own API.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import math
import time
import zlib
from collections.abc import Mapping
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import anyio

from raf._errors import (
    AuthenticationError,
    BadRequestError,
    ChatClientError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    RateLimitError,
    ServerError,
)

if TYPE_CHECKING:
    import httpx2
    import openai

__all__: list[str] = []

# The SDK takes ~0.6 s to import; raf imports it only when a client is built.

DEFAULT_TIMEOUT: Final = 60.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
#: The longest wait a server's ``Retry-After`` can ask for, in seconds (a week): a larger
#: ask, ``inf`` included, is clamped to it, so ``retry_after`` is always a finite number.
RETRY_AFTER_MAX: Final = 7 * 86_400.0
#: The most of an error reply (4xx, 5xx) raf lets the SDK read: enough to quote it.
ERROR_REPLY_MAX: Final = 1024 * 1024


class SdkClient:
    """What both OpenAI clients are besides their API: the SDK client and its closing,
    the model, the call's ``timeout``, a stream's ``idle_timeout`` and the reply's
    ``max_response_bytes``.

    The arguments are checked (``ValueError``) and the SDK client built as
    :func:`sdk_client` says, the errors naming the subclass.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        max_retries: int,
        timeout: float | None,
        max_response_bytes: int,
        client: openai.AsyncOpenAI | None,
        idle_timeout: float | None = None,
    ) -> None:
        built, self._owns_client = sdk_client(
            type(self).__name__,
            model,
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            client=client,
        )
        _check_seconds(type(self).__name__, "idle_timeout", idle_timeout)
        self.model = model
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.max_response_bytes = max_response_bytes
        self.client: openai.AsyncOpenAI = built

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def sdk_client(
    name: str,
    model: object,
    *,
    base_url: str | None,
    api_key: str | None,
    max_retries: object,
    timeout: object,
    max_response_bytes: object,
    client: Any,
) -> tuple[Any, bool]:
    """The arguments both OpenAI clients share, checked; their SDK client, and whether raf
    built it (and so closes it).

    A client raf builds is the SDK's own HTTP client and defaults, plus the hook that
    bounds error replies (:func:`bound_error_reply`); a ``client=`` given is used as is.
    """
    import openai

    if not isinstance(model, str) or not model:
        raise ValueError(f"{name}: model must be a non-empty str, got {model!r}")
    if type(max_retries) is not int or max_retries < 0:
        raise ValueError(f"{name}: max_retries must be an int >= 0, got {max_retries!r}")
    _check_seconds(name, "timeout", timeout)
    if type(max_response_bytes) is not int or max_response_bytes < 1:
        raise ValueError(
            f"{name}: max_response_bytes must be an int >= 1, got {max_response_bytes!r}"
        )
    if client is not None:
        if base_url is not None or api_key is not None:
            raise ValueError(
                f"{name}: pass base_url and api_key to the AsyncOpenAI client you give "
                f"as client=, not to {name}"
            )
        return client, False
    try:
        http_client = openai.DefaultAsyncHttpxClient(
            event_hooks={
                "response": [partial(bound_error_reply, max_response_bytes=max_response_bytes)]
            }
        )
        built = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=max_retries, http_client=http_client
        )
    except openai.OpenAIError as exc:
        raise AuthenticationError(
            f"{name}({model!r}): cannot build the OpenAI client: {exc}"
        ) from exc
    return built, True


def _check_seconds(name: str, keyword: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0  # also refuses NaN
    ):
        raise ValueError(
            f"{name}: {keyword} must be a number of seconds > 0 or None, got {value!r}"
        )


async def bound_error_reply(response: Any, max_response_bytes: int) -> None:
    """Read an error reply here, at most ``ERROR_REPLY_MAX`` bytes once decoded.

    The SDK reads an error reply whole to quote it; a hostile or broken
    server could make that gigabytes (a gzip bomb). This hook of the HTTP
    client raf builds (both OpenAI clients use it) runs first: it reads the
    raw reply, decodes gzip and deflate itself with a bound, and leaves the
    SDK the bounded bytes (a longer reply is cut: only its start is quoted).
    """
    import httpx2

    if response.status_code < 400:
        return
    cap = min(max_response_bytes, ERROR_REPLY_MAX)
    raw = await _read_capped(response.aiter_raw(), cap)
    await response.aclose()
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    data = _decode_capped(raw, coding, cap)
    # The response now replays those bytes, as plain (already decoded) content.
    response.stream = httpx2.ByteStream(data)
    response.is_stream_consumed = False
    response.is_closed = False
    response.headers.pop("content-encoding", None)
    response.headers["content-length"] = str(len(data))


async def _read_capped(stream: Any, cap: int) -> bytes:
    """At most ``cap`` bytes of an async byte stream, read no further than needed."""
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(stream) as pieces:
        with anyio.CancelScope() as stop:  # see read_bounded: stop inside the stream
            async for chunk in pieces:
                if stop.cancel_called:
                    continue
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    stop.cancel()
    return b"".join(chunks)[:cap]


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


async def post(
    client: openai.AsyncOpenAI,
    path: str,
    body: dict[str, Any],
    request_options: dict[str, Any],
    where: str,
) -> httpx2.Response:
    """POST ``body`` as JSON through the SDK (auth, retries, HTTP errors); the reply,
    unread, so raf reads it under its own size bound.

    The body is encoded here, with ``json.dumps``, not by the SDK's ``create``,
    whose request transform walks every message (a quarter of a millisecond
    each). ASCII JSON: a lone surrogate (from a reply) stays a valid escape.
    """
    import httpx2
    import openai

    try:
        content = json.dumps(body, separators=(",", ":"), allow_nan=False, default=_not_json)
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"{where}: a request option cannot be sent as JSON: {exc}") from exc
    try:
        response: httpx2.Response = await client.post(  # type: ignore[call-overload]
            path,
            cast_to=httpx2.Response,
            content=content.encode(),
            options=request_options,
            stream=True,
        )
    except openai.OpenAIError as exc:
        raise error_from_sdk(exc, where) from exc
    return response


def _not_json(value: object) -> Any:
    if isinstance(value, Mapping):  # read-only mappings (schemas) are objects too
        return dict(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


async def read_reply(response: httpx2.Response, limit: int, where: str) -> bytes:
    """The whole decoded body of a reply that is not a stream, at most ``limit`` bytes;
    the response is closed whatever happens."""
    import httpx2

    try:
        return await read_bounded(response, limit, where)
    except httpx2.HTTPError as exc:
        raise error_from_http(exc, where) from exc
    finally:
        await close(response)


async def close(response: Any) -> None:
    """Close a response, bounded and shielded: returning the connection must not hang
    or be cut, also when the consumer left or the call is being cancelled."""
    with anyio.move_on_after(5, shield=True):
        await response.aclose()


async def read_bounded(response: Any, limit: int, where: str) -> bytes:
    """The decoded body of ``response``, refusing to hold more than ``limit`` bytes."""
    declared = response.headers.get("content-length")
    encoded = response.headers.get("content-encoding", "identity").strip().lower()
    # Checked before reading only when it is the decoded size (no content-encoding).
    if (
        declared is not None
        and declared.isdigit()
        and encoded == "identity"
        and int(declared) > limit
    ):
        raise too_large(where, limit, f"it declares {int(declared)} bytes")
    chunks: list[bytes] = []
    size = 0
    # httpx decompresses a chunk at a time in bounded pieces: a gzip bomb stops here.
    async with contextlib.aclosing(response.aiter_bytes()) as stream:
        with anyio.CancelScope() as stop:
            async for chunk in stream:
                if stop.cancel_called:
                    continue  # pieces already decoded before the cancellation lands
                size += len(chunk)
                if size > limit:
                    # Stop by cancelling, which is raised inside httpx's stream at its next
                    # read and ends each generator of it; closing the outer one from here
                    # would leave the inner ones to the garbage collector (trio warns).
                    stop.cancel()
                    continue
                chunks.append(chunk)
    if size > limit:
        raise too_large(where, limit, "it is larger")
    return b"".join(chunks)


def too_large(where: str, limit: int, detail: str) -> ChatProtocolError:
    """The error of a reply past ``max_response_bytes`` (``detail`` says how it showed)."""
    return ChatProtocolError(
        f"{where}: the reply is larger than "
        f"max_response_bytes={limit} ({detail}); raf stopped reading it"
    )


def error_from_http(exc: Exception, where: str) -> ChatClientError:
    """An error of the HTTP stack while reading a reply, as a raf error."""
    import httpx2

    if isinstance(exc, httpx2.TimeoutException):
        return ChatTimeoutError(f"{where} timed out reading the reply: {exc!r}")
    if isinstance(exc, httpx2.DecodingError):
        return ChatProtocolError(f"{where}: the reply cannot be decompressed: {exc}")
    return ChatConnectionError(f"{where}: the connection failed reading the reply: {exc!r}")


def error_from_sdk(exc: openai.OpenAIError, where: str) -> ChatClientError:
    """The :class:`raf.ChatClientError` for an OpenAI SDK error.

    An HTTP error carries the server's ``Retry-After`` (or ``retry-after-ms``)
    as ``retry_after`` in seconds.
    """
    import openai

    if isinstance(exc, openai.APITimeoutError):
        return ChatTimeoutError(f"{where} timed out: {exc}")
    if isinstance(exc, openai.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        return ChatConnectionError(f"{where}: cannot reach {exc.request.url}: {exc}{cause}")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        text = f"{where} failed with HTTP {status}: {exc.message}"
        retry_after = retry_after_seconds(exc.response.headers)
        kind: type[ChatClientError] = BadRequestError
        if status == 429:
            kind = RateLimitError
        elif status == 408:
            kind = ChatTimeoutError
        elif status == 409 or status >= 500:
            kind = ServerError
        elif status in (401, 403):
            kind = AuthenticationError
        return kind(text, status_code=status, retry_after=retry_after)
    return ChatClientError(f"{where} failed: {type(exc).__name__}: {exc}")


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """How long a server asks us to wait, in seconds, or ``None`` if it does not say.

    ``retry-after-ms`` (milliseconds, OpenAI's) wins over ``Retry-After``
    (seconds, or an HTTP date); a date in the past means 0; a value that
    cannot be read is ignored; an ask longer than :data:`RETRY_AFTER_MAX`
    (``inf`` included) is clamped to it.

    >>> retry_after_seconds({"retry-after": "2"}), retry_after_seconds({"retry-after-ms": "150"})
    (2.0, 0.15)
    >>> retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0)
    10.0
    """
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            if name == "retry-after":
                return _retry_after_date(value, now)
            continue
        if not math.isnan(seconds):
            return min(max(seconds, 0.0), RETRY_AFTER_MAX)
    return None


def _retry_after_date(value: str, now: float | None) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT even when it does not say so
        return None
    current = time.time() if now is None else now
    return min(max(when.timestamp() - current, 0.0), RETRY_AFTER_MAX)


# --- What both request bodies share ----------------------------------------------------

#: The ``tool_choice`` values that are words, not a tool's name.
TOOL_CHOICE_WORDS: Final = frozenset({"auto", "none", "required"})
#: Extra options that are how the request is sent, not what it says: the SDK's own.
TRANSPORT_EXTRA: Final = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})


def plain(value: Any) -> Any:
    """A copy of ``value`` in dicts and lists: schemas may hold read-only mappings and
    tuples, the wire wants dicts and lists."""
    return json.loads(json.dumps(value, default=_not_json))


def no_call_id(index: int) -> BadRequestError:
    """The error of a tool message with no ``tool_call_id``, at ``messages[index]``."""
    return BadRequestError(
        f"messages[{index}]: a tool message needs a tool_call_id (the id of the call it answers)"
    )


def not_a_message(index: int, message: object) -> BadRequestError:
    """The error of something else than a :class:`raf.ChatMessage` at ``messages[index]``."""
    return BadRequestError(f"messages[{index}] must be a ChatMessage, got {type(message).__name__}")


def transport_option(where: str, key: str, value: Any, request_options: dict[str, Any]) -> None:
    """``timeout``, ``extra_headers`` or ``extra_query`` of ``options.extra`` into the
    SDK's request options."""
    if key == "timeout":
        request_options["timeout"] = value
    elif not isinstance(value, Mapping):
        raise BadRequestError(
            f"{where}: extra option {key!r} must be a mapping, got {type(value).__name__}"
        )
    else:
        request_options["headers" if key == "extra_headers" else "params"] = dict(value)
