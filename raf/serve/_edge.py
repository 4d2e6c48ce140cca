"""The edge of a served agent: every request gets an id, and another site's page is refused.

Each request gets an id, sent back in an ``X-Request-Id`` header and in
every error body; a request that fails is one line in the server's log with
that id and the cause (which the client never sees).

Without api keys, whatever reaches the port drives the agent, and a
browser reaches it for any page it shows: another site can POST to it (a
``text/plain`` body needs no preflight; :func:`raf.serve._http.read_json`
refuses it with a 415) and a DNS-rebinding page makes its own name point at
127.0.0.1. So without keys the edge answers only a ``Host`` the app serves
(localhost, 127.0.0.1, ::1, the address the connection came in on, or one
of ``allowed_hosts``) and an ``Origin``, when sent, that is the app's own or
one of ``allowed_origins``. Starlette's ``TrustedHostMiddleware`` checks a
fixed list of hosts and answers in plain text; here the bound address is
known only per connection (the ASGI scope's ``server``, whichever server runs
the app), and a refusal is an error like every other: the OpenAI shape with
the request id.

Two timeouts keep a slow client from holding the server: a body that has not
all come in ``body_timeout`` seconds of the request's start (one sent a byte
a second) is a 408 that closes the connection, and a send the client has not
taken in ``write_timeout`` seconds (it stopped reading, its socket open) is
the client gone: a streamed turn closes early, as when it hangs up.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import Iterable

import anyio
import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from raf.serve._http import HttpError, error_response, header, note_failure
from raf.serve._options import BODY_TIMEOUT, WRITE_TIMEOUT

__all__: list[str] = []

_log = structlog.get_logger("raf.serve")
#: The hosts every served app answers to (with the address its connection came in on).
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


class Edge:
    """ASGI middleware: the request id, the one log line of a failure, the body and write
    timeouts and, when ``guarded`` (no api keys), the Host and Origin rules."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        guarded: bool,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        body_timeout: float = BODY_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
    ) -> None:
        self.app = app
        self.guarded = guarded
        self.body_timeout = body_timeout
        self.write_timeout = write_timeout
        self.hosts = frozenset(h.lower().strip("[]") for h in (*LOCAL_HOSTS, *allowed_hosts))
        self.origins = frozenset(o.lower().rstrip("/") for o in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        status = 0

        body_by = anyio.current_time() + self.body_timeout
        body_done = False

        async def receiving() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            with anyio.move_on_after(body_by - anyio.current_time()):
                message = await receive()
                body_done = message["type"] != "http.request" or not message.get("more_body")
                return message
            raise HttpError(
                408, f"the request's body did not come in {self.body_timeout:g} s",
                code="body_timeout", headers={"connection": "close"},
            )  # fmt: skip

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), (b"x-request-id", request_id.encode())]
                message = {**message, "headers": headers}
            with anyio.move_on_after(self.write_timeout):
                await send(message)
                return
            # A stream takes an OSError for a client that is gone, and closes the run early.
            note_failure(scope, f"the client took nothing for {self.write_timeout:g} s")
            raise OSError(f"the client took nothing for {self.write_timeout:g} s")

        refusal = self.refusal(scope) if self.guarded else None
        try:
            if refusal is not None:
                note_failure(scope, refusal.message)
                await error_response(refusal, scope)(scope, receiving, sending)
            else:
                await self.app(scope, receiving, sending)
        except Exception as exc:  # a bug: the client gets a 500 that says nothing of it
            note_failure(scope, exc)
            if status == 0:
                problem = HttpError(500, "internal error", "server_error")
                await error_response(problem, scope)(scope, receiving, sending)
        finally:
            with anyio.CancelScope(shield=True):  # the line is written, cancelled or not
                await _log_failure(scope, status)

    def refusal(self, scope: Scope) -> HttpError | None:
        """Why a browser's request must not reach the agent, or ``None`` when it may."""
        given = header(scope, b"host")
        if given is not None and "*" not in self.hosts:
            server = scope.get("server")
            bound = str(server[0]).lower() if server else None
            name = host_name(given)
            if name not in self.hosts and name != bound:
                return HttpError(
                    400, f"the host {given!r:.80} is not served here (allowed_hosts=)",
                    code="host_not_allowed",
                )  # fmt: skip
        origin = header(scope, b"origin")
        if origin is None or "*" in self.origins:
            return None
        own = origin.lower().partition("://")[2] == (given or "").lower()
        if not own and origin.lower().rstrip("/") not in self.origins:
            return HttpError(
                403, f"a page of {origin!r:.80} may not call this server (allowed_origins=)",
                code="origin_not_allowed",
            )  # fmt: skip
        return None


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port or an IPv6 address's brackets.

    >>> host_name("[::1]:8000"), host_name("LocalHost:80"), host_name("127.0.0.1")
    ('::1', 'localhost', '127.0.0.1')
    """
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.partition(":")[0]


async def _log_failure(scope: Scope, status: int) -> None:
    """One line for a request that failed: its id, what it asked, the status and the cause;
    a server error's traceback with it, without local variables (a frame's locals hold
    what the client sent: rich rendered 9.6 MB of them for a 10 KB body), at most
    :data:`_MAX_TRACEBACK` characters, formatted in a worker thread."""
    state = scope.get("state", {})
    cause = state.get("failure")
    if status < 400 and cause is None:
        return
    fields = {
        "request_id": state.get("request_id"),
        "method": scope.get("method"),
        "path": str(scope.get("path", ""))[:200],
        "status": status,
    }
    if isinstance(cause, BaseException) and (status == 0 or status >= 500):
        said, trace = await anyio.to_thread.run_sync(_described, cause)
        _log.error("raf.serve: the request failed", **fields, cause=said, exception=trace)
    else:
        said = cause if isinstance(cause, str) else repr(cause)
        _log.warning("raf.serve: the request failed", **fields, cause=_cut(said))


#: The most of a cause's text, and of a traceback, one log line holds.
_MAX_CAUSE = 1000
_MAX_TRACEBACK = 20_000


def _described(cause: BaseException) -> tuple[str, str]:
    """``cause``'s repr and its traceback, chained causes included, without locals; each
    cut to its bound (the middle of a traceback goes)."""
    said = _cut(repr(cause))
    trace = "".join(traceback.format_exception(cause))
    if len(trace) > _MAX_TRACEBACK:
        half = _MAX_TRACEBACK // 2
        trace = f"{trace[:half]}\n... ({len(trace) - 2 * half} characters) ...\n{trace[-half:]}"
    return said, trace


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_CAUSE else f"{text[:_MAX_CAUSE]}... ({len(text)} characters)"
