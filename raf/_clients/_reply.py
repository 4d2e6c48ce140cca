"""Reading a reply, for the clients on a Stainless SDK: its bytes as a JSON object, the
fields raf reads of it, checked, and a stream's server-sent events, under a size bound
and a bound on each wait."""

from __future__ import annotations

import codecs
import contextlib
import json
import math
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from types import ModuleType
from typing import Any, Final, Protocol, TypeVar

import anyio
import httpx2

from raf._clients._sdk import Held, RequestOptions, error_from_http, read_reply, send, too_large
from raf._clients._sse import EventData
from raf._values.messages import ChatMessage, Update
from raf.errors import BadRequestError, ChatClientError, ChatProtocolError, ChatTimeoutError

__all__: list[str] = []

# How much of a reply that is not JSON an error message quotes.
_QUOTE: Final = 120
# What a JSON value of a type is, in the words of an error message.
_NOUNS: Final[dict[type, str]] = {str: "a string", int: "an int", list: "a list", dict: "an object"}


def json_object(data: bytes | str, content_type: str | None, where: str, what: str) -> Any:
    """A reply's (or an event's: ``what``) bytes as a JSON object, or a ChatProtocolError
    that quotes them."""
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    try:
        # Invalid UTF-8 in a text is replaced, not fatal: the rest of the answer stands.
        reply = json.loads(text)
    except (ValueError, RecursionError) as exc:
        kind = f"{content_type or 'no content-type'}; " if content_type is not None else ""
        raise ChatProtocolError(
            f"{where}: {what} is not JSON ({kind}{exc}): {quote(text)}"
        ) from None
    if not isinstance(reply, dict):
        raise ChatProtocolError(
            f"{where}: {what} is {json_type(reply)}, not a JSON object: {quote(text)}"
        )
    return reply


def field(
    parent: dict[str, Any],
    key: str,
    kind: type,
    where: str,
    at: str = "",
    *,
    optional: bool = False,
) -> Any:
    """``parent[key]`` where raf reads it, checked to be a ``kind`` (``str``, ``int``,
    ``list``, ``dict``; ``optional``: or missing, or null, then ``None``). Anything else is
    a ChatProtocolError naming the field by its path (``at``, the parent's), as in
    ``choices[0].message.content is a number (5), not a string``. Fields raf does not read
    are never checked: OpenAI-compatible servers leave them out or vary them."""
    value = parent.get(key)
    if (value is None and optional) or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    path = f"{at}.{key}" if at else key
    problem = f"is {json_type(value)}, not {_NOUNS[kind]}" if key in parent else "is missing"
    raise ChatProtocolError(f"{where}: {path} {problem}")


def objects(
    parent: dict[str, Any], key: str, where: str, at: str = "", *, optional: bool = False
) -> list[dict[str, Any]]:
    """The list ``parent[key]``, checked as :func:`field` checks it, and each of its items
    to be an object (``optional``: missing or null is an empty list)."""
    items: list[Any] = field(parent, key, list, where, at, optional=optional) or []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            path = f"{at}.{key}" if at else key
            raise ChatProtocolError(f"{where}: {path}[{index}] is {json_type(item)}, not an object")
    return items


def tokens(usage: dict[str, Any], path: str, where: str) -> int:
    """The count of tokens at ``path`` (dotted) of a reply's ``usage``: 0 when absent or
    null (compatible servers leave counts out), a ChatProtocolError when not a count."""
    value: Any = usage
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise ChatProtocolError(
            f"{where}: usage.{path} is {json_type(value)}, not a count of tokens"
        )
    return value


def built(kind: Any, reply: dict[str, Any], where: str) -> Any:
    """``reply`` as the SDK's ``kind`` (``ChatCompletion``, ``Response``, ``Message``), the
    :attr:`raf.AgentResponse.raw` the docs promise, built as the SDK's own ``create()``
    builds a reply: pydantic's ``model_construct``, which the SDK's models make build
    their nested models too, unvalidated. raf's checks cover what raf reads (naming the
    field that is wrong); the rest is the user's, as the server sent it. A key the
    builder takes for an argument of its own (``_fields_set``, at any depth) is a
    ChatProtocolError."""
    try:
        return kind.model_construct(**reply)
    except (TypeError, AttributeError) as exc:
        raise ChatProtocolError(
            f"{where}: the reply cannot be built as the SDK's {kind.__name__}: {exc}"
        ) from None


def json_type(value: object) -> str:
    """What a JSON value is, for an error message: ``"a string"``, ``"null"``, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    return _NOUNS.get(type(value), type(value).__name__)


def quote(data: bytes | str) -> str:
    """The start of a reply, quoted for an error message."""
    text = data if isinstance(data, str) else data[: _QUOTE * 4].decode("utf-8", "replace")
    return repr(text[:_QUOTE]) + ("..." if len(text) > _QUOTE else "")


def replayed(
    message: ChatMessage,
    index: int,
    source: str,
    kinds: tuple[str, str, str],
    text: list[dict[str, Any]],
    calls: dict[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """An assistant turn on its wire: ``text`` (its blocks) and ``calls`` (by id), with the
    reasoning it kept (of ``source``) back in its place, unchanged: the wire's items or
    blocks in the order the reply had, ``kinds`` naming the text's type, the calls' type
    and their id's key. Reasoning of another wire, or of a turn whose calls changed
    since, is left out: text, then calls. ``index`` is the message's place, for errors."""
    text_kind, call_kind, key = kinds
    reasoning = message.reasoning
    order: Any = None
    if reasoning is not None and reasoning.source == source:
        try:
            order = json.loads(reasoning.data)
            named = [item.get(key) for item in order if item.get("type") == call_kind]
        except (ValueError, TypeError, AttributeError):
            raise BadRequestError(
                f"messages[{index}]: the reasoning (source {source!r}) is not the JSON list "
                f"of objects that wire keeps: {quote(reasoning.data)}"
            ) from None
        order = order if named == list(calls) else None
    if order is None:
        return [*text, *calls.values()]
    items: list[dict[str, Any]] = []
    for item in order:
        if item.get("type") == text_kind:
            items += text
            text = []
        else:  # a call as it is today; reasoning as it came (its signature covers it)
            items.append(calls[item[key]] if item.get("type") == call_kind else item)
    if text:  # text the reply did not have: before the calls
        at = [i for i, item in enumerate(items) if item.get("type") == call_kind]
        first = at[0] if at else len(items)
        items[first:first] = text
    return items


# --- Streams ---------------------------------------------------------------------------

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
    :class:`raf.errors.ChatTimeoutError` with the text ``expired``.
    """

    __slots__ = ("expired", "idle", "left")

    def __init__(self, idle: float | None, expired: str) -> None:
        self.idle = math.inf if idle is None else idle
        self.left = math.inf
        self.expired = expired

    async def run(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await function(*args)`` within the bound of one wait."""
        started = anyio.current_time()
        with anyio.move_on_after(min(self.idle, self.left)):
            try:
                return await function(*args)
            finally:
                self.left -= anyio.current_time() - started
        # Only the deadline's own cancellation lands here: any other one propagates.
        raise ChatTimeoutError(self.expired)

    def cap(self, seconds: float) -> None:
        """Leave at most ``seconds`` for all the waits left."""
        self.left = min(self.left, seconds)


class StreamReader(Protocol):
    """What a client's stream is read with: the updates of each event's data, and of a
    reply that is no event stream; ``done`` once the answer is complete; ``finish``
    the updates left at the end (a stream cut short is an error)."""

    @property
    def done(self) -> bool: ...
    def feed(self, data: str) -> list[Update]: ...
    def plain(self, data: bytes, content_type: str) -> list[Update]: ...
    def finish(self) -> list[Update]: ...


def _is_ping(data: str) -> bool:
    """Whether an event's data is a keep-alive ping (Anthropic's ``{"type": "ping"}``)."""
    return len(data) < 40 and data.replace(" ", "") == '{"type":"ping"}'


async def stream_updates(
    owner: Held,
    sdk: ModuleType,
    path: str,
    body: dict[str, Any],
    request_options: RequestOptions,
    reader: StreamReader,
    where: str,
) -> AsyncGenerator[Update]:
    """The updates of a streamed request for ``owner`` (a client on the Stainless SDK
    ``sdk``), as ``reader`` reads its events; the response is closed whatever ends the
    stream, ``aclose()`` included; errors of the request name ``where``.

    The request until its reply starts is held to the client's ``timeout``
    (the SDK's retries included); then each wait on the server to its
    ``idle_timeout`` (a healthy stream may last any time).
    """
    name = type(owner).__name__
    start = Budget(
        owner.timeout,
        f"{where} did not start streaming within {owner.timeout} s "
        f"({name}(timeout={owner.timeout}), the SDK's retries included)",
    )
    response = await start.run(send, sdk, owner.client, path, body, request_options, where)
    idle = Budget(
        owner.idle_timeout,
        f"{where}: the stream sent nothing for {owner.idle_timeout} s of waiting "
        f"({name}(idle_timeout={owner.idle_timeout}))",
    )
    limit, content_type = owner.max_response_bytes, response.headers.get("content-type", "")
    stop = anyio.CancelScope()

    async def event_data() -> AsyncIterator[str]:
        size, utf8, decoder = 0, codecs.getincrementaldecoder("utf-8")("replace"), EventData()
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                # Stop by cancelling (see the end): raised inside the HTTP stack's next read.
                stop.cancel()
                continue
            # Invalid UTF-8 replaced, as in a reply's body.
            for data in decoder.feed(utf8.decode(chunk)):
                yield data

    async def next_event() -> str | None:
        nonlocal stop
        data: str | None = None
        with anyio.CancelScope() as stop:
            try:
                # A keep-alive ping is no progress: a stream of nothing else is idle.
                while (data := await anext(events, None)) is not None and _is_ping(data):
                    pass
            except httpx2.HTTPError as exc:
                raise error_from_http(exc, where) from exc
        if stop.cancel_called:  # past the bound, whether or not the stream went on
            raise too_large(where, limit)
        return data

    events = event_data()
    try:
        if not content_type.startswith("text/event-stream"):
            data = await idle.run(read_reply, response, limit, where)
            for update in reader.plain(data, content_type):
                yield update
            return
        try:
            while (event := await idle.run(next_event)) is not None:
                done = reader.done
                updates = reader.feed(event)
                if not done and reader.done:
                    # What follows the answer gets a moment, not the budget: a server that
                    # keeps the stream open must not turn an answer into a timeout.
                    idle.cap(DRAIN_GRACE)
                for update in updates:
                    yield update
        except ChatClientError:
            # Once the answer is complete, what goes wrong reading past it is no error.
            if not reader.done:
                raise
        for update in reader.finish():
            yield update
    finally:
        # Stop reading and close the response, bounded and shielded: returning the
        # connection must not hang or be cut, also when the consumer left or the call is
        # being cancelled. A cancellation raised at the HTTP stack's next read ends each
        # generator of the chain in turn; closing only the outer one would leave the
        # inner ones to the garbage collector (trio warns).
        with anyio.move_on_after(5, shield=True):
            with anyio.CancelScope() as stop:
                stop.cancel()
                with contextlib.suppress(Exception):
                    async for _ in events:
                        pass
            await response.aclose()
