"""The Responses API request: each message as input items (cached as JSON per message),
the reasoning a client replays into its assistant turns, the tools and options, and the
body they make, its keys in the SDK's order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from raf._agent.tools import Tool
from raf._clients._wire import (
    TOOL_CHOICE_WORDS,
    TRANSPORT_EXTRA,
    RecentBodies,
    WireCache,
    dumps,
    join_body,
    no_call_id,
    plain,
    string,
    utf8,
)
from raf._errors import BadRequestError
from raf._values.messages import ChatMessage, ToolCall
from raf._values.options import ChatOptions
from raf._values.schema import text_format

__all__: list[str] = []

# Keys of the body that are the run's own, never an option's.
_OWN_KEYS: Final = frozenset({"input", "stream"})
_REASONING_INCLUDE: Final = "reasoning.encrypted_content"
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
class Turn:
    """The order of one reply's output, for replay: reasoning items as they came,
    ``("text", None)`` where the text was, ``("call", call_id)`` for each call."""

    call_ids: tuple[str, ...]
    order: tuple[tuple[str, Any], ...]


def request_body(
    default_model: str,
    store: bool,
    messages: Sequence[ChatMessage],
    options: ChatOptions,
    bodies: RecentBodies,
    *,
    stream: bool = False,
) -> tuple[str, bytes, dict[str, Any]]:
    """The model, the JSON body and the SDK request options of one call (see
    :meth:`raf.OpenAIResponsesClient.request_body`); ``bodies`` holds the input parts
    of the client's last bodies."""
    where = "OpenAIResponsesClient"
    body: dict[str, Any] = {"model": options.model or default_model}
    if options.tools:
        body["tools"] = [tool_to_wire(t) for t in options.tools]
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.max_tokens is not None:
        body["max_output_tokens"] = options.max_tokens
    if options.tool_choice is not None:
        body["tool_choice"] = _tool_choice(options.tool_choice)
    if options.output_schema is not None:
        body["text"] = {"format": text_format(options.output_schema)}
    body["store"] = store
    include = [] if store else [_REASONING_INCLUDE]
    request_options: dict[str, Any] = {"security": {"bearer_auth": True}}
    extra = dict(options.extra)
    extra_body = extra.pop("extra_body", {})
    if not isinstance(extra_body, Mapping):
        raise BadRequestError(
            f"{where}: extra option 'extra_body' must be a mapping, got {type(extra_body).__name__}"
        )
    extra.update(extra_body)  # the SDK merges extra_body into the body: so does raf
    for key, value in extra.items():
        if key in _OWN_KEYS or key == "stream_options":
            raise BadRequestError(
                f"{where}: extra option {key!r} is not allowed; "
                "the input is the run's messages, and stream() is how to stream"
            )
        if key in TRANSPORT_EXTRA:
            if key == "timeout":
                request_options["timeout"] = value
            elif not isinstance(value, Mapping):
                raise BadRequestError(
                    f"{where}: extra option {key!r} must be a mapping, got {type(value).__name__}"
                )
            else:
                request_options["headers" if key == "extra_headers" else "params"] = dict(value)
        elif key == "include":
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise BadRequestError(
                    f"{where}: extra option 'include' must be a list of str, got {value!r}"
                )
            include += [v for v in value if v not in include]
        elif key == "text" and isinstance(value, Mapping) and "text" in body:
            body["text"] = {**body["text"], **value}  # verbosity and the like, with the format
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
        head_json = dumps(head).encode("utf-8", "backslashreplace")
        tail_json = dumps(tail).encode("utf-8", "backslashreplace")
    except (TypeError, ValueError) as exc:
        raise BadRequestError(f"{where}: a request option cannot be sent as JSON: {exc}") from exc
    # "store" is always there: the tail is never empty.
    body_bytes = join_body(head_json, b"input", bodies.chunks(messages), b"," + tail_json[1:])
    return model, body_bytes, request_options


# --- Messages to input items ------------------------------------------------------------


def input_items(
    messages: Sequence[ChatMessage], turns: Mapping[str, Turn] | None = None
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
            items += assistant_turn(message, turns)
        else:
            items.append({"role": role, "content": message.content or ""})
    return items


def turn_for(message: ChatMessage, turns: Mapping[str, Turn] | None) -> Turn | None:
    """The remembered turn whose reasoning goes back with ``message`` (an assistant turn
    with tool calls), if any: the turn of its first call, with the same calls."""
    turn = turns.get(message.tool_calls[0].id) if turns else None
    if turn is None or turn.call_ids != tuple({call.id: None for call in message.tool_calls}):
        # Not a turn this client answered (or one changed since): no reasoning to replay.
        return None
    return turn


def assistant_turn(message: ChatMessage, turns: Mapping[str, Turn] | None) -> list[dict[str, Any]]:
    """The input items of an assistant turn with tool calls, with the reasoning of its
    remembered turn (if any) replayed in the order the reply had."""
    calls = {call.id: call for call in message.tool_calls}
    text = (
        [{"role": "assistant", "content": message.content}] if message.content is not None else []
    )
    turn = turn_for(message, turns)
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


class CallItems(bytes):
    """The JSON of an assistant turn with tool calls, with no reasoning: a type of its
    own, so that the turns a client may replay reasoning into are found by a C scan."""

    __slots__ = ()


def _items_bytes(message: ChatMessage, index: int) -> bytes:
    """The JSON of :func:`input_items` of one message, written out (a fifth of the cost of
    the generic form; the tests hold the two equal), with no reasoning replayed."""
    role = message.role
    if role == "tool":
        if message.tool_call_id is None:
            raise no_call_id(index)
        return utf8(
            f'{{"type":"function_call_output","call_id":{string(message.tool_call_id)},'
            f'"output":{string(message.content or "")}}}'
        )
    if role == "assistant" and message.tool_calls:
        calls = ",".join(
            f'{{"type":"function_call","call_id":{string(c.id)},"name":{string(c.name)},'
            f'"arguments":{string(c.arguments)}}}'
            for c in message.tool_calls
        )
        if message.content is not None:
            calls = f'{{"role":"assistant","content":{string(message.content)}}},{calls}'
        return CallItems(utf8(calls))
    return utf8(f'{{"role":{string(role)},"content":{string(message.content or "")}}}')


# Each message's input items as JSON, by identity (see WireCache), shared by all Responses
# clients: only what depends on the message alone (a client's reasoning is its own).
ITEMS: Final = WireCache(_items_bytes)


def input_json(message: ChatMessage, index: int = 0) -> bytes:
    """The JSON of :func:`input_items` of one message (its items joined with commas),
    with no reasoning replayed, cached per message object (bounded: the oldest entries
    go past 32 MiB of JSON).

    >>> input_json(ChatMessage.tool("c1", "42"))
    b'{"type":"function_call_output","call_id":"c1","output":"42"}'
    """
    return ITEMS.one(message, index)


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
    wire["parameters"] = plain(tool.parameters)
    wire["strict"] = False
    return wire


def _tool_choice(choice: str | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice in TOOL_CHOICE_WORDS:
            return choice
        return {"type": "function", "name": choice}
    mapping: dict[str, Any] = plain(choice)
    return mapping
