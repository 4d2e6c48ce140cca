"""The Stainless SDK plumbing the OpenAI and Anthropic clients share: the SDK client
they build, the POST of a body raf wrote, the reading of its reply under a size bound,
and the SDK's and the HTTP stack's errors as raf's.

What can fail on a call takes ``where`` (``"OpenAI response (model 'm')"``, say): the
words that open its errors, so each client names its own API.
"""

from __future__ import annotations

import email.utils
import functools
import hashlib
import json
import math
import ssl
import time
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Protocol, TypedDict

import anyio
import httpx2

from raf._clients._overflow import overflow
from raf._values.messages import ChatMessage
from raf.errors import (
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
    from raf._values.options import ChatOptions

__all__: list[str] = []
#: The most of an upstream error's own text an error message quotes (a server's error
#: may be megabytes long).
MAX_QUOTED: Final = 1000


class Held(Protocol):
    """What the plumbing reads of a raf client on a Stainless SDK (``openai``,
    ``anthropic``): its model, the SDK client, and the bounds its class docstring
    describes (``timeout``, ``idle_timeout``, ``max_response_bytes``)."""

    model: str
    client: Any
    timeout: float | None
    idle_timeout: float | None
    max_response_bytes: int


class RequestOptions(TypedDict, total=False):
    """The options raf passes the SDK's ``post()`` with a request (keys of both SDKs'
    public ``RequestOptions``): what the ``timeout``, ``extra_headers`` and
    ``extra_query`` of the SDK's own methods become."""

    timeout: Any
    headers: dict[str, Any]
    params: dict[str, Any]


DEFAULT_TIMEOUT: Final = 60.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
#: The longest wait a server's ``Retry-After`` can ask for, in seconds (a week): a larger
#: ask, ``inf`` included, is clamped to it, so ``retry_after`` is always a finite number.
RETRY_AFTER_MAX: Final = 7 * 86_400.0


def sdk_client(
    owner: Held,
    sdk: ModuleType,
    kind: str,
    base_url: str | None,
    api_key: str | None,
    max_retries: object,
    client: Any,
) -> Any:
    """The SDK client of ``owner``, its keywords checked first (``ValueError`` naming
    the one that is wrong): ``client`` as given, or a ``kind`` (``"AsyncOpenAI"``,
    ``"AsyncAnthropic"``) of ``sdk`` that raf builds with the bound on error replies
    (:class:`BoundedErrors`)."""
    name, model, limit = type(owner).__name__, owner.model, owner.max_response_bytes
    if not isinstance(model, str) or not model:
        raise ValueError(f"{name}: model must be a non-empty str, got {model!r}")
    if type(max_retries) is not int or max_retries < 0:
        raise ValueError(f"{name}: max_retries must be an int >= 0, got {max_retries!r}")
    for keyword, value in (("timeout", owner.timeout), ("idle_timeout", owner.idle_timeout)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
        ):  # not value > 0 also refuses NaN
            raise ValueError(
                f"{name}: {keyword} must be a number of seconds > 0 or None, got {value!r}"
            )
    if type(limit) is not int or limit < 1:
        raise ValueError(f"{name}: max_response_bytes must be an int >= 1, got {limit!r}")
    if client is not None:
        if base_url is not None or api_key is not None:  # both belong to that client
            raise ValueError(
                f"{name}: pass base_url and api_key to the {kind} client you give "
                f"as client=, not to {name}"
            )
        return client
    transport = BoundedErrors(limit, sdk.DEFAULT_CONNECTION_LIMITS)
    try:
        built = getattr(sdk, kind)(
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            http_client=sdk.DefaultAsyncHttpxClient(transport=transport),
        )
    except sdk.APIError.__base__ as exc:  # the SDK's own error (OpenAIError): no key
        raise AuthenticationError(
            f"{name}({model!r}): cannot build the {kind} client: {exc}"
        ) from exc
    # The SDK's post() signs a request with its admin key when it has no API key (its
    # create() would not); raf's requests are model calls: never signed with an admin key.
    if getattr(built, "admin_api_key", None) and not built.api_key:
        key = f"{sdk.__name__.upper()}_API_KEY"
        raise AuthenticationError(
            f"{name}({model!r}): no API key (pass api_key= or set {key}); the admin key "
            f"the {kind} client found ({key.replace('_API_', '_ADMIN_')}) is not sent to the "
            "model API"
        )
    return built


async def call(
    owner: Held,
    sdk: ModuleType,
    path: str,
    body: dict[str, Any],
    options: RequestOptions,
    where: str,
) -> tuple[bytes, str]:
    """POST one request through ``owner``'s client and read its reply within its
    ``timeout`` (the SDK's retries included): the reply's body and content type."""
    with anyio.move_on_after(owner.timeout):
        response = await send(sdk, owner.client, path, body, options, where)
        data = await read_reply(response, owner.max_response_bytes, where)
        return data, response.headers.get("content-type", "")
    # Only the deadline's own cancellation lands here: any other one propagates.
    raise ChatTimeoutError(
        f"{where} did not finish within {owner.timeout} s "
        f"({type(owner).__name__}(timeout={owner.timeout}), the SDK's retries included)"
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
        return decoded_reply(response, request, content=data)


def decoded_reply(
    response: httpx2.Response,
    request: httpx2.Request,
    *,
    content: bytes | None = None,
    stream: httpx2.AsyncByteStream | None = None,
) -> httpx2.Response:
    """``response`` with the body raf has read and decoded itself (``content``, or a
    ``stream`` of decoded bytes): the headers that described the wire's body (its
    encoding, its length, its framing) no longer hold and are left out."""
    headers = [
        (key, value)
        for key, value in response.headers.multi_items()
        if key.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx2.Response(
        response.status_code,
        headers=headers,
        content=content,
        stream=stream,
        request=request,
        extensions=response.extensions,
    )


async def send(
    sdk: ModuleType,
    client: Any,
    path: str,
    body: dict[str, Any],
    options: RequestOptions,
    where: str,
) -> httpx2.Response:
    """POST ``body`` as JSON through ``client``, of the Stainless SDK ``sdk`` (auth,
    retries, HTTP errors); the reply, unread, so raf reads it under its own size bound.

    The SDK's documented way to send a body of one's own: ``client.post(path,
    cast_to=httpx.Response, ...)``, with ``stream=True`` so the SDK returns the
    response unread. The body is encoded here, not by the SDK's ``create`` (see
    :meth:`raf.OpenAIChatClient.request_body`), as ASCII JSON: a lone surrogate (from
    a reply) stays a valid escape.
    """
    try:
        content = json.dumps(body, separators=(",", ":"), allow_nan=False, default=_not_json)
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"{where}: a request option cannot be sent as JSON: {exc}") from exc
    try:
        response: httpx2.Response = await client.post(
            path, cast_to=httpx2.Response, content=content.encode(), options=options, stream=True
        )
    except sdk.APIError as exc:
        raise error_from_sdk(exc, where, sdk) from exc
    except TypeError as exc:
        # The Anthropic SDK's word for a client with no key: "Could not resolve authentication".
        if "authentication" not in str(exc):
            raise
        key = f"{sdk.__name__.upper()}_API_KEY"
        raise AuthenticationError(
            f"{where}: no API key (pass api_key= or set {key}): {exc}"
        ) from exc
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
        raise too_large(where, limit)
    return data


def too_large(where: str, limit: int) -> ChatProtocolError:
    """The error of a reply past ``max_response_bytes``."""
    return ChatProtocolError(
        f"{where}: the reply is larger than max_response_bytes={limit}; raf stopped reading it"
    )


def error_from_http(exc: Exception, where: str) -> ChatClientError:
    """An error of the HTTP stack while reading a reply, as a raf error."""
    if isinstance(exc, httpx2.TimeoutException):
        return ChatTimeoutError(f"{where} timed out reading the reply: {exc!r}")
    if isinstance(exc, httpx2.DecodingError):
        return ChatProtocolError(f"{where}: the reply cannot be decompressed: {exc}")
    return ChatConnectionError(f"{where}: the connection failed reading the reply: {exc!r}")


_BY_STATUS: Final[dict[int, type[ChatClientError]]] = {
    401: AuthenticationError,
    403: AuthenticationError,
    408: ChatTimeoutError,
    409: ServerError,
    429: RateLimitError,
}


def error_from_sdk(exc: Exception, where: str, sdk: ModuleType) -> ChatClientError:
    """The :class:`raf.ChatClientError` for an error of ``sdk``, a Stainless SDK module
    (``openai`` or ``anthropic``: their errors have the same names).

    An HTTP error carries the server's ``Retry-After`` (or ``retry-after-ms``)
    as ``retry_after`` in seconds; a prompt the server found too long is a
    :class:`raf.ContextOverflowError`.
    """
    if isinstance(exc, sdk.APITimeoutError):
        return ChatTimeoutError(f"{where} timed out: {exc}")
    if isinstance(exc, sdk.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        return ChatConnectionError(f"{where}: cannot reach {exc.request.url}: {exc}{cause}")
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        text = f"{where} failed with HTTP {status}: {exc.message:.{MAX_QUOTED}}"  # an excerpt
        retry_after = retry_after_seconds(exc.response.headers)
        too_long = overflow(exc.body, text, status) if 400 <= status < 500 else None
        if too_long is not None:
            return too_long
        kind = _BY_STATUS.get(status, ServerError if status >= 500 else BadRequestError)
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


def checked(message: object, index: int) -> ChatMessage:
    """``message``, at ``messages[index]`` of a call, checked before any of it is sent: a
    :class:`raf.ChatMessage`, and a tool message with the id of the call it answers."""
    if type(message) is not ChatMessage:
        raise BadRequestError(
            f"messages[{index}] must be a ChatMessage, got {type(message).__name__}"
        )
    if message.role == "tool" and message.tool_call_id is None:
        raise BadRequestError(
            f"messages[{index}]: a tool message needs a tool_call_id "
            "(the id of the call it answers)"
        )
    return message


def new_body(
    where: str, model: str, fields: dict[str, Any], extra: Mapping[str, Any]
) -> tuple[dict[str, Any], RequestOptions, dict[str, Any]]:
    """A request's body (``model`` and the ``fields`` that are not None), the SDK's
    request options, and the keys of ``options.extra`` for the body (``extra_body``
    merged in, as the SDK merges it; ``timeout``, ``extra_headers`` and ``extra_query``
    moved to the request options, where the SDK's methods put them: ``timeout``,
    ``headers``, ``params``), which the caller applies as its API allows."""
    body = {"model": model, **{key: value for key, value in fields.items() if value is not None}}
    request_options: RequestOptions = {}
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
        elif key == "extra_headers":
            request_options["headers"] = dict(value)
        else:
            request_options["params"] = dict(value)
    if not isinstance(model := keys.get("model", model), str):
        raise BadRequestError(f"{where}: model must be a str, got {model!r}")
    return body, request_options, keys


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
