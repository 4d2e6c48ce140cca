"""The Responses API request: each message as input items, the reasoning a client replays
into its assistant turns, the tools and options, and the body they make, as plain dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from raf._agent.tools import Tool
from raf._clients._sdk import TOOL_CHOICE_WORDS, body_extra, no_call_id, not_a_message, plain
from raf._errors import BadRequestError
from raf._values.messages import ChatMessage, ToolCall
from raf._values.options import ChatOptions
from raf._values.schema import text_format

__all__: list[str] = []

# Keys of the body that are the run's own, never an option's.
_OWN_KEYS: Final = frozenset({"input", "stream"})
_REASONING_INCLUDE: Final = "reasoning.encrypted_content"


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
    turns: Mapping[str, Turn],
    *,
    stream: bool = False,
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The model, the body and the SDK request options of one call (see
    :meth:`raf.OpenAIResponsesClient.request_body`); ``turns`` holds the reasoning to
    replay."""
    where = "OpenAIResponsesClient"
    body: dict[str, Any] = {"model": options.model or default_model}
    body["input"] = input_items(messages, turns)
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
    for key, value in body_extra(where, options.extra, request_options).items():
        if key in _OWN_KEYS or key == "stream_options":
            raise BadRequestError(
                f"{where}: extra option {key!r} is not allowed; "
                "the input is the run's messages, and stream() is how to stream"
            )
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
    return model, body, request_options


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
            raise not_a_message(index, message)
        role = message.role
        if role == "tool":
            if message.tool_call_id is None:
                raise no_call_id(index)
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
