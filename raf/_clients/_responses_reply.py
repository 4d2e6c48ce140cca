"""The Responses API reply: a response's body, or a stream's events, as raf's response
and updates, its reasoning items (in their order among the text and the calls) kept on
the assistant message."""

from __future__ import annotations

import json
from typing import Any, Final

import attrs

from raf._clients._overflow import overflow
from raf._clients._reply import built, field, json_object, json_type, objects, quote, tokens
from raf._values.carried import Compaction, Reasoning
from raf._values.messages import AgentResponse, ChatMessage, ToolCall, Update, Usage
from raf.errors import (
    ChatClientError,
    ChatConnectionError,
    ChatProtocolError,
    IncompleteResponseError,
    OutputRefusedError,
)

__all__: list[str] = []

#: The source of the reasoning this wire carries (see :class:`raf.Reasoning`).
SOURCE: Final = "openai.responses"


def call_name(model: str) -> str:
    """How errors name a call of ``model``."""
    return f"OpenAI response (model {model!r})"


def response_from_reply(
    data: bytes, content_type: str, model: str, *, refuse: bool = False
) -> AgentResponse:
    """The assistant turn of a 200 reply's body, its reasoning on the message.

    A reply that is not a response raf can read is a :class:`raf.errors.ChatProtocolError`;
    a failed or incomplete one a :class:`raf.ChatClientError`; with ``refuse``
    (structured output asked for), a refusal a :class:`raf.errors.OutputRefusedError`.
    """
    where = call_name(model)
    reply = json_object(data, content_type, where, "the reply")
    _check_status(reply, where, finished=True)
    message, usage, raw = _read_response(reply, where, model if refuse else None)
    return AgentResponse((message,), usage, raw)


def compaction_from_reply(data: bytes, content_type: str, model: str) -> Compaction:
    """The compaction item of a ``/responses/compact`` reply (its output's last item), as
    raf's :class:`raf.Compaction`; a reply without one is a ChatProtocolError."""
    where = f"OpenAI compaction (model {model!r})"
    reply = json_object(data, content_type, where, "the reply")
    output = objects(reply, "output", where)
    item = output[-1] if output else None
    if item is None or item.get("type") != "compaction":
        what = "no output" if item is None else f"a {str(item.get('type'))[:40]!r} item"
        raise ChatProtocolError(f"{where}: the reply ends with {what}, not a compaction item")
    field(item, "encrypted_content", str, where, f"output[{len(output) - 1}]")
    return Compaction(SOURCE, json.dumps(item, separators=(",", ":")))


# The status of a reply that is not finished yet (a background response): not an answer.
_UNFINISHED: Final = ("in_progress", "queued")


def _check_status(
    reply: dict[str, Any], where: str, *, finished: bool = False, streamed: str = ""
) -> None:
    """A failed or incomplete response as an error (not retryable, as the design says);
    with ``finished``, also one whose status says it is not finished. ``streamed`` is
    the text a stream's deltas sent, for a partial answer whose output lacks it."""
    status = reply.get("status")
    if status == "failed" or (status is None and reply.get("error") is not None):
        code, text = _error_text(reply.get("error"))
        failed = f"{where}: the response failed{code}: {text}"
        raise overflow(reply.get("error"), failed, None) or ChatClientError(failed)
    if status == "incomplete":
        details = reply.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        text = "the response is incomplete" + (f" ({reason})" if reason else "")
        text += " - raise max_tokens" if reason == "max_output_tokens" else ""
        reason = str(reason or "incomplete")
    elif finished and status in _UNFINISHED:
        text = f"the response is not finished (status {status!r}): it is no answer yet"
        reason = status
    else:
        return
    partial = _partial(reply, where, streamed)
    raise IncompleteResponseError(f"{where}: {text}", reason=reason, partial=partial)


def _partial(reply: dict[str, Any], where: str, streamed: str) -> AgentResponse:
    """What an incomplete reply holds, as far as it can be read (the streamed text when
    its output has none)."""
    try:
        message, usage, _ = _read_response(reply, where)
    except ChatProtocolError:
        message, usage = ChatMessage.assistant(None), None
    if message.content is None and streamed:
        message = attrs.evolve(message, content=streamed)
    return AgentResponse((message,), usage, reply)


def _error_text(error: Any) -> tuple[str, str]:
    if isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        return (f" ({code})" if code else "", str(message) if message else repr(error))
    return "", repr(error)


def _read_response(
    reply: dict[str, Any], where: str, refused_by: str | None = None
) -> tuple[ChatMessage, Usage | None, Any]:
    """The reply's turn, usage and SDK ``Response``; ``refused_by`` (a model): a refusal
    raises.

    The turn's reasoning items, with their place among the text and the calls
    (``{"type": "message"}`` where the text was, ``{"type": "function_call",
    "call_id": ...}`` for each call), are its :class:`raf.Reasoning`; a compaction
    item (the server compacted the conversation) its :class:`raf.Compaction`.
    """
    from openai.types.responses import Response

    texts: list[str] = []
    refusals: list[str] = []
    calls: list[ToolCall] = []
    order: list[dict[str, Any]] = []
    compaction: Compaction | None = None
    for n, item in enumerate(objects(reply, "output", where)):
        kind = item.get("type")
        if kind == "message":
            for m, part in enumerate(objects(item, "content", where, f"output[{n}]")):
                at = f"output[{n}].content[{m}]"
                if part.get("type") == "output_text":
                    texts.append(field(part, "text", str, where, at))
                elif part.get("type") == "refusal":
                    refusals.append(field(part, "refusal", str, where, at))
            if not order or order[-1] != {"type": "message"}:
                order.append({"type": "message"})
        elif kind == "function_call":
            calls.append(_function_call(item, where, f"output[{n}]"))
            order.append({"type": "function_call", "call_id": calls[-1].id})
        elif kind == "reasoning":
            order.append(item)
        elif kind == "compaction":  # what the server made of the conversation before it
            compaction = Compaction(SOURCE, json.dumps(item, separators=(",", ":")))
        # Other items (built-in tools a run asked for through extra) stay in raw.
    text = "".join(texts) if texts else None
    if text is None and not calls and refusals:
        text = "".join(refusals)
        if refused_by is not None:
            raise OutputRefusedError(text, model=refused_by)
    thought = any(item.get("type") == "reasoning" for item in order)
    reasoning = Reasoning(SOURCE, json.dumps(order, separators=(",", ":"))) if thought else None
    message = ChatMessage.assistant(
        text, tool_calls=calls, reasoning=reasoning, compaction=compaction
    )
    return message, _usage(reply, where), built(Response, reply, where)


def _function_call(item: dict[str, Any], where: str, at: str) -> ToolCall:
    """A ``function_call`` item (at ``at``) as raf's call."""
    arguments = field(item, "arguments", str, where, at, optional=True)
    call_id, name = field(item, "call_id", str, where, at), field(item, "name", str, where, at)
    return ToolCall(call_id, name, "{}" if arguments is None else arguments)


def _usage(reply: dict[str, Any], where: str) -> Usage | None:
    usage = field(reply, "usage", dict, where, optional=True)
    if usage is None:
        return None
    return Usage(
        tokens(usage, "input_tokens", where),
        tokens(usage, "output_tokens", where),
        cached_input_tokens=tokens(usage, "input_tokens_details.cached_tokens", where),
        reasoning_tokens=tokens(usage, "output_tokens_details.reasoning_tokens", where),
        cache_write_tokens=tokens(usage, "input_tokens_details.cache_write_tokens", where),
    )


class StreamState:
    """What a stream's events amount to so far; :meth:`feed` turns one into updates."""

    def __init__(self, model: str, *, refuse: bool = False) -> None:
        self.where = call_name(model)
        self.refused_by = model if refuse else None  # see _read_response
        self.sent_calls: set[str] = set()
        self.text: list[str] = []  # the text deltas sent, to hold against the completed text
        self.done = False

    def plain(self, data: bytes, content_type: str) -> list[Update]:
        """A reply that is no event stream: an error that quotes it."""
        raise ChatProtocolError(
            f"{self.where}: a streamed request was answered with "
            f"{content_type or 'no content-type'}, not an event stream: {quote(data)}"
        )

    def finish(self) -> list[Update]:
        """Nothing: the answer came with response.completed, or the stream was cut short."""
        if not self.done:
            raise ChatConnectionError(
                f"{self.where}: the event stream ended before response.completed"
            )
        return []

    def feed(self, data: str) -> list[Update]:
        """The updates of one event's data (none once the answer is complete)."""
        if self.done or data.strip() == "[DONE]":
            return []  # read to the end: the connection can then be reused
        return self._event(json_object(data, None, self.where, "an event"))

    def _event(self, event: Any) -> list[Update]:
        where = self.where
        kind = event.get("type")
        if kind == "response.output_text.delta":
            delta = event.get("delta")
            if not isinstance(delta, str):
                raise ChatProtocolError(f"{where}: a {kind} event's delta is {json_type(delta)}")
            if not delta:  # says nothing: kept, a million of them outgrew max_response_bytes
                return []
            self.text.append(delta)
            return [Update.of_text(delta, raw=event)]
        if kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                call = _function_call(item, where, f"{kind}'s item")
                if call.id not in self.sent_calls:
                    self.sent_calls.add(call.id)
                    return [Update.of_tool_call(call, raw=event)]
            return []
        if kind == "response.completed":
            return self._completed(event)
        if kind in ("response.failed", "response.incomplete"):
            response = event.get("response")
            _check_status(
                response if isinstance(response, dict) else {"status": kind[9:]},
                where,
                streamed="".join(self.text),
            )
            raise ChatClientError(f"{where}: the response ended with {kind}")
        if kind == "error":
            # The error's fields at the top (older servers) or nested in "error".
            nested = event.get("error")
            code, text = _error_text(nested if isinstance(nested, dict) else event)
            failed = f"{where}: the server sent an error event{code}: {text}"
            raise overflow(event, failed, None) or ChatClientError(failed)
        return []  # deltas raf does not stream (reasoning summaries, refusals, ...)

    def _completed(self, event: dict[str, Any]) -> list[Update]:
        response = event.get("response")
        if not isinstance(response, dict):
            what = json_type(response)
            raise ChatProtocolError(f"{self.where}: response.completed's response is {what}")
        message, usage, _ = _read_response(response, self.where, self.refused_by)
        updates: list[Update] = []
        # Whatever the events did not carry: the answer is the completed response's.
        if not self.text and message.content is not None:
            updates.append(Update.of_text(message.content, raw=event))
        elif message.content:
            # The deltas began the answer; the completed text finishes it.
            sent = "".join(self.text)
            if not message.content.startswith(sent):
                raise ChatProtocolError(
                    f"{self.where}: the streamed text ({len(sent)} characters) does not begin "
                    f"the text of response.completed ({len(message.content)} characters)"
                )
            if len(message.content) > len(sent):
                updates.append(Update.of_text(message.content[len(sent) :], raw=event))
        updates += [
            Update.of_tool_call(call, raw=event)
            for call in message.tool_calls
            if call.id not in self.sent_calls
        ]
        if message.reasoning is not None:
            updates.append(Update.of_reasoning(message.reasoning, raw=event))
        if message.compaction is not None:
            updates.append(Update.of_compaction(message.compaction, raw=event))
        if usage is not None:
            updates.append(Update.of_usage(usage, raw=event))
        self.done = True
        return updates
