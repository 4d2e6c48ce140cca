"""The OpenAI chat completions protocol on the server side: requests in, chunks out."""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import attrs

from raf._sessions.base import Session, missing_pending
from raf._values.decision import Decision
from raf._values.messages import (
    AgentResponse,
    ChatMessage,
    PendingCall,
    ToolCall,
    Update,
    Usage,
)
from raf._values.options import AgentRunOptions
from raf._values.protocols import Tool
from raf.serve._client import (
    TEXT_JOIN,
    client_calls,
    client_tools,
    output_type,
    parallel_calls,
    run_options,
    tool_choice,
    turn_text,
)
from raf.serve._http import HttpError
from raf.serve._pending import PENDING, decisions_in, pending_json, pending_text

__all__: list[str] = []

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@attrs.frozen
class CompletionRequest:
    """A checked ``POST /v1/chat/completions`` body."""

    model: str
    messages: tuple[ChatMessage, ...]
    stream: bool
    include_usage: bool
    # temperature, max_tokens, tools, tool_choice, output_type: over the served agent's options
    overrides: Mapping[str, Any]
    # raf_decisions: the calls that wait, decided (the messages then add none)
    decisions: tuple[Decision, ...] = ()

    def options(self, base: AgentRunOptions, client: Any = None) -> AgentRunOptions:
        """``base`` with what this request sets (for the served agent's ``client``)."""
        return run_options(base, self.overrides, client)

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The client's tools (the run's options' ``tools``)."""
        tools: tuple[Tool, ...] = self.overrides.get("tools", ())
        return tools


#: The fields of a chat completions body that the server honours.
ACCEPTED = frozenset(
    {
        "model", "messages", "stream", "stream_options", "temperature", "max_tokens",
        "max_completion_tokens", "tools", "tool_choice", "response_format", "user",
        "metadata", "prompt_cache_key", "raf_decisions",
        "parallel_tool_calls",
    }
)  # fmt: skip
#: Fields that are fine at their neutral value (what some clients always send), else a 400.
_NEUTRAL: Mapping[str, tuple[Any, ...]] = {
    "n": (1,),
    "logprobs": (False,),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "top_p": (1, 1.0),
    "modalities": (["text"],),
    "include": ([],),
    "truncation": ("disabled",),
}


def refused_fields(body: Mapping[str, Any], accepted: frozenset[str] = ACCEPTED) -> None:
    """A 400 naming the first field the server cannot honour (a null counts as absent)."""
    for name, value in body.items():
        if value is None or name in accepted:
            continue
        neutral = _NEUTRAL.get(name, ())
        if any(type(value) is type(n) and value == n for n in neutral):
            continue
        raise HttpError(
            400,
            f"the field {name!r:.60} is not supported by this server (the docs list "
            "the accepted fields)",
            code="unsupported_field",
        )


def parse_completion(body: Any, agent_tools: Sequence[Tool] = ()) -> CompletionRequest:
    """Check a chat completions body; anything wrong is an :class:`HttpError` 400.

    ``agent_tools`` are the served agent's own: a client tool may not take a name of theirs.
    """
    if not isinstance(body, dict):
        raise HttpError(400, f"the body must be a JSON object, got {_json_type(body)}")
    refused_fields(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise HttpError(400, "'model' must be a non-empty string", code="invalid_model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise HttpError(400, f"'stream' must be a boolean, got {_json_type(stream)}")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise HttpError(400, "'stream_options' must be an object")
    include_usage = stream_options.get("include_usage", False) is True
    decisions = decisions_in(body)
    given = body.get("messages")
    return CompletionRequest(
        model,
        () if decisions and not given else parse_messages(given),
        bool(stream),
        include_usage,
        {**sampling(body), **_client_options(body, agent_tools)},
        decisions,
    )


def _client_options(body: Mapping[str, Any], agent_tools: Sequence[Tool]) -> dict[str, Any]:
    """The client's tools, tool choice and output format, as run options."""
    tools = client_tools(body.get("tools"), agent_tools)
    overrides: dict[str, Any] = {"tools": tools} if tools else {}
    choice = tool_choice(body.get("tool_choice"), (*agent_tools, *tools))
    if choice is not None:
        overrides["tool_choice"] = choice
    output = output_type(body.get("response_format"))
    if output is not None:
        overrides["output_type"] = output
    return overrides | parallel_calls(body.get("parallel_tool_calls"))


def sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """A body's ``temperature`` and ``max_tokens`` as run options; 400 when malformed."""
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)  # 1e999 is inf, which no model takes
    ):
        raise HttpError(400, "'temperature' must be a finite number")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise HttpError(400, "'max_tokens' must be a positive integer")
    overrides: dict[str, Any] = {}
    if temperature is not None:
        overrides["temperature"] = float(temperature)
    if max_tokens is not None:
        overrides["max_tokens"] = max_tokens
    return overrides


def parse_messages(value: Any) -> tuple[ChatMessage, ...]:
    """OpenAI messages as raf messages; 400 for a missing list, a bad item, an unknown role."""
    if not isinstance(value, list) or not value:
        raise HttpError(400, "'messages' must be a non-empty list of message objects")
    return tuple(_message(item, index) for index, item in enumerate(value))


def unanswerable(messages: Sequence[ChatMessage], called: Iterable[str] = ()) -> str | None:
    """The id of a ``tool`` message that answers no call before it (in ``messages``, or
    ``called``: a stored history's), or ``None``. A model refuses such a request, which
    would come back as "the model failed"; it is the client's mistake, a 400."""
    calls = set(called)
    for message in messages:
        calls.update(call.id for call in message.tool_calls)
        if message.role == "tool" and message.tool_call_id not in calls:
            return message.tool_call_id
    return None


async def check_answers(
    messages: Sequence[ChatMessage],
    session: Session | None,
    server_tools: Collection[str] = (),
    what: str = "a tool message",
    named: str = "tool_call_id",
) -> None:
    """A 400 for a ``tool`` message (``what``, its call's id ``named``) that answers no
    call, of ``messages`` or of the session's stored history, or that answers the
    server's own call, stored in the session: one of ``server_tools`` (the agent's), or
    one that waits for approval (a person decides it, with ``raf_decisions``)."""
    answered = {m.tool_call_id for m in messages if m.role == "tool"}
    if not answered:
        return
    stored: Sequence[ChatMessage] = () if session is None else await session.get_messages()
    orphan = unanswerable(messages, (c.id for m in stored for c in m.tool_calls))
    if orphan is not None:
        raise HttpError(400, f"{what} answers no call: {named} {orphan!r:.80}", code="bad_tool")
    waiting = set()
    if session is not None and not missing_pending(session):
        waiting = {p.call.id for p in await session.list_pending()}
    # A stateless request's history is the client's own (it may replay another server's
    # calls); the session's stored calls of the agent's tools are this server's. A model
    # may reuse an id from turn to turn: the last call of an id is the one answered.
    latest = {c.id: c for m in stored for c in m.tool_calls if c.id in answered}
    for call in latest.values():
        if call.id in waiting or call.name in server_tools:
            raise HttpError(
                400,
                f"{what} cannot answer the server's own call: {named} {call.id!r:.80} (the "
                f"tool {call.name!r:.80} runs on the server"
                + (
                    "; it waits for a person's approval: send a decision for it)"
                    if call.id in waiting
                    else ")"
                ),
                code="bad_tool",
            )


def _message(item: Any, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(item, dict):
        raise HttpError(400, f"{where} must be an object, got {_json_type(item)}")
    role = item.get("role")
    if role not in _ROLES:
        raise HttpError(
            400, f"{where}.role must be one of {', '.join(sorted(_ROLES))}, got {role!r:.40}"
        )
    content = _content(item.get("content"), where)
    name = item.get("name")
    if name is not None and not isinstance(name, str):
        raise HttpError(400, f"{where}.name must be a string")
    if role == "tool":
        call_id = item.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise HttpError(400, f"{where}.tool_call_id must be a non-empty string")
        return ChatMessage.tool(call_id, content or "")
    if role == "assistant":
        return ChatMessage("assistant", content, name=name, tool_calls=_calls(item, where))
    if content is None:
        raise HttpError(400, f"{where}.content must be a string or a list of text parts")
    return ChatMessage("system" if role == "developer" else role, content, name=name)


def _content(value: Any, where: str) -> str | None:
    """Text, or a list of text parts joined; other part types are a 400."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise HttpError(400, f"{where}.content must be a string or a list of text parts")
    texts: list[str] = []
    for number, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else _json_type(part)
            raise HttpError(400, f"{where}.content[{number}] must be a text part, got {kind!r:.40}")
        text = part.get("text")
        if not isinstance(text, str):
            raise HttpError(400, f"{where}.content[{number}].text must be a string")
        texts.append(text)
    return "".join(texts)


def _calls(item: Mapping[str, Any], where: str) -> tuple[ToolCall, ...]:
    calls = item.get("tool_calls") or []
    if not isinstance(calls, list):
        raise HttpError(400, f"{where}.tool_calls must be a list")
    result: list[ToolCall] = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(call.get("id"), str)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments", "{}"), str)
        ):
            raise HttpError(
                400, f"{where}.tool_calls[{number}] must be {{id, function: {{name, arguments}}}}"
            )
        result.append(ToolCall(call["id"], function["name"], function.get("arguments", "{}")))
    return tuple(result)


def new_messages(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The messages after the last assistant message: what a session's turn adds."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "assistant":
            return tuple(messages[index + 1 :])
    return tuple(messages)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else "a value")


def usage_json(usage: Usage | None) -> dict[str, Any]:
    """raf's usage in OpenAI's words: the cached part of the prompt and the reasoning part
    of the completion in their details, as OpenAI reports them."""
    usage = usage or Usage()
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def completion(model: str, response: AgentResponse, tools: Sequence[Tool] = ()) -> dict[str, Any]:
    """A whole ``chat.completion``: the run's answer as one assistant message, with the
    calls of the client's ``tools`` it ended on (``finish_reason: "tool_calls"``), and
    the calls that wait for approval (in the text, and as ``raf_pending``)."""
    text = turn_text(response)
    if response.pending:
        text = TEXT_JOIN.join(t for t in (text, pending_text(response.pending)) if t)
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if response.pending:
        message[PENDING] = pending_json(response.pending)
    calls = client_calls(response, tools)
    if calls:
        message["tool_calls"] = [_call_json(call) for call in calls]
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
        "usage": usage_json(response.usage),
    }


def _call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    named = {"id": call.id, "type": "function"}
    function = {"name": call.name, "arguments": call.arguments}
    return (
        {**named, "function": function}
        if index is None
        else {"index": index, **named, "function": function}
    )


class ChunkFraming:
    """A streamed run as ``chat.completion.chunk`` server-sent events.

    The agent's own tool calls and their results are its inner work, not
    the caller's: the text goes out (a later model call's text after a
    blank line, as in the whole answer), and the calls of the client's
    tools; the calls that wait for approval as text when they come; then a
    chunk with the finish reason (its delta lists the calls that wait, as
    ``raf_pending``), the usage in a last chunk with empty ``choices`` when
    asked, and ``data: [DONE]``.
    """

    def __init__(self, model: str, include_usage: bool, tools: Sequence[Tool] = ()) -> None:
        self._id = f"chatcmpl-{uuid.uuid4().hex}"
        self._created = int(time.time())
        self._model = model
        self._include_usage = include_usage
        self._client_tools = {tool.name for tool in tools}
        self._calls = 0  # the client calls sent
        self._texted = False  # whether text went out
        self._between = False  # whether a model call ended since the last text
        self._pending: list[PendingCall] = []  # the calls that wait for approval

    def _chunk(self, choices: list[dict[str, Any]], **more: Any) -> bytes:
        body = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            **more,
        }
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    def start(self) -> list[bytes]:
        delta = {"role": "assistant", "content": ""}
        return [self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])]

    def update(self, update: Update) -> list[bytes]:
        if update.kind == "tool_result":  # the next text is a later model call's
            self._between = True
        call = update.tool_call
        if update.kind == "tool_call" and call is not None and call.name in self._client_tools:
            delta: dict[str, Any] = {"tool_calls": [_call_json(call, self._calls)]}
            self._calls += 1
            return [self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])]
        if update.kind == "approval" and update.pending is not None:
            first = not self._pending
            self._pending.append(update.pending)
            text = pending_text([update.pending])
            if self._texted:  # the whole answer's words: a blank line, then a line each
                text = (TEXT_JOIN if first else "\n") + text
            self._texted, self._between = True, False
            delta = {"content": text}
            return [self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])]
        if update.kind != "text" or not update.text:
            return []
        text = update.text
        if self._between and self._texted:
            text = TEXT_JOIN + text
        self._texted, self._between = True, False
        delta = {"content": text}
        return [self._chunk([{"index": 0, "delta": delta, "finish_reason": None}])]

    def finish(self, response: AgentResponse) -> list[bytes]:
        reason = "tool_calls" if self._calls else "stop"
        # The run's own: a durable run's wait that was decided in the stream waits no more.
        pending = response.pending
        last: dict[str, Any] = {PENDING: pending_json(pending)} if pending else {}
        chunks = [self._chunk([{"index": 0, "delta": last, "finish_reason": reason}])]
        if self._include_usage:
            chunks.append(self._chunk([], usage=usage_json(response.usage)))
        return [*chunks, b"data: [DONE]\n\n"]

    def failed(self, error: HttpError) -> list[bytes]:
        # An error event mid-stream: the OpenAI SDK raises it as an APIError.
        fields = {"message": error.message, "type": error.type, "code": error.code}
        body = {"error": {**fields, "request_id": error.request_id}}
        return [b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"]
