"""The browser rules of the serving edge over a real uvicorn process (issue 32)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx2 as httpx
import pytest

from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

pytestmark = pytest.mark.slow
CHAT = {"model": "word-agent", "messages": [{"role": "user", "content": "hi"}]}


def test_another_sites_page_and_a_rebinding_host_are_refused() -> None:
    with ServedAgent() as served:
        url = f"{served.url}/v1/chat/completions"
        assert httpx.post(url, json=CHAT, verify=TLS).status_code == 200
        rebound = httpx.post(url, json=CHAT, headers={"host": "attacker.example"}, verify=TLS)
        assert rebound.status_code == 400
        other = httpx.post(
            url, json=CHAT, headers={"origin": "https://attacker.example"}, verify=TLS
        )
        assert other.status_code == 403
        simple = httpx.post(
            url,
            content=b'{"model": "word-agent"}',
            headers={"content-type": "text/plain"},
            verify=TLS,
        )
        assert simple.status_code == 415
        for reply in (rebound, other, simple):
            assert reply.json()["error"]["request_id"] == reply.headers["x-request-id"]
        page = httpx.get(served.url, verify=TLS)
        assert page.headers["content-security-policy"] == "frame-ancestors 'none'"


@pytest.fixture(scope="module")
def impatient() -> Iterator[ServedAgent]:
    """A server that gives a body 1 s to come in, and a client 1 s to take each send."""
    with ServedAgent(body_timeout=1, write_timeout=1) as served:
        yield served


def _post_head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json",
             f"content-length: {length}", *extra]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    data = b""
    # A reset is an end too: a byte the client sent after the server closed makes the
    # server's kernel answer with a reset, which may come after the reply was read.
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(1 << 16):
            data += chunk
    return data


def test_a_body_sent_a_byte_at_a_time_is_refused_before_its_end(impatient: ServedAgent) -> None:
    body = json.dumps(CHAT).encode()
    with socket.create_connection(("127.0.0.1", impatient.port)) as sock:
        sock.sendall(_post_head("/v1/chat/completions", len(body)))
        sock.settimeout(0.2)
        reply = b""
        for at in range(len(body)):  # a byte each 0.2 s: 15 s for the whole body
            try:
                reply = sock.recv(1 << 16)
                break
            except TimeoutError:
                try:
                    sock.sendall(body[at : at + 1])
                except OSError:  # closed just now, its reply in flight: read it below
                    break
        with contextlib.suppress(TimeoutError):
            reply = reply or sock.recv(1 << 16)
        assert reply, "the server waited for the whole body"
        reply += _read_to_end(sock)  # and then closed the connection
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"body_timeout"' in reply


def test_a_client_that_stops_reading_is_left_and_its_partial_answer_kept(
    impatient: ServedAgent,
) -> None:
    chat = {**CHAT, "stream": True, "messages": [{"role": "user", "content": "flood"}]}
    body = json.dumps(chat).encode()
    history = f"{impatient.url}/v1/sessions/never-reads/messages"
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # full at once
        sock.connect(("127.0.0.1", impatient.port))
        sock.sendall(_post_head("/v1/chat/completions", len(body), "x-session-id: never-reads"))
        sock.sendall(body)
        # The model streams without end; the client reads nothing. The run must end early
        # (its post stages run: the partial answer is stored) and the connection close.
        deadline = time.monotonic() + 60
        while not (stored := httpx.get(history, verify=TLS).json()["data"])[1:]:
            assert time.monotonic() < deadline, "the run still holds the client that left"
            time.sleep(0.2)
        streamed = _read_to_end(sock)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"].startswith("w0 ")
    assert streamed.startswith(b"HTTP/1.1 200 ")
    assert b"[DONE]" not in streamed
