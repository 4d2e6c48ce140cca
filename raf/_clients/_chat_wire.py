"""The chat completions request: each message in the wire format (cached as JSON per
message), the tools and options, and the body they make."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from raf._agent.tools import Tool
from raf._clients._wire import (
    NO_KEYS,
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
from raf._values.messages import ChatMessage
from raf._values.options import ChatOptions
from raf._values.schema import response_format

__all__: list[str] = []

# Options that would make the server answer with a stream, which complete() cannot read.
_REFUSED_EXTRA: Final = frozenset({"stream", "stream_options"})
#: What a streamed call adds to its body: the usage comes in a last chunk of its own.
STREAM_TAIL: Final = b',"stream":true,"stream_options":{"include_usage":true}'


def request_body(
    default_model: str,
    messages: Sequence[ChatMessage],
    options: ChatOptions,
    bodies: RecentBodies,
    tail: bytes,
) -> tuple[str, bytes, dict[str, Any]]:
    """The model, the JSON body and the SDK request options of one call (see
    :meth:`raf.OpenAIChatClient.request_body`), with ``tail`` (``b',"key":value'``)
    closing the body; ``bodies`` holds the message parts of the client's last bodies."""
    head: dict[str, Any] = {"model": options.model or default_model}
    if options.tools:
        head["tools"] = [tool_to_wire(t) for t in options.tools]
    if options.temperature is not None:
        head["temperature"] = options.temperature
    if options.max_tokens is not None:
        head["max_tokens"] = options.max_tokens
    if options.tool_choice is not None:
        head["tool_choice"] = _tool_choice(options.tool_choice)
    if options.output_schema is not None:
        head["response_format"] = response_format(options.output_schema)
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
        if key in TRANSPORT_EXTRA:
            _transport_option(key, value, head, request_options)
        else:
            head[key] = value
    model = head["model"]
    if not isinstance(model, str):
        raise BadRequestError(f"OpenAIChatClient: model must be a str, got {model!r}")
    try:
        head_json = dumps(head)
    except (TypeError, ValueError) as exc:
        raise BadRequestError(
            f"OpenAIChatClient: a request option cannot be sent as JSON: {exc}"
        ) from exc
    head_bytes = head_json.encode("utf-8", "backslashreplace")
    body = join_body(head_bytes, b"messages", bodies.chunks(messages), tail + b"}")
    return model, body, request_options


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


def messages_run(messages: tuple[ChatMessage, ...], start: int) -> tuple[bytes, frozenset[str]]:
    """The JSON of a run of messages, for :class:`RecentBodies`: it depends on them alone."""
    return b",".join(_WIRE.many(messages, start)), NO_KEYS


def _message_text(message: ChatMessage, index: int) -> str:
    """``dumps(message_to_wire(message))``, written out: a fifth of the cost for a miss.

    Every string goes through the json module's own C string encoder; the
    tests hold this equal to the generic form.
    """
    role = message.role
    if role == "tool":
        if message.tool_call_id is None:
            raise no_call_id(index)
        return (
            f'{{"role":"tool","tool_call_id":{string(message.tool_call_id)},'
            f'"content":{string(message.content or "")}}}'
        )
    if role == "assistant" and message.tool_calls:
        content = "null" if message.content is None else string(message.content)
        calls = ",".join(
            f'{{"id":{string(c.id)},"type":"function","function":{{"name":{string(c.name)},'
            f'"arguments":{string(c.arguments)}}}}}'
            for c in message.tool_calls
        )
        text = f'{{"role":"assistant","content":{content},"tool_calls":[{calls}]'
    else:
        text = f'{{"role":{string(role)},"content":{string(message.content or "")}'
    if message.name is not None:
        text += f',"name":{string(message.name)}'
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
