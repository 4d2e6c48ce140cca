"""The chat completions request: each message in the wire format, the tools and options,
and the body they make, as plain dicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from raf._agent.tools import Tool
from raf._clients._sdk import TOOL_CHOICE_WORDS, body_extra, no_call_id, not_a_message, plain
from raf._errors import BadRequestError
from raf._values.messages import ChatMessage
from raf._values.options import ChatOptions
from raf._values.schema import response_format

__all__: list[str] = []

_WHERE: Final = "OpenAIChatClient"
# Options that would make the server answer with a stream, which complete() cannot read.
_REFUSED_EXTRA: Final = frozenset({"stream", "stream_options"})


def request_body(
    default_model: str, messages: Sequence[ChatMessage], options: ChatOptions, *, stream: bool
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The model, the body and the SDK request options of one call (see
    :meth:`raf.OpenAIChatClient.request_body`)."""
    body: dict[str, Any] = {"model": options.model or default_model}
    body["messages"] = [message_to_wire(m, i) for i, m in enumerate(messages)]
    if options.tools:
        body["tools"] = [tool_to_wire(t) for t in options.tools]
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.max_tokens is not None:
        body["max_tokens"] = options.max_tokens
    if options.tool_choice is not None:
        body["tool_choice"] = _tool_choice(options.tool_choice)
    if options.output_schema is not None:
        body["response_format"] = response_format(options.output_schema)
    request_options: dict[str, Any] = {"security": {"bearer_auth": True}}
    for key, value in body_extra(_WHERE, options.extra, request_options).items():
        if key in _REFUSED_EXTRA:
            if value:
                raise BadRequestError(
                    f"{_WHERE}: extra option {key!r} is not supported; "
                    "stream a run instead (agent.stream(...) or on_update=)"
                )
        elif key == "messages":
            raise BadRequestError(
                f"{_WHERE}: extra option 'messages' is not allowed; the messages are the run's"
            )
        else:
            body[key] = value
    if stream:  # the usage comes in a last chunk of its own
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    model = body["model"]
    if not isinstance(model, str):
        raise BadRequestError(f"{_WHERE}: model must be a str, got {model!r}")
    return model, body, request_options


def message_to_wire(message: ChatMessage, index: int = 0) -> dict[str, Any]:
    """One message in the OpenAI wire format (``messages[index]`` of a call, for errors).

    >>> message_to_wire(ChatMessage.tool("call_1", "42"))
    {'role': 'tool', 'tool_call_id': 'call_1', 'content': '42'}
    """
    if type(message) is not ChatMessage:
        raise not_a_message(index, message)
    role = message.role
    if role == "tool":
        if message.tool_call_id is None:
            raise no_call_id(index)
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


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """A raf :class:`raf.Tool` as an OpenAI function tool with its JSON Schema."""
    function: dict[str, Any] = {"name": tool.name, "parameters": plain(tool.parameters)}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(choice: str | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice in TOOL_CHOICE_WORDS:
            return choice
        return {"type": "function", "function": {"name": choice}}
    mapping: dict[str, Any] = plain(choice)
    return mapping
