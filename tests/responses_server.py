"""A scripted HTTP server on 127.0.0.1 that speaks the OpenAI Responses API, JSON and SSE.

Tests queue answers with :meth:`ResponsesServer.answer` (a response body, sent as
JSON, or as server-sent events when the request asks for a stream) or
:meth:`ResponsesServer.reply`, and read what the real SDK sent from
:attr:`ResponsesServer.requests`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

from tests.openai_server import Received, error_body


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


class ResponsesServer:
    """A ThreadingHTTPServer in a background thread that plays scripted answers.

    With no answer queued it answers 500, so a test that forgot one fails loudly.
    Retryable error replies carry ``retry-after-ms: 1`` so the SDK's own retries
    wait a millisecond.
    """

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self._answers: deque[Answer] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        """The ``/v1`` URL of the server."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def reply(self, *answers: Answer) -> None:
        """Queue answers, answered in order."""
        with self._lock:
            self._answers.extend(answers)

    def answer(self, body: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Queue one 200 answer: ``body``, or ``response_body(**kwargs)``."""
        self.reply(Answer(body=dict(body) if body is not None else response_body(**kwargs)))

    def fail(self, status: int, message: str = "scripted failure", **kwargs: Any) -> None:
        """Queue one error reply with an OpenAI error body."""
        headers = {"retry-after-ms": "1"} if status in (408, 409, 429) or status >= 500 else {}
        self.reply(Answer(status, error_body(message), headers=headers, **kwargs))

    def close(self) -> None:
        """Stop serving and release the port (also wakes delayed handlers)."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _next(self) -> Answer:
        with self._lock:
            if self._answers:
                return self._answers.popleft()
        return Answer(500, error_body("no scripted answer left", "server_error"))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle(self) -> None:
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    super().handle()

            def do_POST(self) -> None:
                try:
                    self._answer()
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            def _answer(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                body = json.loads(raw) if raw else None
                headers = {key.lower(): value for key, value in self.headers.items()}
                with server._lock:
                    server.requests.append(Received("POST", self.path, headers, body, raw))
                answer = server._next()
                if answer.delay and server._stopping.wait(answer.delay):
                    return
                if answer.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                problem = answer.require(body) if answer.require is not None else None
                if problem is not None:
                    self._send(400, json.dumps(error_body(problem)).encode(), "application/json")
                    return
                streamed = isinstance(body, dict) and body.get("stream") is True
                if (
                    answer.status == 200
                    and answer.raw is None
                    and (answer.events is not None or streamed)
                ):
                    events = answer.events if answer.events is not None else events_of(answer.body)
                    self._stream(events, answer)
                    return
                data = answer.raw if answer.raw is not None else json.dumps(answer.body).encode()
                self._send(
                    answer.status, data, answer.content_type or "application/json", answer.headers
                )

            def _send(
                self,
                status: int,
                data: bytes,
                content_type: str,
                headers: Mapping[str, str] | None = None,
            ) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: Sequence[Mapping[str, Any]], answer: Answer) -> None:
                self.send_response(200)
                self.send_header("content-type", answer.content_type or "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                for key, value in answer.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                for number, event in enumerate(events):
                    if answer.drop_after is not None and number >= answer.drop_after:
                        # The connection ends mid-stream, without the last chunk.
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if number == answer.stall_after:
                        server._stopping.wait(60)
                        self.close_connection = True
                        return
                    kind = event.get("type", "message")
                    data = f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
