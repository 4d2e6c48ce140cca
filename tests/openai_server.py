"""A scripted HTTP server on 127.0.0.1 that speaks the OpenAI chat completions protocol.

Tests queue replies with :meth:`OpenAIServer.reply` (or the helpers) and read
what the real SDK sent from :attr:`OpenAIServer.requests`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs

from raf import ChatMessage


@attrs.frozen
class Reply:
    """One scripted answer: a status and JSON body, or a dropped connection, maybe late.

    ``raw`` is sent as the body byte for byte instead of ``body`` as JSON (with
    ``content_type``); ``trickle`` sends the body one byte per that many seconds.
    ``events`` makes it a server-sent event stream instead (chunked): each item
    a chunk as JSON (a mapping), a ``data:`` line's text (a str) or raw bytes,
    ``pause`` seconds apart, then ``data: [DONE]`` unless ``done`` is false;
    ``cut`` then drops the connection before the body's end.
    """

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    delay: float = 0.0
    drop: bool = False
    raw: bytes | None = None
    content_type: str = "application/json"
    trickle: float = 0.0
    events: tuple[Any, ...] | None = None
    pause: float = 0.0
    done: bool = True
    cut: bool = False


@attrs.frozen
class Received:
    """One request the server got: ``body`` parsed, ``raw`` its bytes as sent."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    raw: bytes = b""


#: What can change in a conversation between two calls of a client (see :func:`edit_history`).
HISTORY_EDITS = ("extend", "new objects", "new system", "drop system", "truncate")


def edit_history(
    step: str, n: int, messages: list[ChatMessage], pool: Sequence[ChatMessage]
) -> list[ChatMessage]:
    """``messages`` after step ``n`` of a random conversation, one of :data:`HISTORY_EDITS`
    (another step leaves them as they are): more of ``pool``, a history decoded anew
    (equal messages, new objects), another leading system message, none, or its first half.
    """
    if step == "extend":
        return [*messages, *pool[: n % len(pool) + 1]]
    if step == "new objects":
        return [ChatMessage.from_dict(m.to_dict()) for m in messages]
    if step == "new system":
        return [ChatMessage.system(f"rules {n}"), *messages[1:]]
    if step == "drop system" and messages and messages[0].role == "system":
        return messages[1:]
    if step == "truncate":
        return messages[: len(messages) // 2]
    return messages


def completion(
    content: str | None = "ok",
    *,
    tool_calls: Iterable[tuple[str, str, str]] = (),
    usage: tuple[int, int] | None = (5, 2),
    model: str = "test-model",
    refusal: str | None = None,
) -> dict[str, Any]:
    """A chat.completion body; ``tool_calls`` are ``(id, name, arguments)`` triples."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    calls = [
        {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}
        for id_, name, arguments in tool_calls
    ]
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }
    return body


def chunk(
    content: str | None = None,
    *,
    tool_calls: Iterable[Mapping[str, Any]] = (),
    finish_reason: str | None = None,
    usage: tuple[int, int] | None = None,
    role: str | None = None,
    choices: bool = True,
) -> dict[str, Any]:
    """A chat.completion.chunk; ``tool_calls`` are raw tool-call deltas (with ``index``).

    ``choices=False`` makes the last chunk of a stream that includes usage
    (no choices, only the usage).
    """
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    calls = [dict(call) for call in tool_calls]
    if calls:
        delta["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "test-model",
        "choices": (
            [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
            if choices
            else []
        ),
        "usage": None,
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        }
    return body


def text_stream(
    *pieces: str, usage: tuple[int, int] | None = (5, 2), finish_reason: str = "stop"
) -> tuple[dict[str, Any], ...]:
    """The chunks of a streamed text answer, as OpenAI sends them: a first chunk with
    the role and empty content, a chunk per piece, the finish, then the usage."""
    chunks = [chunk("", role="assistant")]
    chunks += [chunk(piece) for piece in pieces]
    chunks.append(chunk(finish_reason=finish_reason))
    if usage is not None:
        chunks.append(chunk(usage=usage, choices=False))
    return tuple(chunks)


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """An OpenAI error body."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class OpenAIServer:
    """A ThreadingHTTPServer in a background thread that plays scripted replies.

    With no reply queued it answers 500, so a test that forgot one fails loudly.
    Retryable error replies carry ``retry-after-ms: 1`` so the SDK's own
    retries wait a millisecond instead of half a second.
    """

    def __init__(self) -> None:
        self.requests: list[Received] = []
        #: Set when a client goes away in the middle of a streamed reply.
        self.stream_aborted = threading.Event()
        self._replies: deque[Reply] = deque()
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

    def reply(self, *replies: Reply) -> None:
        """Queue replies, answered in order."""
        with self._lock:
            self._replies.extend(replies)

    def answer(self, body: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Queue one 200 reply: ``body``, or ``completion(**kwargs)``."""
        self.reply(Reply(200, dict(body) if body is not None else completion(**kwargs)))

    def fail(self, status: int, message: str = "scripted failure", **kwargs: Any) -> None:
        """Queue one error reply with an OpenAI error body."""
        headers = {"retry-after-ms": "1"} if status in (408, 409, 429) or status >= 500 else {}
        self.reply(Reply(status, error_body(message), headers=headers, **kwargs))

    def close(self) -> None:
        """Stop serving and release the port (also wakes delayed handlers)."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _next_reply(self) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        return Reply(500, error_body("no scripted reply left", "server_error"))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle(self) -> None:
                # The client may go away between requests.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    super().handle()

            def do_POST(self) -> None:
                try:
                    self._answer()
                except (BrokenPipeError, ConnectionResetError):
                    # The client stopped reading (a size bound, a deadline): nothing to do.
                    self.close_connection = True

            def _stream(self, reply: Reply) -> None:
                self.send_response(reply.status)
                self.send_header("content-type", "text/event-stream; charset=utf-8")
                self.send_header("transfer-encoding", "chunked")
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                assert reply.events is not None
                events = list(reply.events) + ([b"data: [DONE]\n\n"] if reply.done else [])
                try:
                    for event in events:
                        if isinstance(event, bytes):
                            data = event
                        elif isinstance(event, str):
                            data = f"data: {event}\n\n".encode()
                        else:
                            data = f"data: {json.dumps(event)}\n\n".encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                        if reply.pause and server._stopping.wait(reply.pause):
                            reply = attrs.evolve(reply, cut=True)
                            break
                    if reply.cut:
                        # No last chunk: the client sees the body end before its end.
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    server.stream_aborted.set()
                    self.close_connection = True

            def _answer(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                body = json.loads(raw) if raw else None
                headers = {key.lower(): value for key, value in self.headers.items()}
                with server._lock:
                    server.requests.append(Received("POST", self.path, headers, body))
                reply = server._next_reply()
                if reply.delay and server._stopping.wait(reply.delay):
                    return
                if reply.drop:
                    # No status line at all: the client sees the connection end.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if reply.events is not None:
                    self._stream(reply)
                    return
                data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", reply.content_type)
                self.send_header("content-length", str(len(data)))
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if not reply.trickle:
                    self.wfile.write(data)
                    return
                for index in range(len(data)):
                    self.wfile.write(data[index : index + 1])
                    self.wfile.flush()
                    if server._stopping.wait(reply.trickle):
                        self.close_connection = True  # the client sees the body cut short
                        return

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
