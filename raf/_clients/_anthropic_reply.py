"""The Anthropic Messages API reply: a message's body, or a stream's events, as raf's
response and updates, its thinking blocks (in their order among the text and the calls)
kept on the assistant message."""

from __future__ import annotations

import json
from typing import Any, Final

from raf._clients._overflow import overflow
from raf._clients._reply import built, json_object, json_type, quote
from raf._clients._sdk import MAX_QUOTED
from raf._values.carried import Compaction, Reasoning
from raf._values.messages import AgentResponse, ChatMessage, ToolCall, Update, Usage
from raf.errors import (
    ChatClientError,
    ChatConnectionError,
    ChatProtocolError,
    IncompleteResponseError,
    RateLimitError,
    ServerError,
)

__all__: list[str] = []

#: The source of the reasoning this wire carries (see :class:`raf.Reasoning`).
SOURCE: Final = "anthropic"

#: Stop reasons of an answer the model did not finish.
_CUT: Final = frozenset({"max_tokens", "model_context_window_exceeded", "pause_turn"})
#: Blocks that are the model's reasoning: kept, in order, and sent back unchanged.
THINKING: Final = frozenset({"thinking", "redacted_thinking"})
#: The error event types that are worth trying again, as the HTTP statuses they stand for.
_RETRYABLE: Final = {
    "overloaded_error": (ServerError, 529),
    "api_error": (ServerError, 500),
    "rate_limit_error": (RateLimitError, 429),
}


def call_name(model: str) -> str:
    """How errors name a call of ``model``."""
    return f"Anthropic message (model {model!r})"


def arguments_of(tool_input: Any, where: str = "Anthropic message") -> str:
    """A ``tool_use`` block's ``input`` as the arguments of a :class:`raf.ToolCall`; a
    :class:`raf.errors.ChatProtocolError` when it is nested too deeply to write."""
    try:
        return json.dumps(tool_input, separators=(",", ":"), ensure_ascii=False)
    except RecursionError:
        raise ChatProtocolError(f"{where}: a tool_use input is nested too deeply") from None


def response_from_reply(data: bytes, content_type: str, model: str) -> AgentResponse:
    """The assistant turn of a 200 reply's body, its thinking on the message.

    A reply that is not a message raf can read is a :class:`raf.errors.ChatProtocolError`;
    a cut one an :class:`raf.errors.IncompleteResponseError`; a refusal a
    :class:`raf.ChatClientError` (see :func:`check_stop`).
    """
    where = call_name(model)
    reply = json_object(data, content_type, where, "the reply")
    if reply.get("type") == "error":
        raise error_from_event(reply, where)
    message = read_content(reply.get("content"), where)
    response = AgentResponse((message,), read_usage(reply.get("usage"), where), _raw(reply, where))
    check_stop(reply.get("stop_reason"), where, response)
    return response


def _raw(reply: dict[str, Any], where: str) -> Any:
    """The SDK's ``Message`` of a reply (see :func:`built`)."""
    from anthropic.types import Message

    return built(Message, reply, where)


def read_content(content: Any, where: str, at: str = "content") -> ChatMessage:
    """The assistant message of a reply's ``content`` blocks. Its thinking blocks as they
    came, with their place among the text (``{"type": "text"}``) and the calls
    (``{"type": "tool_use", "id": ...}``), are its :class:`raf.Reasoning`; a ``compaction``
    block its :class:`raf.Compaction`."""
    if not isinstance(content, list):
        raise ChatProtocolError(f"{where}: {at} is {json_type(content)}, not a list")
    texts: list[str] | None = None
    calls: list[ToolCall] = []
    order: list[dict[str, Any]] = []
    compaction: Compaction | None = None
    for index, block in enumerate(content):
        if not isinstance(block, dict):
            raise ChatProtocolError(f"{where}: {at}[{index}] is {json_type(block)}, not an object")
        kind = block.get("type")
        if kind == "text":
            texts = [*(texts or ()), _str(block, "text", where, f"{at}[{index}]")]
            if not order or order[-1] != {"type": "text"}:
                order.append({"type": "text"})
        elif kind == "tool_use":
            calls.append(_tool_use(block, where, f"{at}[{index}]"))
            order.append({"type": "tool_use", "id": calls[-1].id})
        elif kind in THINKING:
            order.append(block)
        elif kind == "compaction":  # the server compacted what came before this turn
            compaction = _compaction(block)
        # Other blocks (server tools a run asked for through extra) stay in raw.
    text = None if texts is None else "".join(texts)
    thought = any(block["type"] in THINKING for block in order)
    reasoning = Reasoning(SOURCE, json.dumps(order, separators=(",", ":"))) if thought else None
    return ChatMessage.assistant(text, tool_calls=calls, reasoning=reasoning, compaction=compaction)


def _compaction(block: dict[str, Any]) -> Compaction:
    """A ``compaction`` block as raf's :class:`raf.Compaction`: the block as it came, and
    its summary (its ``content``; none when the compaction failed)."""
    summary = block.get("content")
    text = json.dumps(block, separators=(",", ":"), ensure_ascii=False)
    return Compaction(SOURCE, text, summary if isinstance(summary, str) and summary else None)


def _str(block: dict[str, Any], key: str, where: str, at: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise ChatProtocolError(f"{where}: {at}.{key} is {json_type(value)}, not a string")
    return value


def _tool_use(block: dict[str, Any], where: str, at: str) -> ToolCall:
    tool_input = block.get("input")
    if isinstance(tool_input, str):  # a stream's assembled JSON, whole or cut
        arguments = tool_input
    elif isinstance(tool_input, dict):
        arguments = arguments_of(tool_input, where)
    else:
        raise ChatProtocolError(f"{where}: {at}.input is {json_type(tool_input)}, not an object")
    return ToolCall(_str(block, "id", where, at), _str(block, "name", where, at), arguments)


_COUNTS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)


def read_usage(usage: Any, where: str) -> Usage | None:
    """A reply's ``usage``: raf's input tokens are Anthropic's plus the cache's reads and
    writes (Anthropic counts those apart)."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise ChatProtocolError(f"{where}: usage is {json_type(usage)}, not an object")
    counts = []
    for key in _COUNTS:
        value = usage.get(key)
        if value is not None and (type(value) is not int or value < 0):
            raise ChatProtocolError(
                f"{where}: usage.{key} is {json_type(value)}, not a count of tokens"
            )
        counts.append(value or 0)
    fresh, output, read, written = counts
    return Usage(
        fresh + read + written, output, cached_input_tokens=read, cache_write_tokens=written
    )


def check_stop(reason: Any, where: str, partial: AgentResponse) -> None:
    """A cut answer (``max_tokens``, the context window, a paused turn) as an
    :class:`raf.errors.IncompleteResponseError` with ``partial``; a refusal as a
    :class:`raf.ChatClientError` that names it (not retryable: never an answer)."""
    if reason in _CUT:
        hint = " - raise max_tokens" if reason == "max_tokens" else ""
        raise IncompleteResponseError(
            f"{where}: the answer was cut (stop_reason {reason!r}){hint}",
            reason=str(reason),
            partial=partial,
        )
    if reason == "refusal":
        raise ChatClientError(
            f"{where}: the model refused to answer (stop_reason 'refusal'); "
            "the request is not answered"
        )


def error_from_event(event: dict[str, Any], where: str) -> ChatClientError:
    """An ``error`` event (or error body in a 200 reply) as raf's error: overloaded,
    API and rate limit errors are retryable, as their HTTP statuses would be."""
    error = event.get("error")
    kind = error.get("type") if isinstance(error, dict) else None
    text = error.get("message") if isinstance(error, dict) else None
    error_class, status = _RETRYABLE.get(str(kind), (ChatClientError, None))
    said = f"{where}: the server sent an error ({kind:.80}): "
    said += f"{text if text else quote(repr(event)):.{MAX_QUOTED}}"
    return overflow(error, said, status) or error_class(said, status_code=status)


class StreamState:
    """What a stream's events amount to so far; :meth:`feed` turns one into updates.

    Text deltas go out as they come; the tool calls and the usage once
    ``message_stop`` says the message is whole (only then are the calls'
    arguments known to be complete); a stream that ends before it is a
    :class:`raf.errors.ChatConnectionError`.
    """

    def __init__(self, model: str) -> None:
        self.where = call_name(model)
        self.done = False
        self.blocks: dict[int, dict[str, Any]] = {}  # index -> the block so far
        self.inputs: dict[int, list[str]] = {}  # index -> a tool_use's JSON pieces
        self.usage: dict[str, Any] = {}
        self.stop_reason: Any = None
        self.text: list[str] = []

    def plain(self, data: bytes, content_type: str) -> list[Update]:
        """A reply that is no event stream: an error that quotes it."""
        raise ChatProtocolError(
            f"{self.where}: a streamed request was answered with "
            f"{content_type or 'no content-type'}, not an event stream: {quote(data)}"
        )

    def finish(self) -> list[Update]:
        """Nothing: the answer came with message_stop, or the stream was cut short (the
        SDK itself would take such a stream for a whole one)."""
        if not self.done:
            raise ChatConnectionError(f"{self.where}: the event stream ended before message_stop")
        return []

    def feed(self, data: str) -> list[Update]:
        """The updates of one event's data (none once the message is whole)."""
        if self.done:
            return []  # read to the end: the connection can then be reused
        event = json_object(data, None, self.where, "an event")
        kind = event.get("type")
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_start":
            return self._start(event)
        if kind == "content_block_stop":
            self._stop(event)
        elif kind == "message_start":
            message = event.get("message")
            self._add_usage(message.get("usage") if isinstance(message, dict) else None)
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                self.stop_reason = delta["stop_reason"]
            self._add_usage(event.get("usage"))
        elif kind == "message_stop":
            return self._whole(event)
        elif kind == "error":
            raise error_from_event(event, self.where)
        return []  # ping, and events raf does not read

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("index")
        if type(index) is not int:
            kind = event.get("type")
            raise ChatProtocolError(f"{self.where}: a {kind} event's index is {json_type(index)}")
        return index

    def _start(self, event: dict[str, Any]) -> list[Update]:
        block = event.get("content_block")
        if not isinstance(block, dict):
            raise ChatProtocolError(
                f"{self.where}: a content_block_start's content_block is {json_type(block)}"
            )
        index = self._index(event)
        self.blocks[index] = dict(block)
        if block.get("type") == "tool_use":
            self.inputs[index] = []
        text = block.get("text")
        if block.get("type") == "text" and isinstance(text, str) and text:
            self.text.append(text)
            return [Update.of_text(text, raw=event)]
        return []

    def _delta(self, event: dict[str, Any]) -> list[Update]:
        index = self._index(event)
        block = self.blocks.get(index)
        delta = event.get("delta")
        if block is None or not isinstance(delta, dict):
            raise ChatProtocolError(
                f"{self.where}: a content_block_delta for block {index}, "
                "which no content_block_start began"
            )
        kind = delta.get("type")
        key, into = {
            "text_delta": ("text", "text"),
            "thinking_delta": ("thinking", "thinking"),
            "signature_delta": ("signature", "signature"),
            "compaction_delta": ("content", "content"),
            "input_json_delta": ("partial_json", ""),
        }.get(str(kind), ("", ""))
        if not key:
            return []  # citations and the like: in raw
        if kind == "compaction_delta":
            # A summary and its opaque metadata, each as it comes (either may be null).
            for field in ("content", "encrypted_content"):
                if isinstance(delta.get(field), str):
                    block[field] = str(block.get(field) or "") + delta[field]
            return []
        piece = delta.get(key)
        if not isinstance(piece, str):
            raise ChatProtocolError(f"{self.where}: a {kind}'s {key} is {json_type(piece)}")
        if not into:
            self.inputs.setdefault(index, []).append(piece)
            return []
        # A signature comes whole; text and thinking come in pieces.
        block[into] = piece if into == "signature" else str(block.get(into) or "") + piece
        if kind != "text_delta":
            return []
        self.text.append(piece)
        return [Update.of_text(piece, raw=event)]

    def _stop(self, event: dict[str, Any]) -> None:
        index = self._index(event)
        pieces = self.inputs.get(index)
        if pieces is None or index not in self.blocks:
            return
        text = "".join(pieces) or "{}"
        try:
            self.blocks[index]["input"] = arguments_of(json.loads(text), self.where)
        except ValueError:
            self.blocks[index]["input"] = text  # cut JSON: raf's tool loop refuses it
        except RecursionError:
            raise ChatProtocolError(
                f"{self.where}: the tool_use input of block {index} is nested too deeply"
            ) from None

    def _add_usage(self, usage: Any) -> None:
        if isinstance(usage, dict):
            # message_delta's counts are the totals so far: the later figure wins.
            self.usage |= {key: value for key, value in usage.items() if value is not None}

    def _whole(self, event: dict[str, Any]) -> list[Update]:
        content = [self.blocks[index] for index in sorted(self.blocks)]
        message = read_content(content, self.where, "the streamed content")
        usage = read_usage(self.usage or None, self.where)
        check_stop(self.stop_reason, self.where, AgentResponse((message,), usage, event))
        self.done = True
        updates = [Update.of_tool_call(call, raw=event) for call in message.tool_calls]
        if message.reasoning is not None:
            updates.append(Update.of_reasoning(message.reasoning, raw=event))
        if message.compaction is not None:
            updates.append(Update.of_compaction(message.compaction, raw=event))
        if usage is not None:
            updates.append(Update.of_usage(usage, raw=event))
        return updates
