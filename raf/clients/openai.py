"""OpenAIChatClient: a chat model behind the OpenAI chat completions API."""

from __future__ import annotations

import contextlib
import email.utils
import json
import json.encoder
import math
import time
import urllib.parse
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import anyio

from raf.clients._sse import Budget, EventReader
from raf.clients._wire import NO_KEYS, RecentBodies, WireCache, utf8
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
from raf.messages import AgentResponse, ChatMessage, ToolCall, Update, Usage
from raf.options import ChatOptions
from raf.tools import Tool

if TYPE_CHECKING:
    import httpx2
    import openai

__all__ = [
    "OpenAIChatClient",
    "error_from_sdk",
    "message_json",
    "message_to_wire",
    "messages_json",
    "response_from_reply",
    "retry_after_seconds",
    "tool_to_wire",
]

# The SDK takes ~0.6 s to import; raf imports it only when a client is built.
_TOOL_CHOICE_WORDS: Final = frozenset({"auto", "none", "required"})
# Options that would make the server answer with a stream, which complete() cannot read.
_REFUSED_EXTRA: Final = frozenset({"stream", "stream_options"})
# Extra options that are how the request is sent, not what it says: the SDK's own.
_TRANSPORT_EXTRA: Final = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})

# The most of an error reply (4xx, 5xx) raf lets the SDK read: enough to quote it.
_ERROR_REPLY_MAX: Final = 1024 * 1024
# What a streamed call adds to its body: the usage comes in a last chunk of its own.
_STREAM_TAIL: Final = b',"stream":true,"stream_options":{"include_usage":true}'


DEFAULT_TIMEOUT: Final = 60.0
DEFAULT_MAX_RESPONSE_BYTES: Final = 64 * 1024 * 1024
_MISSING: Final = object()
# How much of a reply that is not JSON an error message quotes.
_QUOTE: Final = 120


class OpenAIChatClient:
    """A :class:`raf.ChatClient` on ``openai.AsyncOpenAI`` (chat completions, tools).

    ``model`` is used unless a run's ``AgentRunOptions.model`` names another.
    ``base_url`` and ``api_key`` default to the ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY`` environment variables, as with the SDK itself, so any
    OpenAI-compatible server works. ``max_retries`` is the SDK's own retry
    budget for rate limits, timeouts and server errors; set it to ``0`` when a
    :class:`raf.RetryMiddleware` does the retrying. ``client`` is an
    ``AsyncOpenAI`` you built yourself (proxies, headers); raf then leaves
    closing it to you.

    ``timeout`` bounds each whole call in seconds, the SDK's retries and the
    reading of the reply included (``None``: no bound); past it the call
    raises :class:`raf.errors.ChatTimeoutError`. ``max_response_bytes`` bounds
    the reply's size once decompressed; past it the call raises
    :class:`raf.ChatProtocolError` without reading further.

    :meth:`stream` sends the turn as it comes (a :class:`raf.StreamingChatClient`):
    a streamed run uses it.

    Failures raise :class:`raf.ChatClientError` subclasses whose ``retryable``
    says whether trying again can help; the SDK's exception is ``__cause__``.
    A reply that is not a well-formed chat completion is a
    :class:`raf.ChatProtocolError` naming the field. Close the client with
    ``await client.aclose()`` or ``async with``::

        async with OpenAIChatClient("gpt-4o-mini") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        self.model = model
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        client, self._owns_client = sdk_client(
            "OpenAIChatClient",
            model,
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            client=client,
        )
        self.client: openai.AsyncOpenAI = client
        # The messages and message chunks of the last bodies sent (see request_body).
        self._bodies = RecentBodies(_messages_run)

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one chat completion request and return the model's turn."""
        model, body, request_options = self.request_body(messages, options)
        with anyio.move_on_after(self.timeout):
            data, content_type = await self._post(body, request_options, model)
            return response_from_reply(data, content_type, model)
        # Only the deadline's own cancellation lands here: any other one propagates.
        raise ChatTimeoutError(
            f"OpenAI chat completion (model {model!r}) did not finish within {self.timeout} s "
            "(OpenAIChatClient timeout=, the SDK's retries included)"
        )

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """Send one chat completion request with ``stream: true``; the turn, update by update.

        Text deltas are sent as they come; the tool calls, assembled from
        their deltas by ``index``, once the model finished (only then are
        their arguments known to be complete); the usage last (the request
        asks for it with ``stream_options.include_usage``). What the updates
        assemble to equals what :meth:`complete` returns for the same answer.

        A stream that ends before the model's ``finish_reason``, or whose
        connection breaks, is a :class:`raf.ChatConnectionError` (a truncated
        answer is never passed off as complete); a chunk that is not a chat
        completion chunk is a :class:`raf.ChatProtocolError`; HTTP errors map
        as for :meth:`complete`. ``timeout`` bounds the time spent waiting on
        the server (the time a consumer holds an update does not count), and
        ``max_response_bytes`` the size of the whole stream. The HTTP
        response is closed whatever ends the stream, ``aclose()`` included.
        """
        model, body, request_options = self._request_body(messages, options, _STREAM_TAIL)
        budget = Budget(
            self.timeout,
            f"OpenAI chat completion stream (model {model!r}) did not finish within "
            f"{self.timeout} s of waiting on the server (OpenAIChatClient timeout=, the SDK's "
            "retries included)",
        )
        response = await budget.run(self._open, body, request_options, model)
        reader = EventReader(
            response,
            self.max_response_bytes,
            too_large=partial(_too_large, model, self.max_response_bytes, "it is larger"),
            http_error=partial(_error_from_http, model=model),
        )
        try:
            content_type = response.headers.get("content-type", "")
            if not content_type.startswith("text/event-stream"):
                # A server that ignores "stream" answers with one chat completion: its updates.
                data = await budget.run(reader.read_all)
                for update in response_from_reply(data, content_type, model).to_updates():
                    yield update
                return
            turn = _StreamedTurn(model)
            while (events := await budget.run(reader.next_events)) is not None:
                for event in events:
                    for update in turn.feed(event):
                        yield update
            for update in turn.finish():
                yield update
        finally:
            # Bounded and shielded: returning the connection must not hang or be cut, also
            # when the consumer left (aclose) or the run is being cancelled.
            with anyio.move_on_after(5, shield=True):
                await reader.aclose()

    async def _open(
        self, body: bytes, request_options: dict[str, Any], model: str
    ) -> httpx2.Response:
        """POST a streamed call's body through the SDK; the response, its body unread."""
        import httpx2
        import openai

        try:
            response: httpx2.Response = await self.client.post(  # type: ignore[call-overload]
                self._path(model),
                cast_to=httpx2.Response,
                content=body,
                options=request_options,
                stream=True,
            )
        except openai.OpenAIError as exc:
            raise error_from_sdk(exc, model) from exc
        return response

    def request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> tuple[str, bytes, dict[str, Any]]:
        """The model, the JSON body and the SDK request options of one call.

        The body is built here, not by the SDK's ``create``: its request
        transform walks every message (a quarter of a millisecond each). Each
        message's JSON is cached (see :func:`message_json`), and so are the
        message parts of this client's last few bodies: a turn whose messages
        extend an earlier call's (the next turn of a conversation, the next
        call of a tool loop) costs its new messages and one copy.

        ``options.extra`` is applied last: ``timeout`` (the SDK's per-attempt
        timeout), ``extra_headers``, ``extra_query`` and ``extra_body`` as the
        SDK understands them, any other key into the body.
        """
        return self._request_body(messages, options, b"")

    def _request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions, tail: bytes
    ) -> tuple[str, bytes, dict[str, Any]]:
        """:meth:`request_body`, with ``tail`` (``b',"key":value'``) closing the body."""
        head: dict[str, Any] = {"model": options.model or self.model}
        if options.tools:
            head["tools"] = [tool_to_wire(t) for t in options.tools]
        if options.temperature is not None:
            head["temperature"] = options.temperature
        if options.max_tokens is not None:
            head["max_tokens"] = options.max_tokens
        if options.tool_choice is not None:
            head["tool_choice"] = _tool_choice(options.tool_choice)
        request_options: dict[str, Any] = {"security": {"bearer_auth": True}}
        for key, value in options.extra.items():
            if key in _REFUSED_EXTRA:
                if value:
                    raise BadRequestError(
                        f"OpenAIChatClient: extra option {key!r} is not supported; "
                        "stream a run instead (agent.stream(...) or on_update=)"
                    )
                if tail:  # a streamed call says "stream" itself: no second key
                    continue
            if key == "messages":
                raise BadRequestError(
                    "OpenAIChatClient: extra option 'messages' is not allowed; "
                    "the messages are the run's"
                )
            if key in _TRANSPORT_EXTRA:
                _transport_option(key, value, head, request_options)
            else:
                head[key] = value
        model = head["model"]
        if not isinstance(model, str):
            raise BadRequestError(f"OpenAIChatClient: model must be a str, got {model!r}")
        try:
            head_json = _dumps(head)
        except (TypeError, ValueError) as exc:
            raise BadRequestError(
                f"OpenAIChatClient: a request option cannot be sent as JSON: {exc}"
            ) from exc
        head_bytes = head_json.encode("utf-8", "backslashreplace")
        pieces: list[bytes] = [head_bytes[:-1], b',"messages":[']
        for chunk in self._bodies.chunks(messages):
            pieces += (chunk, b",")
        if pieces[-1] == b",":
            pieces.pop()
        pieces += (b"]", tail, b"}")
        # One copy of a body that can be megabytes long.
        return model, b"".join(pieces), request_options

    async def _post(
        self, body: bytes, request_options: dict[str, Any], model: str
    ) -> tuple[bytes, str]:
        """POST the body through the SDK (auth, retries, HTTP errors); the reply, bounded."""
        import httpx2
        import openai

        try:
            # cast_to=Response and stream=True: the SDK hands back the unread reply,
            # so raf reads it under its own size bound and parses it itself.
            response: httpx2.Response = await self.client.post(  # type: ignore[call-overload]
                self._path(model),
                cast_to=httpx2.Response,
                content=body,
                options=request_options,
                stream=True,
            )
        except openai.OpenAIError as exc:
            raise error_from_sdk(exc, model) from exc
        try:
            return await _read_bounded(response, self.max_response_bytes, model), (
                response.headers.get("content-type", "")
            )
        except httpx2.HTTPError as exc:
            raise _error_from_http(exc, model) from exc
        finally:
            # Bounded and shielded: returning the connection must not hang or be cut.
            with anyio.move_on_after(5, shield=True):
                await response.aclose()

    def _path(self, model: str) -> str:
        """The request path: Azure's client finds the deployment in a JSON body the
        SDK encodes, which raf's body is not, so raf names it as the SDK would."""
        import openai

        if isinstance(self.client, openai.AsyncAzureOpenAI) and "/deployments" not in str(
            self.client.base_url.path
        ):
            return f"/deployments/{urllib.parse.quote(model, safe='')}/chat/completions"
        return "/chat/completions"

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> OpenAIChatClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIChatClient(model={self.model!r}, base_url={str(self.client.base_url)!r})"


def _transport_option(
    key: str, value: Any, head: dict[str, Any], request_options: dict[str, Any]
) -> None:
    if key == "timeout":
        request_options["timeout"] = value
        return
    if not isinstance(value, Mapping):
        raise BadRequestError(
            f"OpenAIChatClient: extra option {key!r} must be a mapping, got {type(value).__name__}"
        )
    if key == "extra_body":
        if "messages" in value:
            raise BadRequestError(
                "OpenAIChatClient: extra_body may not hold 'messages'; the messages are the run's"
            )
        head.update(value)
    elif key == "extra_headers":
        request_options["headers"] = dict(value)
    else:
        request_options["params"] = dict(value)


async def _read_bounded(response: Any, limit: int, model: str) -> bytes:
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
        raise _too_large(model, limit, f"it declares {int(declared)} bytes")
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
        raise _too_large(model, limit, "it is larger")
    return b"".join(chunks)


async def _read_capped(stream: Any, cap: int) -> bytes:
    """At most ``cap`` bytes of an async byte stream, read no further than needed."""
    chunks: list[bytes] = []
    size = 0
    async with contextlib.aclosing(stream) as pieces:
        with anyio.CancelScope() as stop:  # see _read_bounded: stop inside the stream
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


def _too_large(model: str, limit: int, detail: str) -> ChatProtocolError:
    return ChatProtocolError(
        f"OpenAI chat completion (model {model!r}): the reply is larger than "
        f"max_response_bytes={limit} ({detail}); raf stopped reading it"
    )


def _error_from_http(exc: Exception, model: str) -> ChatClientError:
    """An error of the HTTP stack while reading a reply, as a raf error."""
    import httpx2

    where = f"OpenAI chat completion (model {model!r})"
    if isinstance(exc, httpx2.TimeoutException):
        return ChatTimeoutError(f"{where} timed out reading the reply: {exc!r}")
    if isinstance(exc, httpx2.DecodingError):
        return ChatProtocolError(f"{where}: the reply cannot be decompressed: {exc}")
    return ChatConnectionError(f"{where}: the connection failed reading the reply: {exc!r}")


class _StreamedTurn:
    """The updates of one streamed chat completion, from its chunks' JSON."""

    __slots__ = ("calls", "empty_text", "finished", "model", "refusal", "text_sent", "where")

    def __init__(self, model: str) -> None:
        self.model = model
        self.where = f"OpenAI chat completion stream (model {model!r})"
        # index -> [id, name, argument pieces or None when no arguments came, last chunk]
        self.calls: dict[int, list[Any]] = {}
        self.finished: str | None = None
        self.text_sent = False
        self.empty_text = False
        self.refusal: list[str] = []

    def feed(self, data: str) -> list[Update]:
        """The updates one event's data makes (``[DONE]`` and usage-only chunks included)."""
        where = self.where
        if data == "[DONE]":
            if self.finished is None:
                raise ChatConnectionError(
                    f"{where} ended ([DONE]) before the model finished its answer "
                    "(no finish_reason): the answer is incomplete"
                )
            return []
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ChatProtocolError(
                f"{where}: a chunk is not JSON ({exc}): {_quote(data.encode())}"
            ) from None
        if not isinstance(chunk, dict):
            raise ChatProtocolError(
                f"{where}: a chunk is {_json_type(chunk)}, not a JSON object: "
                f"{_quote(data.encode())}"
            )
        if chunk.get("error") is not None:
            raise ChatProtocolError(
                f"{where}: the server sent an error mid-stream: {chunk['error']}"
            )
        updates: list[Update] = []
        choices = chunk.get("choices")
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise ChatProtocolError(
                f"{where}: a chunk's 'choices' is {_json_type(choices)}, not a list"
            )
        for choice in choices:
            if not isinstance(choice, dict):
                raise ChatProtocolError(
                    f"{where}: a chunk's choice is {_json_type(choice)}, not an object"
                )
            if choice.get("index", 0) != 0:
                continue  # raf asks for one choice: others are not its answer
            self._choice(choice, chunk, updates)
        raw_usage = chunk.get("usage")
        if raw_usage is not None:
            if not isinstance(raw_usage, dict):
                raise ChatProtocolError(
                    f"{where}: a chunk's 'usage' is {_json_type(raw_usage)}, not an object"
                )
            usage = Usage(
                _tokens(raw_usage, "prompt_tokens", where),
                _tokens(raw_usage, "completion_tokens", where),
            )
            # The usage comes after the finish: the tool calls go out before it.
            updates += self._finish_updates(chunk)
            updates.append(Update("usage", usage=usage, raw=chunk))
        return updates

    def _choice(self, choice: dict[str, Any], chunk: Any, updates: list[Update]) -> None:
        where = self.where
        delta = choice.get("delta")
        if delta is None:
            delta = {}
        if not isinstance(delta, dict):
            raise ChatProtocolError(
                f"{where}: choices[0].delta is {_json_type(delta)}, not an object"
            )
        content = delta.get("content")
        if content is not None:
            if not isinstance(content, str):
                raise ChatProtocolError(
                    f"{where}: choices[0].delta.content is {_json_type(content)}, not a string"
                )
            if content:
                self.text_sent = True
                updates.append(Update("text", content, raw=chunk))
            else:
                self.empty_text = True
        refusal = delta.get("refusal")
        if refusal is not None:
            if not isinstance(refusal, str):
                raise ChatProtocolError(
                    f"{where}: choices[0].delta.refusal is {_json_type(refusal)}, not a string"
                )
            self.refusal.append(refusal)
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise ChatProtocolError(
                    f"{where}: choices[0].delta.tool_calls is {_json_type(tool_calls)}, not a list"
                )
            for position, piece in enumerate(tool_calls):
                self._tool_call_delta(piece, position, chunk)
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise ChatProtocolError(
                    f"{where}: choices[0].finish_reason is {_json_type(reason)}, not a string"
                )
            self.finished = reason

    def _tool_call_delta(self, piece: Any, position: int, chunk: Any) -> None:
        where = self.where
        path = f"choices[0].delta.tool_calls[{position}]"
        if not isinstance(piece, dict):
            raise ChatProtocolError(f"{where}: {path} is {_json_type(piece)}, not an object")
        index = piece.get("index", position)
        if type(index) is not int:
            raise ChatProtocolError(f"{where}: {path}.index is {_json_type(index)}, not an int")
        kind = piece.get("type")
        if kind is not None and kind != "function":
            raise ChatProtocolError(
                f"{where}: {path} is a {kind!r} tool call; raf supports function tool calls only"
            )
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = [None, None, None, chunk]
        call[3] = chunk
        call_id = piece.get("id")
        if call_id is not None:
            if not isinstance(call_id, str):
                raise ChatProtocolError(
                    f"{where}: {path}.id is {_json_type(call_id)}, not a string"
                )
            if call[0] is None:
                call[0] = call_id
        function = piece.get("function")
        if function is None:
            return
        if not isinstance(function, dict):
            raise ChatProtocolError(
                f"{where}: {path}.function is {_json_type(function)}, not an object"
            )
        name = function.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise ChatProtocolError(
                    f"{where}: {path}.function.name is {_json_type(name)}, not a string"
                )
            if not call[1]:
                call[1] = name
        arguments = function.get("arguments")
        if arguments is not None:
            if not isinstance(arguments, str):
                raise ChatProtocolError(
                    f"{where}: {path}.function.arguments is {_json_type(arguments)}, "
                    "not a string of JSON"
                )
            if call[2] is None:
                call[2] = [arguments]
            else:
                call[2].append(arguments)

    def _finish_updates(self, chunk: Any) -> list[Update]:
        """The updates held until the model finished: tool calls (complete only then),
        and the text of an answer that had no text delta (an empty one, a refusal)."""
        if self.finished is None:
            return []
        updates: list[Update] = []
        if not self.text_sent and not self.calls:
            if self.empty_text:
                updates.append(Update("text", "", raw=chunk))
            elif self.refusal:
                updates.append(Update("text", "".join(self.refusal), raw=chunk))
            self.text_sent = True
        for index in sorted(self.calls):
            call_id, name, arguments, last = self.calls[index]
            path = f"the tool call of index {index}"
            if call_id is None:
                raise ChatProtocolError(f"{self.where}: {path} has no id")
            if name is None:
                raise ChatProtocolError(f"{self.where}: {path} has no function name")
            text = "{}" if arguments is None else "".join(arguments)
            updates.append(Update("tool_call", tool_call=ToolCall(call_id, name, text), raw=last))
        self.calls = {}
        return updates

    def finish(self) -> list[Update]:
        """The updates left once the stream ended; a stream cut short is an error."""
        if self.finished is None:
            raise ChatConnectionError(
                f"{self.where} ended before the model finished its answer (no finish_reason): "
                "the answer is incomplete"
            )
        return self._finish_updates(None)


def messages_json(messages: Sequence[ChatMessage], start: int = 0) -> list[bytes]:
    """:func:`message_json` of each message, in order (a new list); an error names
    ``messages[start + i]``.

    The lookup is one C loop (``map``) and the misses are found by C scans
    (``list.index``): over a history whose messages are cached (every turn
    after the first, with an in-memory history) only the new turn's messages
    cost Python work, several times less than a Python loop over all.
    """
    return _WIRE.many(messages, start)


def message_json(message: ChatMessage, index: int = 0) -> bytes:
    """The JSON of :func:`message_to_wire` as UTF-8, cached per message object
    (bounded: the oldest entries go past 32 MiB of JSON).

    >>> message_json(ChatMessage.user("hi"))
    b'{"role":"user","content":"hi"}'
    """
    return _WIRE.one(message, index)


def _messages_run(messages: tuple[ChatMessage, ...], start: int) -> tuple[bytes, frozenset[str]]:
    """The JSON of a run of messages, for :class:`RecentBodies`: it depends on them alone."""
    return b",".join(_WIRE.many(messages, start)), NO_KEYS


def _message_text(message: ChatMessage, index: int) -> str:
    """``_dumps(message_to_wire(message))``, written out: a fifth of the cost for a miss.

    Every string goes through the json module's own C string encoder; the
    tests hold this equal to the generic form.
    """
    role = message.role
    if role == "tool":
        if message.tool_call_id is None:
            raise _no_call_id(index)
        return (
            f'{{"role":"tool","tool_call_id":{_string(message.tool_call_id)},'
            f'"content":{_string(message.content or "")}}}'
        )
    if role == "assistant" and message.tool_calls:
        content = "null" if message.content is None else _string(message.content)
        calls = ",".join(
            f'{{"id":{_string(c.id)},"type":"function","function":{{"name":{_string(c.name)},'
            f'"arguments":{_string(c.arguments)}}}}}'
            for c in message.tool_calls
        )
        text = f'{{"role":"assistant","content":{content},"tool_calls":[{calls}]'
    else:
        text = f'{{"role":{_string(role)},"content":{_string(message.content or "")}'
    if message.name is not None:
        text += f',"name":{_string(message.name)}'
    return text + "}"


def _message_bytes(message: ChatMessage, index: int) -> bytes:
    return utf8(_message_text(message, index))


# Each message's JSON, by identity (see WireCache), shared by all chat clients.
_WIRE: Final = WireCache(_message_bytes)


def message_to_wire(message: ChatMessage, index: int = 0) -> dict[str, Any]:
    """One message in the OpenAI wire format.

    >>> message_to_wire(ChatMessage.tool("call_1", "42"))
    {'role': 'tool', 'tool_call_id': 'call_1', 'content': '42'}
    """
    role = message.role
    if role == "tool":
        if message.tool_call_id is None:
            raise _no_call_id(index)
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": message.content or "",
        }
    wire: dict[str, Any] = {"role": role}
    if role == "assistant" and message.tool_calls:
        wire["content"] = message.content
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    else:
        wire["content"] = message.content or ""
    if message.name is not None:
        wire["name"] = message.name
    return wire


def _no_call_id(index: int) -> BadRequestError:
    return BadRequestError(
        f"messages[{index}]: a tool message needs a tool_call_id (the id of the call it answers)"
    )


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """A raf :class:`raf.Tool` as an OpenAI function tool with its JSON Schema."""
    function: dict[str, Any] = {"name": tool.name, "parameters": _plain(tool.parameters)}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def response_from_reply(data: bytes, content_type: str, model: str) -> AgentResponse:
    """The assistant turn, usage and raw ``ChatCompletion`` of a 200 reply's body.

    Anything that is not a chat completion raf can read is a
    :class:`raf.ChatProtocolError` that names the problem.
    """
    where = f"OpenAI chat completion (model {model!r})"
    reply = json_object(data, content_type, where)
    if reply.get("error") is not None:
        raise ChatProtocolError(f"{where}: the server answered 200 with an error: {reply['error']}")
    choices = reply.get("choices", _MISSING)
    if not isinstance(choices, list):
        raise ChatProtocolError(f"{where}: 'choices' is {_json_type(choices)}, not a list")
    if not choices:
        raise ChatProtocolError(f"{where}: the model returned no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ChatProtocolError(f"{where}: choices[0] is {_json_type(choice)}, not an object")
    message = choice.get("message", _MISSING)
    if not isinstance(message, dict):
        raise ChatProtocolError(
            f"{where}: choices[0].message is {_json_type(message)}, not an object"
        )
    text = _optional_str(message, "content", where)
    calls = [
        _tool_call(call, f"choices[0].message.tool_calls[{n}]", where)
        for n, call in enumerate(_optional_list(message, "tool_calls", where))
    ]
    if text is None and not calls:
        # A refusal is what the user should read when there is no answer.
        text = _optional_str(message, "refusal", where)
    usage = None
    raw_usage = reply.get("usage")
    if raw_usage is not None:
        if not isinstance(raw_usage, dict):
            raise ChatProtocolError(f"{where}: 'usage' is {_json_type(raw_usage)}, not an object")
        usage = Usage(
            _tokens(raw_usage, "prompt_tokens", where),
            _tokens(raw_usage, "completion_tokens", where),
        )
    return AgentResponse(
        (ChatMessage.assistant(text, tool_calls=calls),), usage, _completion(reply)
    )


def _tool_call(call: Any, path: str, where: str) -> ToolCall:
    if not isinstance(call, dict):
        raise ChatProtocolError(f"{where}: {path} is {_json_type(call)}, not an object")
    kind = call.get("type", "function")
    if kind != "function":
        raise ChatProtocolError(
            f"{where}: {path} is a {kind!r} tool call; raf supports function tool calls only"
        )
    call_id = call.get("id", _MISSING)
    if not isinstance(call_id, str):
        raise ChatProtocolError(f"{where}: {path}.id is {_json_type(call_id)}, not a string")
    function = call.get("function", _MISSING)
    if not isinstance(function, dict):
        raise ChatProtocolError(
            f"{where}: {path}.function is {_json_type(function)}, not an object"
        )
    name = function.get("name", _MISSING)
    if not isinstance(name, str):
        raise ChatProtocolError(
            f"{where}: {path}.function.name is {_json_type(name)}, not a string"
        )
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        raise ChatProtocolError(
            f"{where}: {path}.function.arguments is {_json_type(arguments)}, not a string of JSON"
        )
    return ToolCall(call_id, name, arguments)


def _optional_str(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ChatProtocolError(
            f"{where}: choices[0].message.{key} is {_json_type(value)}, not a string"
        )
    return value


def _optional_list(data: dict[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ChatProtocolError(
            f"{where}: choices[0].message.{key} is {_json_type(value)}, not a list"
        )
    return value


def _tokens(usage: dict[str, Any], path: str, where: str) -> int:
    """The count of tokens at ``path`` (dotted, e.g. ``input_tokens_details.cached_tokens``)
    of a reply's usage; 0 when absent, a ChatProtocolError when it is not a count."""
    value: Any = usage
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ChatProtocolError(
            f"{where}: usage.{path} is {_json_type(value)}, not a count of tokens"
        )
    return value


def _completion(reply: dict[str, Any]) -> Any:
    """The SDK's ``ChatCompletion`` for ``raw``: validated, or built leniently."""
    from openai.types.chat import ChatCompletion

    return _sdk_object(ChatCompletion, reply)


def _sdk_object(model: Any, reply: dict[str, Any]) -> Any:
    """``model`` (an SDK pydantic type) for ``reply``: validated, or built leniently."""
    try:
        return model.model_validate(reply)
    except Exception:
        # Compatible servers leave out or vary fields raf does not need: keep them all.
        try:
            return model.construct(**reply)
        except Exception:
            return reply


def _json_type(value: object) -> str:
    if value is _MISSING:
        return "missing"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _quote(data: bytes) -> str:
    text = data[:_QUOTE].decode("utf-8", "replace")
    return repr(text) + ("..." if len(data) > _QUOTE else "")


def error_from_sdk(exc: openai.OpenAIError, model: str) -> ChatClientError:
    """The :class:`raf.ChatClientError` for an OpenAI SDK error.

    An HTTP error carries the server's ``Retry-After`` (or ``retry-after-ms``)
    as ``retry_after`` in seconds.
    """
    import openai

    where = f"OpenAI chat completion (model {model!r})"
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
    cannot be read is ignored.

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
            return max(seconds, 0.0)
    return None


def _retry_after_date(value: str, now: float | None) -> float | None:
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT even when it does not say so
        return None
    current = time.time() if now is None else now
    return max(when.timestamp() - current, 0.0)


def _tool_choice(choice: str | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice in _TOOL_CHOICE_WORDS:
            return choice
        return {"type": "function", "function": {"name": choice}}
    plain: dict[str, Any] = _plain(choice)
    return plain


def _dumps(value: Any) -> str:
    return _ENCODER.encode(value)


def _plain(value: Any) -> Any:
    # Schemas may hold read-only mappings and tuples; the wire wants dicts and lists.
    return json.loads(json.dumps(value, default=_not_json))


def _not_json(value: object) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


# The SDK's own encoding (compact, UTF-8, no NaN), with mappings taken as objects; one
# encoder for all calls, as json.dumps builds a new one per call when given options.
_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_not_json
)
_string: Final[Any] = json.encoder.encode_basestring


async def bound_error_reply(response: Any, max_response_bytes: int) -> None:
    """Read an error reply here, at most ``_ERROR_REPLY_MAX`` bytes once decoded.

    The SDK reads an error reply whole to quote it; a hostile or broken
    server could make that gigabytes (a gzip bomb). This hook of the HTTP
    client raf builds (both OpenAI clients use it) runs first: it reads the
    raw reply, decodes gzip and deflate itself with a bound, and leaves the
    SDK the bounded bytes (a longer reply is cut: only its start is quoted).
    """
    import httpx2

    if response.status_code < 400:
        return
    cap = min(max_response_bytes, _ERROR_REPLY_MAX)
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
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not timeout > 0  # also refuses NaN
    ):
        raise ValueError(
            f"{name}: timeout must be a number of seconds > 0 or None, got {timeout!r}"
        )
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


def json_object(data: bytes, content_type: str | None, where: str) -> dict[str, Any]:
    """A reply's bytes as a JSON object, or a ChatProtocolError that quotes them."""
    try:
        # Invalid UTF-8 in a text is replaced, not fatal: the rest of the answer stands.
        reply = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError) as exc:
        raise ChatProtocolError(
            f"{where}: the reply is not JSON ({content_type or 'no content-type'}; "
            f"{exc}): {_quote(data)}"
        ) from None
    if not isinstance(reply, dict):
        raise ChatProtocolError(
            f"{where}: the reply is {_json_type(reply)}, not a JSON object: {_quote(data)}"
        )
    return reply
