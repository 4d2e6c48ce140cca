"""The OpenAI SDK plumbing both clients share: the SDK client they build, the POST of a
body raf wrote, the reading of its reply under a size bound, and the SDK's and the HTTP
stack's errors as raf's.

What can fail on a call takes ``where`` (``"OpenAI response (model 'm')"``, say): the
words that open its errors, so each client names its own API.
"""

from __future__ import annotations

import collections
import email.utils
import functools
import hashlib
import json
import math
import ssl
import time
from collections.abc import Mapping, Sequence
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, Self, TypeVar

import anyio
import httpx2

from raf._clients._tokens import count_prompt, counted_with
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
    import openai

    from raf._values.messages import ChatMessage
    from raf._values.options import ChatOptions
    from raf._values.protocols import Tool

__all__: list[str] = []


class Closable(Protocol):
    """What raf asks of an SDK client besides its requests: that it closes."""

    async def close(self) -> None: ...


#: The SDK client a client holds.
C = TypeVar("C", bound=Closable)
T = TypeVar("T")

# The SDK takes ~2 s to import; raf imports it only when a client is built (httpx, whose
# transport raf's own extends, loads with the client modules).

DEFAULT_TIMEOUT: Final = 60.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
#: The longest wait a server's ``Retry-After`` can ask for, in seconds (a week): a larger
#: ask, ``inf`` included, is clamped to it, so ``retry_after`` is always a finite number.
RETRY_AFTER_MAX: Final = 7 * 86_400.0


class SdkClient(Generic[C]):
    """What raf's SDK clients are besides their API: the SDK client and its closing,
    the model, the call's ``timeout``, a stream's ``idle_timeout`` and the reply's
    ``max_response_bytes``, checked (``ValueError`` naming the subclass).

    A client raf builds is the SDK's own, its HTTP client the SDK's default with
    the bound on error replies (:class:`BoundedErrors`); a ``client=`` given is
    used as it is, and closed by whoever built it.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        idle_timeout: float | None = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        client: C | None = None,
    ) -> None:
        name = type(self).__name__
        if not isinstance(model, str) or not model:
            raise ValueError(f"{name}: model must be a non-empty str, got {model!r}")
        if type(max_retries) is not int or max_retries < 0:
            raise ValueError(f"{name}: max_retries must be an int >= 0, got {max_retries!r}")
        _check_seconds(name, "timeout", timeout)
        _check_seconds(name, "idle_timeout", idle_timeout)
        if type(max_response_bytes) is not int or max_response_bytes < 1:
            raise ValueError(
                f"{name}: max_response_bytes must be an int >= 1, got {max_response_bytes!r}"
            )
        if client is not None and (base_url is not None or api_key is not None):
            raise ValueError(
                f"{name}: pass base_url and api_key to the {self.SDK_CLIENT} client you give "
                f"as client=, not to {name}"
            )
        self._owns_client = client is None
        self.model = model
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self.max_response_bytes = max_response_bytes
        if client is None:
            client = self.new_client(base_url, api_key, max_retries, max_response_bytes)
        self.client: C = client

    #: What the SDK calls the client a ``client=`` gives (for the error naming it).
    SDK_CLIENT = "the SDK's"

    def new_client(
        self, base_url: str | None, api_key: str | None, max_retries: int, max_response_bytes: int
    ) -> C:
        """The SDK client raf builds when no ``client=`` is given."""
        raise NotImplementedError

    async def send(
        self, path: str, body: dict[str, Any], request_options: dict[str, Any], where: str
    ) -> httpx2.Response:
        """POST ``body`` (raf's JSON) through the SDK client; the reply, unread, so raf
        reads it under its own size bound."""
        raise NotImplementedError

    def sse_decoder(self) -> Any:
        """The SDK's decoder of server-sent events (``aiter_bytes`` of a byte stream)."""
        raise NotImplementedError

    async def _call(
        self, path: str, body: dict[str, Any], request_options: dict[str, Any], where: str
    ) -> tuple[bytes, str]:
        """POST one request and read its reply within ``timeout`` (the SDK's retries
        included): the reply's body and content type."""
        with anyio.move_on_after(self.timeout):
            response = await self.send(path, body, request_options, where)
            data = await read_reply(response, self.max_response_bytes, where)
            return data, response.headers.get("content-type", "")
        # Only the deadline's own cancellation lands here: any other one propagates.
        raise ChatTimeoutError(
            f"{where} did not finish within {self.timeout} s "
            f"({type(self).__name__}(timeout={self.timeout}), the SDK's retries included)"
        )

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


class OpenAISdkClient(SdkClient["openai.AsyncOpenAI"]):
    """An :class:`SdkClient` on ``openai.AsyncOpenAI``: both OpenAI clients."""

    SDK_CLIENT = "AsyncOpenAI"

    def count_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Tool] = ()) -> int:
        """The tokens of a prompt (``messages`` and the declarations of ``tools``) with the
        model's own encoding (``o200k_base``, ``cl100k_base``), read from the files the
        ``bpe-openai`` package ships (extra ``raf-agents[tokens]``): no network. An unknown
        model, or no ``bpe-openai``, counts with :func:`raf.approximate_tokens`."""
        return count_prompt(self.model, messages, tools)

    @property
    def token_encoding(self) -> str:
        """What :meth:`count_tokens` counts with: ``"o200k_base"``, ``"cl100k_base"`` or
        ``"approximate"``."""
        return counted_with(self.model)

    def new_client(
        self, base_url: str | None, api_key: str | None, max_retries: int, max_response_bytes: int
    ) -> openai.AsyncOpenAI:
        import openai

        try:
            return openai.AsyncOpenAI(
                base_url=base_url,
                api_key=api_key,
                max_retries=max_retries,
                http_client=openai.DefaultAsyncHttpxClient(
                    transport=BoundedErrors(max_response_bytes, openai.DEFAULT_CONNECTION_LIMITS)
                ),
            )
        except openai.OpenAIError as exc:
            raise AuthenticationError(
                f"{type(self).__name__}({self.model!r}): cannot build the OpenAI client: {exc}"
            ) from exc

    async def send(
        self, path: str, body: dict[str, Any], request_options: dict[str, Any], where: str
    ) -> httpx2.Response:
        return await post(self.client, path, body, request_options, where)

    def sse_decoder(self) -> Any:
        from openai._streaming import SSEDecoder

        return SSEDecoder()


def _check_seconds(name: str, keyword: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not value > 0  # also refuses NaN
    ):
        raise ValueError(
            f"{name}: {keyword} must be a number of seconds > 0 or None, got {value!r}"
        )


#: The most of an error reply (4xx, 5xx) raf lets the SDK read: enough to quote it.
ERROR_REPLY_MAX: Final = 1024 * 1024


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings (the system's certificates, ``SSL_CERT_FILE``), made once
    for every client raf builds: making them reads the whole certificate store, about 25 ms
    of CPU per client otherwise, and one context serves any number of connections."""
    return httpx2.create_ssl_context()


class BoundedErrors(httpx2.AsyncHTTPTransport):
    """The SDK's transport, reading an error reply itself, at most ``ERROR_REPLY_MAX``
    bytes (or ``max_response_bytes``) once decoded.

    The SDK reads an error reply whole to quote it; a hostile or broken server
    could make that gigabytes (a gzip bomb). The SDK gets a reply of the
    bounded bytes, already decoded (a longer one is cut: only its start is
    quoted).
    """

    def __init__(self, max_response_bytes: int, limits: httpx2.Limits) -> None:
        super().__init__(verify=tls_context(), limits=limits)
        self.cap = min(max_response_bytes, ERROR_REPLY_MAX)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await super().handle_async_request(request)
        if response.status_code < 400:
            return response
        try:
            data, _ = await read_bounded(response, self.cap)
        except httpx2.DecodingError:
            data = b""  # a reply raf cannot decode: the SDK then names the status only
        headers = [
            (key, value)
            for key, value in response.headers.multi_items()
            if key.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx2.Response(
            response.status_code,
            headers=headers,
            content=data,
            request=request,
            extensions=response.extensions,
        )


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


async def read_bounded(response: httpx2.Response, cap: int) -> tuple[bytes, bool]:
    """At most ``cap`` decoded bytes of ``response``, and whether it has more; the
    response is closed whatever happens (bounded and shielded)."""
    data = bytearray()
    try:
        # httpx decodes a chunk at a time in bounded pieces: a gzip bomb stops here. Stop
        # by cancelling: raised inside the HTTP stack's next read, it ends each of its
        # generators (breaking out would leave them to the garbage collector).
        with anyio.CancelScope() as stop:
            async for chunk in response.aiter_bytes():
                if not stop.cancel_called:
                    data += chunk
                    if len(data) > cap:
                        stop.cancel()
    finally:
        with anyio.move_on_after(5, shield=True):
            await response.aclose()
    return bytes(data[:cap]), len(data) > cap


async def read_reply(response: httpx2.Response, limit: int, where: str) -> bytes:
    """The whole decoded body of a reply that is not a stream, refusing to hold more than
    ``limit`` bytes."""
    try:
        data, more = await read_bounded(response, limit)
    except httpx2.HTTPError as exc:
        raise error_from_http(exc, where) from exc
    if more:
        raise too_large(where, limit, "it is larger")
    return data


def too_large(where: str, limit: int, detail: str) -> ChatProtocolError:
    """The error of a reply past ``max_response_bytes`` (``detail`` says how it showed)."""
    return ChatProtocolError(
        f"{where}: the reply is larger than "
        f"max_response_bytes={limit} ({detail}); raf stopped reading it"
    )


def error_from_http(exc: Exception, where: str) -> ChatClientError:
    """An error of the HTTP stack while reading a reply, as a raf error."""

    if isinstance(exc, httpx2.TimeoutException):
        return ChatTimeoutError(f"{where} timed out reading the reply: {exc!r}")
    if isinstance(exc, httpx2.DecodingError):
        return ChatProtocolError(f"{where}: the reply cannot be decompressed: {exc}")
    return ChatConnectionError(f"{where}: the connection failed reading the reply: {exc!r}")


def error_from_sdk(exc: Exception, where: str, sdk: ModuleType | None = None) -> ChatClientError:
    """The :class:`raf.ChatClientError` for an error of ``sdk``, a Stainless SDK module
    (``openai``, the default, or ``anthropic``: their errors have the same names).

    An HTTP error carries the server's ``Retry-After`` (or ``retry-after-ms``)
    as ``retry_after`` in seconds.
    """
    if sdk is None:
        import openai

        sdk = openai
    if isinstance(exc, sdk.APITimeoutError):
        return ChatTimeoutError(f"{where} timed out: {exc}")
    if isinstance(exc, sdk.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        return ChatConnectionError(f"{where}: cannot reach {exc.request.url}: {exc}{cause}")
    if isinstance(exc, sdk.APIStatusError):
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
            if name == "retry-after-ms":
                continue
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError, IndexError, OverflowError):
                return None
            if when.tzinfo is None:  # an HTTP date is GMT even when it does not say so
                return None
            seconds = when.timestamp() - (time.time() if now is None else now)
        if not math.isnan(seconds):
            return min(max(seconds, 0.0), RETRY_AFTER_MAX)
    return None


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


def new_body(
    where: str, model: str, fields: dict[str, Any], extra: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A request's body (``model`` and the ``fields`` that are not None), the SDK's
    request options, and the keys of ``options.extra`` for the body (``extra_body``
    merged in, as the SDK merges it; ``timeout``, ``extra_headers`` and ``extra_query``
    moved to the request options), which the caller applies as its API allows."""
    if not isinstance(model, str):
        raise BadRequestError(f"{where}: model must be a str, got {model!r}")
    body = {"model": model, **{key: value for key, value in fields.items() if value is not None}}
    request_options: dict[str, Any] = {"security": {"bearer_auth": True}}
    keys: dict[str, Any] = {}
    for key, value in extra.items():
        if key not in TRANSPORT_EXTRA:
            keys[key] = value
        elif key == "timeout":
            request_options["timeout"] = value
        elif not isinstance(value, Mapping):
            raise BadRequestError(
                f"{where}: extra option {key!r} must be a mapping, got {type(value).__name__}"
            )
        elif key == "extra_body":
            keys.update(value)
        else:
            request_options["headers" if key == "extra_headers" else "params"] = dict(value)
    if isinstance(keys.get("model", model), str):
        return body, request_options, keys
    raise BadRequestError(f"{where}: model must be a str, got {keys['model']!r}")


def prompt_cache_key(options: ChatOptions) -> str | None:
    """The ``prompt_cache_key`` of a call: the agent's name (when it has one) and the
    session id, hashed (sha256, 32 hex digits: the ids stay private and the key short);
    ``None`` outside a session. OpenAI routes the calls of one key to the same cache, so
    a session's calls find the prefix its earlier calls left there."""
    if options.session_id is None:
        return None
    owner = options.session_id
    if options.agent_name is not None:
        owner = f"{options.agent_name}\x00{owner}"
    return hashlib.sha256(owner.encode()).hexdigest()[:32]


def tool_choice(choice: str | Mapping[str, Any] | None, *, nested: bool) -> Any:
    """``options.tool_choice`` on the wire: a word as it is, a tool's name as the
    function it names (``nested`` under ``"function"``, as chat completions want it),
    a mapping as given."""
    if not isinstance(choice, str):
        return None if choice is None else plain(choice)
    if choice in TOOL_CHOICE_WORDS:
        return choice
    named = {"name": choice}
    return {"type": "function", "function": named} if nested else {"type": "function", **named}


#: How many assistant turns a client keeps for replay (reasoning, thinking), newest kept.
TURNS_KEPT: Final = 1024


def keep_turn(turns: collections.OrderedDict[str, T], key: str, turn: T) -> None:
    """Keep ``turn`` under ``key`` as the newest of at most :data:`TURNS_KEPT`."""
    turns[key] = turn
    turns.move_to_end(key)
    while len(turns) > TURNS_KEPT:
        turns.popitem(last=False)
