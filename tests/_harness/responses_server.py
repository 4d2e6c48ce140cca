"""A scripted HTTP server on 127.0.0.1 that speaks the OpenAI Responses API, JSON and SSE.

Tests queue answers with :meth:`ResponsesServer.answer` (a response body, sent as
JSON, or as server-sent events when the request asks for a stream) or
:meth:`ResponsesServer.reply`, and read what the real SDK sent from
:attr:`ResponsesServer.requests`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs

from tests._harness.loopback_server import Exchange, LoopbackServer, Received, error_body, sse
from tests._harness.wire_rules import responses_problem


@attrs.frozen
class Answer:
    """One scripted answer.

    ``body`` is a response object: sent as JSON, or, to a request with
    ``"stream": true``, as the events :func:`events_of` makes of it. ``events``
    sends those events instead (a stream that fails, or never completes);
    ``drop_after`` cuts the connection after that many events, ``stall_after``
    stops sending then (until the server closes). ``status`` other
    than 200 sends ``body`` as an error reply. ``require`` checks the request
    body: a message it returns is answered with a 400, as a real server refuses
    an input it cannot use.
    """

    status: int = 200
    body: Any = None
    events: Sequence[Mapping[str, Any]] | None = None
    drop_after: int | None = None
    stall_after: int | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    delay: float = 0.0
    drop: bool = False
    raw: bytes | None = None
    content_type: str | None = None
    require: Callable[[Any], str | None] | None = None


def response_body(
    text: str | None = "ok",
    *,
    calls: Iterable[tuple[str, str, str]] = (),
    reasoning: str | None = None,
    usage: tuple[int, int] | None = (5, 2),
    cached: int = 0,
    reasoning_tokens: int = 0,
    model: str = "test-model",
    status: str = "completed",
) -> dict[str, Any]:
    """A response object; ``calls`` are ``(call_id, name, arguments)``; ``reasoning``
    the id of a reasoning item first in the output (with encrypted content)."""
    output: list[dict[str, Any]] = []
    if reasoning is not None:
        output.append(
            {
                "type": "reasoning",
                "id": reasoning,
                "summary": [{"type": "summary_text", "text": "thinking"}],
                "encrypted_content": f"gAAAA-{reasoning}-secret",
            }
        )
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    for n, (call_id, name, arguments) in enumerate(calls):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
                "status": "completed",
            }
        )
    body: dict[str, Any] = {
        "id": "resp_test",
        "object": "response",
        "created_at": 1700000000,
        "model": model,
        "status": status,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    if usage is not None:
        body["usage"] = {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": sum(usage),
        }
    return body


def events_of(body: Mapping[str, Any], *, terminal: bool = True) -> list[dict[str, Any]]:
    """The events a server streams for ``body``: text word by word, arguments in two
    deltas, and ``response.completed`` (left out when ``terminal`` is false)."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**body, "status": "in_progress", "output": []}}
    ]
    for index, item in enumerate(body["output"]):
        started = {**item}
        if item["type"] == "function_call":
            started["arguments"] = ""
        if item["type"] == "message":
            started["content"] = []
        events.append(
            {"type": "response.output_item.added", "output_index": index, "item": started}
        )
        if item["type"] == "message":
            for part in item["content"]:
                words = part["text"].split(" ")
                for n, word in enumerate(words):
                    delta = word if n == len(words) - 1 else word + " "
                    events.append(
                        {
                            "type": "response.output_text.delta",
                            "item_id": item["id"],
                            "output_index": index,
                            "content_index": 0,
                            "delta": delta,
                            "logprobs": [],
                        }
                    )
        elif item["type"] == "function_call":
            half = len(item["arguments"]) // 2
            for piece in (item["arguments"][:half], item["arguments"][half:]):
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "delta": piece,
                    }
                )
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "arguments": item["arguments"],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    if terminal:
        events.append({"type": "response.completed", "response": dict(body)})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


class ResponsesServer(LoopbackServer[Answer]):
    """A loopback server that plays scripted Responses API answers (see
    :class:`tests._harness.loopback_server.LoopbackServer`: with no answer queued it answers
    500; :meth:`fail` replies let the SDK retry after a millisecond)."""

    def __init__(self) -> None:
        super().__init__(Answer)
        #: The server's own compaction (tests._harness.context_window.ResponsesCompaction),
        #: when a test turns it on: it answers /responses/compact itself.
        self.compaction: Any = None

    def answer(self, body: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Queue one 200 answer: ``body``, or ``response_body(**kwargs)``."""
        self.reply(Answer(body=dict(body) if body is not None else response_body(**kwargs)))

    def refusal(self, request: Received) -> bytes | None:
        """The 400's body when the conversation breaks the vendor's rules (see
        :func:`tests._harness.wire_rules.responses_problem`)."""
        found = responses_problem(request.body)
        if found is None:
            return None
        refusal = error_body(found)
        refusal["error"]["param"] = "input"
        return json.dumps(refusal).encode()

    def window_refused(self, request: Received) -> tuple[int, Any] | None:
        """A prompt past the window; with compaction on, what the API refuses of it."""
        if self.compaction is not None and isinstance(request.body, dict):
            problem = self.compaction.problem(request.body)
            if problem is not None:
                return 400, error_body(problem)
        return super().window_refused(request)

    def _take(self, request: Received) -> Answer:
        if self.compaction is not None and request.path.endswith("/responses/compact"):
            with self._lock:
                self.requests.append(request)
            return Answer(body=self.compaction.compacted(request.body))
        return super()._take(request)

    def respond(self, exchange: Exchange, request: Received, answer: Answer) -> None:
        """A 400 when ``require`` refuses the request; the events of a 200 answer to a
        request for a stream (or of one that has ``events``); else a JSON body."""
        problem = answer.require(request.body) if answer.require is not None else None
        if problem is not None:
            exchange.send(400, json.dumps(error_body(problem)).encode(), "application/json")
            return
        streamed = isinstance(request.body, dict) and request.body.get("stream") is True
        compacts = self.compaction is not None and not request.path.endswith("/compact")
        if compacts and answer.status == 200 and answer.body is not None:
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


def _ending(answer: Answer, count: int) -> tuple[int, Literal["done", "cut", "stall"]]:
    """How many of ``count`` events are sent, and how the stream then ends: at the
    first event that ``drop_after`` or ``stall_after`` reaches."""
    for number in range(count):
        if answer.drop_after is not None and number >= answer.drop_after:
            return number, "cut"
        if number == answer.stall_after:
            return number, "stall"
    return count, "done"
