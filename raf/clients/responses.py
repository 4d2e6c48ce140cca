"""OpenAIResponsesClient: a chat model behind the OpenAI Responses API (``POST /responses``)."""

from __future__ import annotations

import collections
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import anyio
import attrs

from raf.clients._sse import Budget, EventReader
from raf.clients._wire import NO_KEYS, RecentBodies, WireCache, utf8
from raf.clients.openai import (
    _MISSING,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_TIMEOUT,
    _dumps,
    _error_from_http,
    _json_type,
    _no_call_id,
    _plain,
    _quote,
    _read_bounded,
    _sdk_object,
    _string,
    _tokens,
    error_from_sdk,
    json_object,
    sdk_client,
)
from raf.errors import (
    BadRequestError,
    ChatClientError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
)
from raf.messages import AgentResponse, ChatMessage, ToolCall, Update, Usage
from raf.options import ChatOptions
from raf.tools import Tool

if TYPE_CHECKING:
    import openai

__all__ = [
    "OpenAIResponsesClient",
    "input_items",
    "input_json",
    "response_from_reply",
    "tool_to_wire",
]

_TOOL_CHOICE_WORDS: Final = frozenset({"auto", "none", "required"})
_TRANSPORT_EXTRA: Final = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})
# Keys of the body that are the run's own, never an option's.
_OWN_KEYS: Final = frozenset({"input", "stream"})
_REASONING_INCLUDE: Final = "reasoning.encrypted_content"
# The most of an error reply (4xx, 5xx) raf lets the SDK read, as the chat client.
_ERROR_REPLY_MAX: Final = 1024 * 1024
# How many tool-call turns a client remembers the reasoning items of.
_TURNS_KEPT: Final = 1024
_CHAT_WHERE: Final = "OpenAI chat completion"
# How long a stream may go on after response.completed before raf stops reading it.
_DRAIN_GRACE: Final = 1.0
# The keys of the body the SDK's responses.create sends, in its order (openai 3.57): raf
# sends the same bytes (the suite compares them). Keys it does not name come last, as the
# SDK's extra_body.
_BEFORE_INPUT: Final = (
    "model",
    "stream",
    "service_tier",
    "access_programs",
    "background",
    "background_options",
    "context_management",
    "conversation",
    "image",
    "include",
)
_AFTER_INPUT: Final = (
    "instructions",
    "max_output_tokens",
    "max_tool_calls",
    "metadata",
    "moderation",
    "parallel_tool_calls",
    "previous_response_id",
    "prompt",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "reasoning",
    "safety_identifier",
    "store",
    "stream_options",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "truncation",
    "user",
)


@attrs.frozen
class _Turn:
    """The order of one reply's output, for replay: reasoning items as they came,
    ``("text", None)`` where the text was, ``("call", call_id)`` for each call."""

    call_ids: tuple[str, ...]
    order: tuple[tuple[str, Any], ...]


class OpenAIResponsesClient:
    """A :class:`raf.StreamingChatClient` on the OpenAI Responses API (``POST /responses``).

    The keywords are those of :class:`raf.OpenAIChatClient` (``base_url``,
    ``api_key``, ``max_retries``, ``timeout``, ``max_response_bytes``,
    ``client``), with the same errors and ``retryable``, plus ``store``.

    ``store=False`` (the default) keeps nothing on the server: every request
    sends the whole conversation and asks for the reasoning items in
    encrypted form (``include=["reasoning.encrypted_content"]``). The client
    remembers the reasoning items of each reply that calls tools, by the
    calls' ids, and sends them back before those calls on the next request of
    the tool loop, so a reasoning model keeps its chain of thought across tool
    calls without server-side state.

    ``timeout`` bounds the time a call waits on the server, in total: the
    request, the SDK's retries and the reading of the reply or of every
    event of a stream (``None``: no bound); time a stream's consumer spends
    between updates does not count. ``max_response_bytes`` bounds the reply,
    or the whole stream, once decompressed.

        async with OpenAIResponsesClient("gpt-5-mini") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        store: bool = False,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        name = "OpenAIResponsesClient"
        if type(store) is not bool:
            raise ValueError(f"{name}: store must be True or False, got {store!r}")
        client, self._owns_client = sdk_client(
            name,
            model,
            base_url=base_url,
            api_key=api_key,
            max_retries=max_retries,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            client=client,
        )
        self.model = model
        self.store = store
        self.timeout = timeout
        self.max_response_bytes = max_response_bytes
        self.client: openai.AsyncOpenAI = client
        # Reasoning to replay, by the first call id of the turn it came with (oldest first).
        self._turns: collections.OrderedDict[str, _Turn] = collections.OrderedDict()
        # The JSON of the assistant turn each remembered turn was last replayed into, by the
        # same key, with the message and the turn it was written from.
        self._replayed: dict[str, tuple[ChatMessage, _Turn, bytes]] = {}
        # The input parts of the last bodies sent, to extend (see request_body).
        self._bodies = RecentBodies(self._input_run)

    # --- complete -----------------------------------------------------------------------

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one Responses API request and return the model's turn."""
        model, body, request_options = self.request_body(messages, options)
        with anyio.move_on_after(self.timeout):
            response = await self._post(body, request_options, model)
            try:
                data = await _reworded(_read_bounded(response, self.max_response_bytes, model))
            except _http_errors() as exc:
                raise _reword(_error_from_http(exc, model)) from exc
            finally:
                await _close(response)
            answer, turn = response_from_reply(
                data, response.headers.get("content-type", ""), model
            )
            self._remember(turn)
            return answer
        raise ChatTimeoutError(
            f"{_where(model)} did not finish within {self.timeout} s "
            "(OpenAIResponsesClient timeout=, the SDK's retries included)"
        )

    # --- stream -------------------------------------------------------------------------

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The model's turn as it comes (``"stream": true``), update by update.

        Text deltas (``response.output_text.delta``), each function call once
        its arguments are done, and the usage of ``response.completed``. A
        ``response.failed``, ``response.incomplete`` or ``error`` event is a
        :class:`raf.ChatClientError` (not retryable); a stream that ends
        before one of them or ``response.completed`` is a
        :class:`raf.errors.ChatConnectionError`.
        """
        model, body, request_options = self.request_body(messages, options, stream=True)
        budget = Budget(
            self.timeout,
            f"{_where(model)} did not finish within {self.timeout} s of waiting "
            "(OpenAIResponsesClient timeout=, the SDK's retries included)",
        )
        response = await budget.run(self._post, body, request_options, model)
        limit = self.max_response_bytes
        reader = EventReader(
            response,
            limit,
            too_large=lambda: ChatProtocolError(
                f"{_where(model)}: the event stream is larger than "
                f"max_response_bytes={limit}; raf stopped reading it"
            ),
            http_error=lambda exc: _reword(_error_from_http(exc, model)),
        )
        try:
            content_type = response.headers.get("content-type", "")
            if not content_type.startswith("text/event-stream"):
                data = await _reworded(_read_bounded(response, _ERROR_REPLY_MAX, model))
                raise ChatProtocolError(
                    f"{_where(model)}: a streamed request was answered with "
                    f"{content_type or 'no content-type'}, not an event stream: {_quote(data)}"
                )
            state = _StreamState(model)
            try:
                while (events := await budget.run(reader.next_events)) is not None:
                    if state.done:
                        continue  # read to the end: the connection can then be reused
                    for data in events:
                        if data.strip() == "[DONE]":
                            continue
                        updates = state.feed(_event(data, model))
                        # Remembered before the updates go out: a consumer may leave after them.
                        self._remember(state.turn)
                        state.turn = None
                        if state.done:
                            # What follows the answer gets a moment, not the budget: a server
                            # that keeps the stream open must not turn an answer into a timeout.
                            budget.cap(_DRAIN_GRACE)
                        for update in updates:
                            yield update
                        if state.done:
                            break
            except ChatClientError:
                # Once the answer is complete, what goes wrong reading past it is no error.
                if not state.done:
                    raise
            if not state.done:
                raise ChatConnectionError(
                    f"{_where(model)}: the event stream ended before response.completed"
                )
        finally:
            # Bounded and shielded: returning the connection must not hang or be cut, also
            # when the consumer left (aclose) or the run is being cancelled.
            with anyio.move_on_after(5, shield=True):
                await reader.aclose()

    # --- the request --------------------------------------------------------------------

    def request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions, *, stream: bool = False
    ) -> tuple[str, bytes, dict[str, Any]]:
        """The model, the JSON body and the SDK request options of one call.

        The body is the bytes ``responses.create`` would send, its keys in the
        SDK's order, built as :meth:`raf.OpenAIChatClient.request_body` builds
        its own: each message's input items are cached (see :func:`input_json`),
        and so are the input parts of this client's last few bodies, so a turn
        whose messages extend an earlier call's costs its new messages and one
        copy. ``stream`` adds ``"stream": true``.

        ``options.extra`` is applied last, as with :class:`raf.OpenAIChatClient`:
        ``timeout``, ``extra_headers``, ``extra_query`` and ``extra_body`` as the
        SDK understands them, any other key into the body; an ``include`` list
        is added to raf's own.
        """
        where = "OpenAIResponsesClient"
        body: dict[str, Any] = {"model": options.model or self.model}
        if options.tools:
            body["tools"] = [tool_to_wire(t) for t in options.tools]
        if options.temperature is not None:
            body["temperature"] = options.temperature
        if options.max_tokens is not None:
            body["max_output_tokens"] = options.max_tokens
        if options.tool_choice is not None:
            body["tool_choice"] = _tool_choice(options.tool_choice)
        body["store"] = self.store
        include = [] if self.store else [_REASONING_INCLUDE]
        request_options: dict[str, Any] = {"security": {"bearer_auth": True}}
        extra = dict(options.extra)
        extra_body = extra.pop("extra_body", {})
        if not isinstance(extra_body, Mapping):
            raise BadRequestError(
                f"{where}: extra option 'extra_body' must be a mapping, "
                f"got {type(extra_body).__name__}"
            )
        extra.update(extra_body)  # the SDK merges extra_body into the body: so does raf
        for key, value in extra.items():
            if key in _OWN_KEYS or key == "stream_options":
                raise BadRequestError(
                    f"{where}: extra option {key!r} is not allowed; "
                    "the input is the run's messages, and stream() is how to stream"
                )
            if key in _TRANSPORT_EXTRA:
                if key == "timeout":
                    request_options["timeout"] = value
                elif not isinstance(value, Mapping):
                    raise BadRequestError(
                        f"{where}: extra option {key!r} must be a mapping, "
                        f"got {type(value).__name__}"
                    )
                else:
                    request_options["headers" if key == "extra_headers" else "params"] = dict(value)
            elif key == "include":
                if not isinstance(value, list | tuple) or not all(
                    isinstance(v, str) for v in value
                ):
                    raise BadRequestError(
                        f"{where}: extra option 'include' must be a list of str, got {value!r}"
                    )
                include += [v for v in value if v not in include]
            else:
                body[key] = value
        if include:
            body["include"] = include
        if stream:
            body["stream"] = True
        model = body["model"]
        if not isinstance(model, str):
            raise BadRequestError(f"{where}: model must be a str, got {model!r}")
        # In the SDK's order: the keys before "input", "input", the keys after it.
        head = {key: body.pop(key) for key in _BEFORE_INPUT if key in body}
        tail: dict[str, Any] = {key: body.pop(key) for key in _AFTER_INPUT if key in body}
        tail.update(body)
        try:
            head_json = _dumps(head).encode("utf-8", "backslashreplace")
            tail_json = _dumps(tail).encode("utf-8", "backslashreplace")
        except (TypeError, ValueError) as exc:
            raise BadRequestError(
                f"{where}: a request option cannot be sent as JSON: {exc}"
            ) from exc
        pieces: list[bytes] = [head_json[:-1], b',"input":[']
        for chunk in self._bodies.chunks(messages):
            pieces += (chunk, b",")
        if pieces[-1] == b",":
            pieces.pop()
        pieces += (b"],", tail_json[1:])  # "store" is always there: the tail is never empty
        # One copy of a body that can be megabytes long.
        return model, b"".join(pieces), request_options

    def _input_run(
        self, messages: tuple[ChatMessage, ...], start: int
    ) -> tuple[bytes, frozenset[str]]:
        """The input items of a run of messages (``messages[start:]`` of a call) as JSON,
        and the turns' keys it depends on (the first call id of each assistant turn with
        tool calls, whether or not reasoning is replayed into it: see :meth:`_remember`).

        Each message's items are cached by identity (see :func:`input_json`); an
        assistant turn whose reasoning this client replays is written from the turn,
        and kept by the turn's key until the turn changes.
        """
        found = _ITEMS.many(messages, start)
        types = list(map(type, found))  # one C loop: the assistant turns with calls stand out
        if _CallItems not in types:
            return b",".join(found), NO_KEYS
        keys: set[str] = set()
        index = -1
        with contextlib.suppress(ValueError):  # no assistant turn with calls left
            while True:
                index = types.index(_CallItems, index + 1)
                message = messages[index]
                key = message.tool_calls[0].id
                keys.add(key)
                turn = _turn_for(message, self._turns)
                if turn is not None:
                    found[index] = self._replay(key, message, turn)
        return b",".join(found), frozenset(keys)

    def _replay(self, key: str, message: ChatMessage, turn: _Turn) -> bytes:
        """The items of ``message`` with the reasoning of ``turn`` replayed, as JSON."""
        kept = self._replayed.get(key)
        if kept is not None and kept[0] is message and kept[1] is turn:
            return kept[2]
        try:
            text = ",".join(map(_dumps, _assistant_turn(message, self._turns)))
        except (TypeError, ValueError) as exc:
            raise BadRequestError(
                f"OpenAIResponsesClient: a request option cannot be sent as JSON: {exc}"
            ) from exc
        data = utf8(text)
        self._replayed[key] = (message, turn, data)
        return data

    async def _post(self, body: bytes, request_options: dict[str, Any], model: str) -> Any:
        """POST the body through the SDK (auth, retries, HTTP errors); the unread reply."""
        import httpx2
        import openai

        try:
            return await self.client.post(  # type: ignore[call-overload]
                "/responses",
                cast_to=httpx2.Response,
                content=body,
                options=request_options,
                stream=True,
            )
        except openai.OpenAIError as exc:
            raise _reword(error_from_sdk(exc, model)) from exc

    def _remember(self, turn: _Turn | None) -> None:
        if turn is None or not turn.call_ids:
            return
        key = turn.call_ids[0]
        self._turns[key] = turn
        self._turns.move_to_end(key)
        self._changed(key)
        while len(self._turns) > _TURNS_KEPT:
            self._changed(self._turns.popitem(last=False)[0])

    def _changed(self, key: str) -> None:
        """What ``key`` names changed: the JSON written with it is stale."""
        self._replayed.pop(key, None)
        self._bodies.forget(key)

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> OpenAIResponsesClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"OpenAIResponsesClient(model={self.model!r}, "
            f"base_url={str(self.client.base_url)!r}, store={self.store})"
        )


# --- Messages to input items ------------------------------------------------------------


def input_items(
    messages: Sequence[ChatMessage], turns: Mapping[str, _Turn] | None = None
) -> list[dict[str, Any]]:
    """The Responses API ``input`` of a conversation.

    System, user and assistant text are messages (``{"role", "content"}``; the
    API has no message names, so ``name`` is not sent); an assistant's tool
    calls are ``function_call`` items and tool messages ``function_call_output``
    items, joined by ``call_id``. ``turns`` holds the reasoning to replay
    before the calls of a turn it remembers.

    >>> input_items([ChatMessage.user("hi"), ChatMessage.tool("c1", "42")])
    [{'role': 'user', 'content': 'hi'},
     {'type': 'function_call_output', 'call_id': 'c1', 'output': '42'}]
    """
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if type(message) is not ChatMessage:
            raise BadRequestError(
                f"messages[{index}] must be a ChatMessage, got {type(message).__name__}"
            )
        role = message.role
        if role == "tool":
            if message.tool_call_id is None:
                raise BadRequestError(
                    f"messages[{index}]: a tool message needs a tool_call_id "
                    "(the id of the call it answers)"
                )
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": message.content or "",
                }
            )
        elif role == "assistant" and message.tool_calls:
            items += _assistant_turn(message, turns)
        else:
            items.append({"role": role, "content": message.content or ""})
    return items


def _turn_for(message: ChatMessage, turns: Mapping[str, _Turn] | None) -> _Turn | None:
    """The remembered turn whose reasoning goes back with ``message`` (an assistant turn
    with tool calls), if any: the turn of its first call, with the same calls."""
    turn = turns.get(message.tool_calls[0].id) if turns else None
    if turn is None or turn.call_ids != tuple({call.id: None for call in message.tool_calls}):
        # Not a turn this client answered (or one changed since): no reasoning to replay.
        return None
    return turn


def _assistant_turn(
    message: ChatMessage, turns: Mapping[str, _Turn] | None
) -> list[dict[str, Any]]:
    calls = {call.id: call for call in message.tool_calls}
    text = (
        [{"role": "assistant", "content": message.content}] if message.content is not None else []
    )
    turn = _turn_for(message, turns)
    if turn is None:
        return [*text, *(_function_call(call) for call in message.tool_calls)]
    items: list[dict[str, Any]] = []
    for kind, value in turn.order:
        if kind == "reasoning":
            items.append(value)
        elif kind == "text":
            items += text
            text = []
        else:
            items.append(_function_call(calls[value]))
    if text:  # text the reply did not have: before the calls
        first = next(i for i, item in enumerate(items) if item.get("type") == "function_call")
        items[first:first] = text
    return items


class _CallItems(bytes):
    """The JSON of an assistant turn with tool calls, with no reasoning: a type of its
    own, so that the turns a client may replay reasoning into are found by a C scan."""

    __slots__ = ()


def _items_bytes(message: ChatMessage, index: int) -> bytes:
    """The JSON of :func:`input_items` of one message, written out (a fifth of the cost of
    the generic form; the tests hold the two equal), with no reasoning replayed."""
    role = message.role
    if role == "tool":
        if message.tool_call_id is None:
            raise _no_call_id(index)
        return utf8(
            f'{{"type":"function_call_output","call_id":{_string(message.tool_call_id)},'
            f'"output":{_string(message.content or "")}}}'
        )
    if role == "assistant" and message.tool_calls:
        calls = ",".join(
            f'{{"type":"function_call","call_id":{_string(c.id)},"name":{_string(c.name)},'
            f'"arguments":{_string(c.arguments)}}}'
            for c in message.tool_calls
        )
        if message.content is not None:
            calls = f'{{"role":"assistant","content":{_string(message.content)}}},{calls}'
        return _CallItems(utf8(calls))
    return utf8(f'{{"role":{_string(role)},"content":{_string(message.content or "")}}}')


# Each message's input items as JSON, by identity (see WireCache), shared by all Responses
# clients: only what depends on the message alone (a client's reasoning is its own).
_ITEMS: Final = WireCache(_items_bytes)


def input_json(message: ChatMessage, index: int = 0) -> bytes:
    """The JSON of :func:`input_items` of one message (its items joined with commas),
    with no reasoning replayed, cached per message object (bounded: the oldest entries
    go past 32 MiB of JSON).

    >>> input_json(ChatMessage.tool("c1", "42"))
    b'{"type":"function_call_output","call_id":"c1","output":"42"}'
    """
    return _ITEMS.one(message, index)


def _function_call(call: ToolCall) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """A raf :class:`raf.Tool` as a Responses API function tool.

    ``strict`` is false, as with chat completions: raf checks the arguments
    itself, and a strict schema would refuse optional parameters.
    """
    wire: dict[str, Any] = {"type": "function", "name": tool.name}
    if tool.description:
        wire["description"] = tool.description
    wire["parameters"] = _plain(tool.parameters)
    wire["strict"] = False
    return wire


def _tool_choice(choice: str | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice in _TOOL_CHOICE_WORDS:
            return choice
        return {"type": "function", "name": choice}
    plain: dict[str, Any] = _plain(choice)
    return plain


# --- Replies ------------------------------------------------------------------------------


def response_from_reply(
    data: bytes, content_type: str, model: str
) -> tuple[AgentResponse, _Turn | None]:
    """The assistant turn of a 200 reply's body, and the reasoning to remember.

    A reply that is not a response raf can read is a :class:`raf.ChatProtocolError`;
    a failed or incomplete one a :class:`raf.ChatClientError`.
    """
    where = _where(model)
    reply = json_object(data, content_type, where)
    _check_status(reply, where)
    message, usage, turn = _read_response(reply, where)
    return AgentResponse((message,), usage, _sdk_response(reply)), turn


def _check_status(reply: dict[str, Any], where: str) -> None:
    """A failed or incomplete response as an error (not retryable, as the design says)."""
    status = reply.get("status")
    if status == "failed" or (status is None and reply.get("error") is not None):
        error = reply.get("error")
        code, text = _error_text(error)
        raise ChatClientError(f"{where}: the response failed{code}: {text}")
    if status == "incomplete":
        details = reply.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        raise ChatClientError(
            f"{where}: the response is incomplete"
            + (f" ({reason})" if reason else "")
            + (" - raise max_tokens" if reason == "max_output_tokens" else "")
        )


def _error_text(error: Any) -> tuple[str, str]:
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        return (f" ({code})" if code else "", str(message) if message else repr(error))
    return "", repr(error)


def _read_response(reply: dict[str, Any], where: str) -> tuple[ChatMessage, Usage | None, _Turn]:
    output = reply.get("output", _MISSING)
    if not isinstance(output, list):
        raise ChatProtocolError(f"{where}: 'output' is {_json_type(output)}, not a list")
    texts: list[str] | None = None
    refusals: list[str] = []
    calls: list[ToolCall] = []
    order: list[tuple[str, Any]] = []
    for n, item in enumerate(output):
        path = f"output[{n}]"
        if not isinstance(item, dict):
            raise ChatProtocolError(f"{where}: {path} is {_json_type(item)}, not an object")
        kind = item.get("type")
        if kind == "message":
            content = item.get("content", _MISSING)
            if not isinstance(content, list):
                raise ChatProtocolError(
                    f"{where}: {path}.content is {_json_type(content)}, not a list"
                )
            for m, part in enumerate(content):
                if not isinstance(part, dict):
                    raise ChatProtocolError(
                        f"{where}: {path}.content[{m}] is {_json_type(part)}, not an object"
                    )
                field = {"output_text": "text", "refusal": "refusal"}.get(part.get("type", ""))
                if field is None:
                    continue
                value = part.get(field, _MISSING)
                if not isinstance(value, str):
                    raise ChatProtocolError(
                        f"{where}: {path}.content[{m}].{field} is {_json_type(value)}, not a string"
                    )
                if field == "text":
                    texts = [*(texts or ()), value]
                else:
                    refusals.append(value)
            if not order or order[-1][0] != "text":
                order.append(("text", None))
        elif kind == "function_call":
            call = _function_call_item(item, path, where)
            calls.append(call)
            order.append(("call", call.id))
        elif kind == "reasoning":
            order.append(("reasoning", item))
        # Other items (built-in tools a run asked for through extra) stay in raw.
    text = None if texts is None else "".join(texts)
    if text is None and not calls and refusals:
        text = "".join(refusals)
    message = ChatMessage.assistant(text, tool_calls=calls)
    turn = _Turn(tuple(call.id for call in calls), tuple(order))
    return message, _usage(reply.get("usage"), where), turn


def _function_call_item(item: dict[str, Any], path: str, where: str) -> ToolCall:
    call_id = item.get("call_id", _MISSING)
    if not isinstance(call_id, str):
        raise ChatProtocolError(f"{where}: {path}.call_id is {_json_type(call_id)}, not a string")
    name = item.get("name", _MISSING)
    if not isinstance(name, str):
        raise ChatProtocolError(f"{where}: {path}.name is {_json_type(name)}, not a string")
    arguments = item.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        raise ChatProtocolError(
            f"{where}: {path}.arguments is {_json_type(arguments)}, not a string of JSON"
        )
    return ToolCall(call_id, name, arguments)


def _usage(raw: Any, where: str) -> Usage | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ChatProtocolError(f"{where}: 'usage' is {_json_type(raw)}, not an object")
    return Usage(
        _tokens(raw, "input_tokens", where),
        _tokens(raw, "output_tokens", where),
        cached_input_tokens=_tokens(raw, "input_tokens_details.cached_tokens", where),
        reasoning_tokens=_tokens(raw, "output_tokens_details.reasoning_tokens", where),
    )


def _sdk_response(reply: dict[str, Any]) -> Any:
    """The SDK's ``Response`` for ``raw``: validated, or built leniently."""
    from openai.types.responses import Response

    return _sdk_object(Response, reply)


# --- Streams ------------------------------------------------------------------------------


class _StreamState:
    """What a stream's events amount to so far; :meth:`feed` turns one into updates."""

    def __init__(self, model: str) -> None:
        self.where = _where(model)
        self.calls: dict[str, tuple[str, str]] = {}  # item id -> (call_id, name)
        self.sent_calls: set[str] = set()
        self.sent_text = False
        self.done = False
        self.turn: _Turn | None = None

    def feed(self, event: Any) -> list[Update]:
        where = self.where
        if not isinstance(event, dict):
            raise ChatProtocolError(f"{where}: an event is {_json_type(event)}, not an object")
        kind = event.get("type")
        if kind == "response.output_text.delta":
            delta = event.get("delta", _MISSING)
            if not isinstance(delta, str):
                raise ChatProtocolError(
                    f"{where}: a {kind} event's delta is {_json_type(delta)}, not a string"
                )
            self.sent_text = True
            return [Update.of_text(delta, raw=event)]
        if kind == "response.output_item.added":
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                call = _function_call_item(item, "output_item.added item", where)
                self.calls[str(item.get("id"))] = (call.id, call.name)
            return []
        if kind == "response.function_call_arguments.done":
            known = self.calls.get(str(event.get("item_id")))
            arguments = event.get("arguments")
            if known is None or not isinstance(arguments, str) or known[0] in self.sent_calls:
                return []  # the call is sent from its output item or response.completed
            self.sent_calls.add(known[0])
            return [Update.of_tool_call(ToolCall(known[0], known[1], arguments), raw=event)]
        if kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                call = _function_call_item(item, "output_item.done item", where)
                if call.id not in self.sent_calls:
                    self.sent_calls.add(call.id)
                    return [Update.of_tool_call(call, raw=event)]
            return []
        if kind == "response.completed":
            return self._completed(event)
        if kind in ("response.failed", "response.incomplete"):
            response = event.get("response")
            _check_status(response if isinstance(response, dict) else {"status": kind[9:]}, where)
            raise ChatClientError(f"{where}: the response ended with {kind}")
        if kind == "error":
            code, text = _error_text(event)
            raise ChatClientError(f"{where}: the server sent an error event{code}: {text}")
        return []  # deltas raf does not stream (reasoning summaries, refusals, ...)

    def _completed(self, event: dict[str, Any]) -> list[Update]:
        response = event.get("response")
        if not isinstance(response, dict):
            raise ChatProtocolError(
                f"{self.where}: response.completed's response is {_json_type(response)}, "
                "not an object"
            )
        message, usage, self.turn = _read_response(response, self.where)
        updates: list[Update] = []
        # Whatever the events did not carry: the answer is the completed response's.
        if not self.sent_text and message.content is not None:
            updates.append(Update.of_text(message.content, raw=event))
        updates += [
            Update.of_tool_call(call, raw=event)
            for call in message.tool_calls
            if call.id not in self.sent_calls
        ]
        if usage is not None:
            updates.append(Update.of_usage(usage, raw=event))
        self.done = True
        return updates


def _event(data: str, model: str) -> Any:
    """The JSON of one event's data."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ChatProtocolError(
            f"{_where(model)}: an event is not JSON ({exc}): {_quote(data.encode())}"
        ) from None


# --- Shared with the chat completions client, worded for this one -------------------------


def _where(model: str) -> str:
    return f"OpenAI response (model {model!r})"


def _reword(error: ChatClientError) -> ChatClientError:
    """The chat client's helpers name a chat completion: name a response instead."""
    text = str(error)
    if not text.startswith(_CHAT_WHERE):
        return error
    copy = type(error)(
        "OpenAI response" + text[len(_CHAT_WHERE) :],
        status_code=error.status_code,
        retry_after=error.retry_after,
    )
    copy.__cause__ = error.__cause__
    return copy


async def _reworded(awaitable: Any) -> Any:
    try:
        return await awaitable
    except ChatClientError as exc:
        raise _reword(exc) from exc.__cause__


def _http_errors() -> type[Exception]:
    import httpx2

    error: type[Exception] = httpx2.HTTPError
    return error


async def _close(response: Any) -> None:
    # Bounded and shielded: returning the connection must not hang or be cut.
    with anyio.move_on_after(5, shield=True):
        await response.aclose()
