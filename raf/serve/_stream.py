"""A streamed turn as server-sent events, where a client that goes away is an early close.

Starlette's ``StreamingResponse`` cancels its generator when the client
disconnects, which a raf run would take as a cancellation (nothing of a
partial answer kept). Here the response is a plain ASGI callable instead:
one task watches ``receive()`` for ``http.disconnect`` and cancels only the
*reading* of the stream; the code then leaves ``async with agent.stream(...)``
normally, which is an early close: every entered provider gets
``StreamClosedError(partial)``, not under cancellation, each bounded by the
agent's ``post_timeout``, and ``persist_partial=True`` stores the partial answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, Protocol

import anyio
import structlog
from starlette.types import Receive, Send

from raf._agent import Agent
from raf._messages import AgentResponse, ChatMessage, Update
from raf._options import AgentRunOptions
from raf._sessions.base import Session
from raf.serve._http import HttpError, failure, send_error

__all__: list[str] = []

_log = structlog.get_logger("raf.serve")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx: pass each event on as it comes
]


class Framing(Protocol):
    """How a protocol writes a streamed turn as events (each a whole SSE frame)."""

    def start(self) -> list[bytes]: ...
    def update(self, update: Update) -> list[bytes]: ...
    def finish(self, response: AgentResponse) -> list[bytes]: ...
    def failed(self, error: HttpError) -> list[bytes]: ...


async def stream_turn(
    agent: Agent,
    messages: Sequence[ChatMessage],
    session: Session,
    options: AgentRunOptions,
    framing: Framing,
    receive: Receive,
    send: Send,
    *,
    error_status: Callable[[HttpError], bool] = lambda error: True,
) -> str:
    """Stream one turn to the client; returns how it ended: ``done``, ``gone`` or ``failed``.

    The response starts at the first event with something to say, so a run
    that fails before it (the model is down) still answers with an HTTP
    status (when ``error_status(error)`` says so), not a 200 with an error event.
    """
    started = False
    gone = False
    reading = anyio.CancelScope()  # cancelled when the client goes away

    async def emit(chunks: list[bytes]) -> None:
        nonlocal started, gone
        if not chunks or gone:
            return
        try:
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                chunks = framing.start() + chunks
            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
        except OSError:  # a server that raises on a closed connection: the client is gone
            gone = True
            reading.cancel()

    error: Exception | None = None
    try:
        async with agent.stream(messages, session=session, options=options) as stream:
            with reading:
                error = await _relay(stream, framing, emit, receive, reading)
            gone = gone or reading.cancel_called
            if error is not None and not gone:
                raise error  # the run's own error, inside the block: not an early close
            if error is not None:
                _log.warning("raf.serve: the run failed as the client left", error=repr(error))
    except Exception as exc:  # the run failed, or (after an early close) a post stage did
        if gone:
            _log.warning("raf.serve: a post stage failed after the client left", error=repr(exc))
            return "gone"
        problem = failure(exc)
        if problem.status >= 500 and problem.type == "server_error":
            _log.error("raf.serve: the run failed", error=repr(exc), exc_info=exc)
        if not started and error_status(problem):
            await send_error(send, problem)
        else:
            await emit(framing.failed(problem))
            await _end(send, gone)
        return "failed"
    if gone:
        return "gone"
    assert stream.response is not None
    await emit(framing.finish(stream.response))
    await _end(send, gone)
    return "done"


async def _relay(
    stream: Any,
    framing: Framing,
    emit: Callable[[list[bytes]], Any],
    receive: Receive,
    reading: anyio.CancelScope,
) -> Exception | None:
    """Read the stream into ``emit`` while a second task watches for the client leaving.

    Returns the run's error rather than raising it: raised in the task group,
    it would come out wrapped in an exception group.
    """
    error: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(_watch, receive, reading)
        try:
            async for update in stream:
                await emit(framing.update(update))
        except Exception as exc:
            error = exc
        group.cancel_scope.cancel()
    return error


async def _watch(receive: Receive, reading: anyio.CancelScope) -> None:
    """Wait for ``http.disconnect``; then stop the reading (and so leave the stream)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            reading.cancel()
            return


async def _end(send: Send, gone: bool) -> None:
    if gone:
        return
    with suppress(OSError):  # the client left at the very end
        await send({"type": "http.response.body", "body": b"", "more_body": False})
