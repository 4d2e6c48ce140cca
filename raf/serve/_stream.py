"""A streamed turn as server-sent events, where a client that goes away is an early close.

Starlette's ``StreamingResponse`` cancels its generator when the client
disconnects, which a raf run would take as a cancellation (nothing of a
partial answer kept). Here the response is a plain ASGI callable instead.
The turn is a callback-form run (``agent.run(on_update=...)``): each update
goes to ``send`` in the request's own task, with no hand-over between tasks.
A second task watches ``receive()`` for ``http.disconnect`` and then closes
the run early (the run's own :class:`raf.Run`, handed in as ``on_update``): every
entered provider gets ``StreamClosedError(partial)``, not under
cancellation, each bounded by the agent's ``post_timeout``, and
``persist_partial=True`` stores the partial answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Protocol

import anyio
import attrs
import structlog
from starlette.types import Receive, Scope, Send

from raf._agent.agent import Agent
from raf._sessions.base import Session
from raf._values.assembly import Assembly
from raf._values.decision import Decision
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import AgentRunOptions
from raf.serve._http import HttpError, error_response, failure, note_failure, request_id
from raf.serve._sessions import keyed_run

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


class TurnStream:
    """The response of a streamed turn (or a resume by ``Decision``): an ASGI app.

    ``error_status(error)`` says whether a run that fails before the first
    event answers with an HTTP status (else with the protocol's error event).
    """

    def __init__(
        self,
        agent: Agent,
        messages: Sequence[ChatMessage] | Sequence[Decision],
        session: Session | None,
        options: AgentRunOptions,
        framing: Framing,
        *,
        error_status: Callable[[HttpError], bool] = lambda error: True,
    ) -> None:
        self._turn = (agent, messages, session, options, framing)
        self._error_status = error_status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await stream_turn(*self._turn, scope, receive, send, error_status=self._error_status)


async def stream_turn(
    agent: Agent,
    messages: Sequence[ChatMessage] | Sequence[Decision],
    session: Session | None,
    options: AgentRunOptions,
    framing: Framing,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    error_status: Callable[[HttpError], bool] = lambda error: True,
) -> str:
    """Stream one turn (or a resume by ``Decision``) to the client; returns how it ended:
    ``done``, ``gone`` or ``failed``.

    The response starts at the first event with something to say, or at a
    pause for approval, so a run that fails before it (the model is down)
    still answers with an HTTP status (when ``error_status(error)`` says so),
    not a 200 with an error event.
    """
    started = False
    gone = False
    sent = Assembly()  # the partial answer, if the client leaves (not the updates)

    def leave() -> None:
        nonlocal gone
        gone = True
        run.close(sent.response())

    async def emit(chunks: list[bytes], *, start: bool = False) -> None:
        nonlocal started
        if gone or not (chunks or (start and not started)):
            return
        try:
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                chunks = framing.start() + chunks
            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
        except OSError:  # a server that raises on a closed connection: the client is gone
            leave()

    async def sink(update: Update) -> None:
        sent.add(update)
        # A pause starts the response even when the protocol has nothing to say of it (chat
        # completions): a durable run then waits for the decision, for minutes, and a
        # client or proxy waiting for the status would give up. Once the client has left,
        # the run's send raises its close: nothing more goes out.
        await emit(framing.update(update), start=update.kind == "approval")

    run = keyed_run(scope.get("state", {}).get("key_scope", ""), sink)
    response: AgentResponse | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(_watch, receive, leave)
        try:
            response = await agent.run(messages, session=session, options=options, on_update=run)
        except Exception as exc:  # raised in the task group, it would come out wrapped
            error = exc
        group.cancel_scope.cancel()
    if gone:
        if error is not None and error is run.closed:
            for failed in run.failures:
                _log.warning(
                    "raf.serve: a post stage failed after the client left", error=repr(failed)
                )
        elif error is not None:
            _log.warning("raf.serve: the run failed as the client left", error=repr(error))
        return "gone"
    if error is not None:  # the run failed, or a post stage did
        note_failure(scope, error)  # the edge logs it, with the request id
        problem = attrs.evolve(failure(error), request_id=request_id(scope))
        if not started and error_status(problem):
            await error_response(problem, scope)(scope, receive, send)
        else:
            await emit(framing.failed(problem))
            await _end(send, gone)
        return "failed"
    assert response is not None
    await emit(framing.finish(response))
    await _end(send, gone)
    return "done"


async def _watch(receive: Receive, leave: Callable[[], None]) -> None:
    """Wait for ``http.disconnect``; then close the run early."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            leave()
            return


async def _end(send: Send, gone: bool) -> None:
    if gone:
        return
    with suppress(OSError):  # the client left at the very end
        await send({"type": "http.response.body", "body": b"", "more_body": False})
