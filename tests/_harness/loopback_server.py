"""The HTTP plumbing of the scripted servers on 127.0.0.1 that the client tests talk to.

A :class:`LoopbackServer` is a ThreadingHTTPServer in a background thread: it
records every request the real SDK sends (:attr:`LoopbackServer.requests`) and
answers each with the next scripted reply, through an :class:`Exchange` that
knows how to send a body, a body a byte at a time, a server-sent event stream
with pauses, or a connection that ends early. What a reply is, and how it goes
on the wire, is the part each protocol's server says for itself
(:mod:`tests._harness.openai_server`, :mod:`tests._harness.responses_server`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Literal, Protocol, TypeVar

import attrs


class Scripted(Protocol):
    """What the plumbing itself reads of a scripted reply, before the server sends it."""

    @property
    def delay(self) -> float:
        """Seconds to wait before answering (cut short when the server stops)."""

    @property
    def drop(self) -> bool:
        """End the connection instead of answering: no status line at all."""


R = TypeVar("R", bound=Scripted)


@attrs.frozen
class Received:
    """One request the server got: ``body`` parsed, ``raw`` its bytes as sent."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: Any
    raw: bytes = b""


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """An OpenAI error body (both OpenAI protocols send the same)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def sse(data: str, event: str | None = None) -> bytes:
    """One server-sent event: an ``event:`` line when ``event`` is given, a ``data:`` line."""
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {data}\n\n".encode()


class LoopbackServer(Generic[R]):
    """A ThreadingHTTPServer in a background thread that plays scripted replies in order.

    ``make`` builds a reply from ``(status, body, headers=..., **kwargs)``. With no
    reply queued the server answers 500, so a test that forgot one fails loudly.
    Retryable error replies from :meth:`fail` carry ``retry-after-ms: 1`` so the
    SDK's own retries wait a millisecond instead of half a second.
    """

    def __init__(self, make: Callable[..., R]) -> None:
        self.requests: list[Received] = []
        #: The bodies of the 400s sent for conversations that break the vendor's rules.
        self.refused: list[bytes] = []
        #: Whether conversations are checked against the vendor's rules (see ``refusal``).
        self.checks = True
        #: Set when a client goes away in the middle of a streamed reply.
        self.stream_aborted = threading.Event()
        self._make = make
        #: The model's context window (tests._harness.context_window.Window): a longer
        #: prompt is refused in the vendor's words before any scripted reply is taken.
        self.window: Any = None
        self._replies: deque[R] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Exchange, self))
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

    def reply(self, *replies: R) -> None:
        """Queue replies, answered in order."""
        with self._lock:
            self._replies.extend(replies)

    def fail(self, status: int, message: str = "scripted failure", **kwargs: Any) -> None:
        """Queue one error reply with an OpenAI error body."""
        headers = {"retry-after-ms": "1"} if status in (408, 409, 429) or status >= 500 else {}
        self.reply(self._make(status, error_body(message), headers=headers, **kwargs))

    def close(self) -> None:
        """Stop serving and release the port (also wakes delayed handlers)."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; true when the server is stopping (then at once)."""
        return self._stopping.wait(seconds)

    def respond(self, exchange: Exchange, request: Received, reply: R) -> None:
        """Send ``reply`` to ``request``: what each protocol's server says for itself."""
        raise NotImplementedError

    def refusal(self, request: Received) -> bytes | None:
        """The body of the 400 the vendor's server answers ``request`` with, when the
        conversation breaks its rules (see :mod:`tests._harness.wire_rules`); ``None``
        lets the next scripted reply answer it. Set :attr:`checks` false to send any."""
        return None

    def _refuse(self, request: Received) -> bytes | None:
        """Record ``request`` and the refusal it gets, if it gets one (no reply is taken)."""
        refused = self.refusal(request) if self.checks else None
        if refused is not None:
            with self._lock:
                self.requests.append(request)
                self.refused.append(refused)
        return refused

    def window_refused(self, request: Received) -> tuple[int, Any] | None:
        """The status and body the server refuses ``request`` with before any scripted
        reply (a prompt past :attr:`window`), or ``None``."""
        if self.window is None:
            return None
        refusal: tuple[int, Any] | None = self.window.refusal(request.path, request.body)
        return refusal

    def _take(self, request: Received) -> R:
        """Record ``request`` and take the reply it gets."""
        with self._lock:
            self.requests.append(request)
            if self._replies:
                return self._replies.popleft()
        return self._make(500, error_body("no scripted reply left", "server_error"))


class Exchange(BaseHTTPRequestHandler):
    """One connection to a :class:`LoopbackServer`, and the ways to answer on it."""

    protocol_version = "HTTP/1.1"
    # The head and the body are two writes: with Nagle's algorithm the body waits for the
    # client's delayed ACK of the head, some 40 ms a request on loopback.
    disable_nagle_algorithm = True

    def __init__(
        self,
        loopback: LoopbackServer[Any],
        request: Any,
        client_address: Any,
        server: Any,
    ) -> None:
        # Set first: the base class handles the whole connection inside __init__.
        self.loopback = loopback
        super().__init__(request, client_address, server)

    def handle(self) -> None:
        # The client may go away between requests.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def do_POST(self) -> None:
        try:
            self._answer("POST")
        except (BrokenPipeError, ConnectionResetError):
            # The client stopped reading (a size bound, a deadline): nothing to do.
            self.close_connection = True

    def do_GET(self) -> None:
        try:
            self._answer("GET")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def send(
        self,
        status: int,
        data: bytes,
        content_type: str,
        headers: Mapping[str, str] | None = None,
        *,
        trickle: float = 0.0,
    ) -> None:
        """Send ``data`` as the body, at once, or one byte per ``trickle`` seconds."""
        self._head(status, content_type, ("content-length", str(len(data))), headers)
        if not trickle:
            self.wfile.write(data)
            return
        for index in range(len(data)):
            self.wfile.write(data[index : index + 1])
            self.wfile.flush()
            if self.loopback.wait(trickle):
                self.close_connection = True  # the client sees the body cut short
                return

    def stream(
        self,
        frames: Iterable[bytes],
        content_type: str,
        headers: Mapping[str, str] | None = None,
        *,
        status: int = 200,
        pause: float = 0.0,
        end: Literal["done", "cut", "stall"] = "done",
    ) -> None:
        """Send ``frames`` as a chunked body, each chunk followed by ``pause`` seconds.

        ``end`` says how the body ends: ``done``, with the last chunk; ``cut``, the
        connection ends before it; ``stall``, nothing more is sent until the server
        stops (a minute at most). A server that stops during a pause cuts the body.
        A client that goes away sets :attr:`LoopbackServer.stream_aborted`.
        """
        self._head(status, content_type, ("transfer-encoding", "chunked"), headers)
        try:
            for frame in frames:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                self.wfile.flush()
                if pause and self.loopback.wait(pause):
                    end = "cut"
                    break
            if end == "stall":
                self.loopback.wait(60)
                self.close_connection = True
                return
            if end == "cut":
                # No last chunk: the client sees the body end before its end.
                self.drop()
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.loopback.stream_aborted.set()
            self.close_connection = True

    def drop(self) -> None:
        """End the connection now, whatever was sent on it so far."""
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _head(
        self,
        status: int,
        content_type: str,
        framing: tuple[str, str],
        headers: Mapping[str, str] | None,
    ) -> None:
        """The status line and headers: ``framing`` says where the body ends."""
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header(*framing)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()

    def _answer(self, method: str) -> None:
        length = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(length)
        body = json.loads(raw) if raw else None
        headers = {key.lower(): value for key, value in self.headers.items()}
        request = Received(method, self.path, headers, body, raw)
        refused = self.loopback._refuse(request)
        if refused is not None:
            self.send(400, refused, "application/json")
            return
        window = self.loopback.window_refused(request)
        if window is not None:
            with self.loopback._lock:
                self.loopback.requests.append(request)
            status, said = window
            if isinstance(said, list):  # a stream of events that says it
                frames = [sse(json.dumps(event), event.get("type")) for event in said]
                self.stream(frames, "text/event-stream", status=status)
                return
            self.send(status, json.dumps(said).encode(), "application/json")
            return
        reply = self.loopback._take(request)
        if reply.delay and self.loopback.wait(reply.delay):
            return
        if reply.drop:
            # No status line at all: the client sees the connection end.
            self.drop()
            return
        self.loopback.respond(self, request, reply)
