"""A scripted HTTP server on 127.0.0.1 that speaks Anthropic's Messages API, JSON and SSE.

Tests queue answers with :meth:`AnthropicServer.answer` (a message body, sent as
JSON, or as server-sent events when the request asks for a stream) or
:meth:`AnthropicServer.reply`, and read what the real SDK sent from
:attr:`AnthropicServer.requests`. Errors go in Anthropic's own shape,
``{"type": "error", "error": {"type": ..., "message": ...}}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from tests._harness.context_window import summary_block_events
from tests._harness.loopback_server import Exchange, LoopbackServer, Received, sse
from tests._harness.responses_server import Answer, _ending
from tests._harness.wire_rules import anthropic_problem

__all__ = ["AnthropicServer", "Answer", "error_body", "events_of", "message_body"]

#: The error type Anthropic sends with each status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """An Anthropic error body."""
    return {"type": "error", "error": {"type": kind, "message": message}}


def message_body(
    text: str | None = "ok",
    *,
    calls: Iterable[tuple[str, str, Mapping[str, Any]]] = (),
    thinking: Iterable[tuple[str, str]] = (),
    redacted: str | None = None,
    usage: tuple[int, int] | None = (5, 2),
    cache_read: int = 0,
    cache_write: int = 0,
    stop_reason: str | None = None,
    model: str = "test-model",
) -> dict[str, Any]:
    """A message object: ``thinking`` blocks ``(thinking, signature)`` first (then a
    ``redacted`` one), the text, then ``calls`` ``(id, name, input)`` as ``tool_use``
    blocks; ``stop_reason`` defaults to ``tool_use`` with calls, else ``end_turn``."""
    content: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": words, "signature": signature}
        for words, signature in thinking
    ]
    if redacted is not None:
        content.append({"type": "redacted_thinking", "data": redacted})
    if text is not None:
        content.append({"type": "text", "text": text, "citations": None})
    calls = list(calls)
    for call_id, name, tool_input in calls:
        content.append({"type": "tool_use", "id": call_id, "name": name, "input": dict(tool_input)})
    body: dict[str, Any] = {
        "id": "msg_test",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason or ("tool_use" if calls else "end_turn"),
        "stop_sequence": None,
    }
    if usage is not None:
        body["usage"] = {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "cache_read_input_tokens": cache_read,
            "cache_creation_input_tokens": cache_write,
        }
    return body


def events_of(body: Mapping[str, Any], *, terminal: bool = True) -> list[dict[str, Any]]:
    """The events a server streams for ``body``: ``message_start``, each block started,
    in deltas (text word by word, input JSON in two pieces, thinking then its
    signature) and stopped, a ``ping``, ``message_delta`` with the stop reason and
    ``message_stop`` (left out when ``terminal`` is false)."""
    usage = dict(body.get("usage") or {"input_tokens": 0, "output_tokens": 0})
    start_usage = {**usage, "output_tokens": 1}
    message = {**body, "content": [], "stop_reason": None, "usage": start_usage}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}]
    for index, block in enumerate(body["content"]):
        events += _block_events(index, block)
        if index == 0:
            events.append({"type": "ping"})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": body.get("stop_reason"), "stop_sequence": None},
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        }
    )
    if terminal:
        events.append({"type": "message_stop"})
    return events


def _block_events(index: int, block: Mapping[str, Any]) -> list[dict[str, Any]]:
    kind = block["type"]
    if kind == "compaction":
        return summary_block_events(index, block)
    started: dict[str, Any] = dict(block)
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        started["text"] = ""
        words = block["text"].split(" ")
        deltas = [
            {"type": "text_delta", "text": word if n == len(words) - 1 else word + " "}
            for n, word in enumerate(words)
        ]
    elif kind == "tool_use":
        started["input"] = {}
        text = json.dumps(block["input"])
        half = len(text) // 2
        deltas = [
            {"type": "input_json_delta", "partial_json": piece}
            for piece in (text[:half], text[half:])
        ]
    elif kind == "thinking":
        started |= {"thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": block["signature"]},
        ]
    return [
        {"type": "content_block_start", "index": index, "content_block": started},
        *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
        {"type": "content_block_stop", "index": index},
    ]


class AnthropicServer(LoopbackServer[Answer]):
    """A loopback server that plays scripted Messages API answers (see
    :class:`tests._harness.loopback_server.LoopbackServer`: with no answer queued it
    answers 500; :meth:`fail` replies let the SDK retry after a millisecond)."""

    def __init__(self) -> None:
        super().__init__(Answer)
        #: The server's own compaction (tests._harness.context_window.AnthropicCompaction),
        #: when a test turns it on.
        self.compaction: Any = None

    def window_refused(self, request: Received) -> tuple[int, Any] | None:
        """A prompt past the window; with compaction on, what the API refuses of it."""
        if self.compaction is not None and isinstance(request.body, dict):
            problem = self.compaction.problem(request.body, request.headers)
            if problem is not None:
                return 400, error_body(problem)
        return super().window_refused(request)

    @property
    def root_url(self) -> str:
        """The server's URL without ``/v1``: the SDK adds it to each path."""
        return self.base_url.removesuffix("/v1")

    def answer(self, body: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Queue one 200 answer: ``body``, or ``message_body(**kwargs)``."""
        self.reply(Answer(body=dict(body) if body is not None else message_body(**kwargs)))

    def fail(self, status: int, message: str = "scripted failure", **kwargs: Any) -> None:
        """Queue one error reply in Anthropic's shape (``kind``: its error type)."""
        kind = kwargs.pop("kind", None) or ERROR_TYPES.get(status, "api_error")
        headers = {"retry-after-ms": "1"} if status in (408, 409, 429) or status >= 500 else {}
        headers |= kwargs.pop("headers", {})
        self.reply(Answer(status, error_body(message, kind), headers=headers, **kwargs))

    def refusal(self, request: Received) -> bytes | None:
        """The 400's body when the conversation breaks the vendor's rules (see
        :func:`tests._harness.wire_rules.anthropic_problem`)."""
        found = anthropic_problem(request.body)
        return None if found is None else json.dumps(error_body(found)).encode()

    def respond(self, exchange: Exchange, request: Received, answer: Answer) -> None:
        """A 400 when ``require`` refuses the request; the events of a 200 answer to a
        request for a stream (or of one that has ``events``); else a JSON body."""
        problem = answer.require(request.body) if answer.require is not None else None
        if problem is not None:
            exchange.send(400, json.dumps(error_body(problem)).encode(), "application/json")
            return
        streamed = isinstance(request.body, dict) and request.body.get("stream") is True
        if self.compaction is not None and answer.status == 200 and answer.body is not None:
            answer = attrs.evolve(answer, body=self.compaction.answer(request.body, answer.body))
        if answer.status == 200 and answer.raw is None and (answer.events is not None or streamed):
            events = answer.events if answer.events is not None else events_of(answer.body)
            count, end = _ending(answer, len(events))
            exchange.stream(
                [sse(json.dumps(event), event.get("type", "message")) for event in events[:count]],
                answer.content_type or "text/event-stream",
                answer.headers,
                end=end,
            )
            return
        data = answer.raw if answer.raw is not None else json.dumps(answer.body).encode()
        exchange.send(
            answer.status, data, answer.content_type or "application/json", answer.headers
        )
