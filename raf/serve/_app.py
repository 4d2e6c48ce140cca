"""app(agent): the agent as an ASGI app, its routes and what each one does."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from html import escape
from importlib.resources import files
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from raf._agent.agent import Agent
from raf._errors import ConfigError
from raf._sessions.base import Session, missing_pending
from raf._values.messages import ChatMessage
from raf._values.options import AgentRunOptions
from raf.serve._http import (
    MAX_BODY,
    HttpError,
    error_body,
    failure,
    read_json,
    send_error,
    send_json,
)
from raf.serve._http import header as request_header
from raf.serve._sessions import Keys, MemoryStore, check_store, session_key
from raf.serve._stream import stream_turn
from raf.serve._wire import ChunkFraming, completion, new_messages, parse_completion

__all__: list[str] = []

_log = structlog.get_logger("raf.serve")
Handler = Callable[["Served", Scope, Receive, Send], Awaitable[None]]


def app(
    agent: Agent,
    *,
    store: Any = None,
    api_keys: Iterable[str] | None = None,
    max_body: int = MAX_BODY,
    cors_origins: Sequence[str] | None = None,
    options: AgentRunOptions | None = None,
    manage_agent: bool = False,
) -> ASGIApp:
    """Serve ``agent`` as an ASGI app: the OpenAI chat completions and AG-UI protocols.

    Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /ag-ui``,
    ``GET /`` (a chat page), ``GET /v1/sessions/{id}/messages`` (a session's
    history, for the page) and ``GET /healthz``.

    ``store``: where sessions live, anything with ``await store.get(id)``
    (:class:`raf.SqliteSessionStore`, :class:`raf.RedisSessionStore`), or a
    ``--db`` value (a SQLite path or ``redis://...``) that the app opens on
    its lifespan's start and closes at its end; ``None`` keeps sessions in
    this process (not for a durable agent: its sessions cross DBOS). The
    history of a session reaches the model through the agent's own history
    provider (``Agent(..., history=True)``; give it
    ``persist_partial=True`` to keep the partial answer of a client that left).
    ``api_keys``: when given, every route but ``/healthz`` needs
    ``Authorization: Bearer KEY``, and each key has its own sessions.
    ``max_body``: the largest request body, in bytes. ``cors_origins``: the
    origins allowed to call from a browser (CORS is off without it).
    ``options``: the options of every run (a request's ``temperature`` and
    ``max_tokens`` go over them).
    ``manage_agent``: the lifespan also opens the agent's providers that are
    async context managers and closes its client (what ``raf serve`` does).

    >>> from raf import Agent, EchoChatClient
    >>> served = app(Agent(EchoChatClient(), name="echo"))
    >>> type(served).__name__
    'Starlette'
    """
    durable = sys.modules.get("raf.durable")  # an agent can be durable only once it is loaded
    if not isinstance(agent, Agent) and not (durable and isinstance(agent, durable.DurableAgent)):
        raise TypeError(f"app(agent): agent must be a raf.Agent, got {type(agent).__name__}")
    if type(max_body) is not int or max_body < 1:
        raise ConfigError(f"max_body must be a positive int of bytes, got {max_body!r}")
    if store is None and durable is not None and isinstance(agent, durable.DurableAgent):
        raise ConfigError(
            "a durable agent needs a session store that another process can reopen "
            "(its run crosses DBOS): app(agent, store='sessions.db' or 'redis://...')"
        )
    served = Served(agent, store, Keys(api_keys), max_body, options or AgentRunOptions())
    routes = [
        Route("/v1/chat/completions", _Endpoint(served, chat_completions), methods=["POST"]),
        Route("/v1/models", _Endpoint(served, models), methods=["GET"]),
        Route("/v1/sessions/{session_id}/messages", _Endpoint(served, history), methods=["GET"]),
        Route("/healthz", _Endpoint(served, healthz, keyed=False), methods=["GET"]),
        Route("/", _Endpoint(served, page), methods=["GET"]),
    ]
    try:
        from raf.serve._agui import ag_ui
    except ImportError:  # pragma: no cover - the serve extra brings ag-ui-protocol
        pass
    else:
        routes.append(Route("/ag-ui", _Endpoint(served, ag_ui), methods=["POST"]))
    middleware = []
    if cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type", "x-session-id"],
            )
        )
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: _http_exception, Exception: _server_error},
        lifespan=lambda _: served.lifespan(manage_agent),
    )


class Served:
    """What every route of one app shares: the agent, the store, the keys."""

    def __init__(
        self, agent: Agent, store: Any, keys: Keys, max_body: int, options: AgentRunOptions
    ) -> None:
        self.agent = agent
        self.options = options
        self.model = agent.name or "raf-agent"
        self._db = store if isinstance(store, (str, os.PathLike)) else None
        self.store: Any = MemoryStore() if store is None else None if self._db else store
        self.keys = keys
        self.max_body = max_body

    @asynccontextmanager
    async def lifespan(self, manage_agent: bool) -> AsyncIterator[None]:
        async with AsyncExitStack() as resources:
            if self._db is not None:
                from raf._sessions.stores import open_store

                opened = await open_store(self._db)
                resources.push_async_callback(opened.aclose)
                self.store = opened
            if manage_agent:
                for provider in self.agent.providers:
                    if hasattr(provider, "__aenter__"):
                        await resources.enter_async_context(provider)
                if hasattr(self.agent.chat_client, "aclose"):
                    resources.push_async_callback(self.agent.chat_client.aclose)
            yield

    async def session(self, scope: Scope, key_scope: str, session_id: str) -> Session:
        """The stored session a request names."""
        if self.store is None:
            raise HttpError(503, "the session store is not open (no lifespan)", "server_error")
        session: Session = await self.store.get(session_key(key_scope, session_id))
        return session


class _Endpoint:
    """A route's handler as a plain ASGI app: the key checked, any HttpError answered."""

    def __init__(self, served: Served, handler: Handler, *, keyed: bool = True) -> None:
        self._served = served
        self._handler = handler
        self._keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if self._keyed:
                scope["raf.key_scope"] = self._served.keys.scope(scope)
            await self._handler(self._served, scope, receive, send)
        except HttpError as error:
            await send_error(send, error)


async def chat_completions(served: Served, scope: Scope, receive: Receive, send: Send) -> None:
    """``POST /v1/chat/completions``: one turn, whole or streamed."""
    request = parse_completion(await read_json(scope, receive, served.max_body))
    if request.model != served.model:
        raise HttpError(
            404,
            f"the model {request.model!r:.80} does not exist here: this server serves "
            f"{served.model!r}",
            code="model_not_found",
        )
    session_id = request_header(scope, b"x-session-id")
    messages: Sequence[ChatMessage] = request.messages
    if session_id is not None:
        messages = new_messages(messages)
        if not messages:
            raise HttpError(400, "no new message after the last assistant message")
    # A stateless request's run has no session (a fresh one of its own, kept nowhere).
    session = (
        None
        if session_id is None
        else await served.session(scope, scope["raf.key_scope"], session_id)
    )
    if request.stream:
        framing = ChunkFraming(served.model, request.include_usage)
        await stream_turn(
            served.agent, messages, session, request.options(served.options), framing, receive, send
        )
        return
    try:
        response = await served.agent.run(
            messages, session=session, options=request.options(served.options)
        )
    except Exception as exc:
        problem = failure(exc)
        if problem.type == "server_error":
            _log.error("raf.serve: the run failed", error=repr(exc), exc_info=exc)
        raise problem from None
    await send_json(send, 200, completion(served.model, response))


async def models(served: Served, scope: Scope, receive: Receive, send: Send) -> None:
    """``GET /v1/models``: the one agent, as a model."""
    model = {"id": served.model, "object": "model", "created": 0, "owned_by": "raf"}
    await send_json(send, 200, {"object": "list", "data": [model]})


async def history(served: Served, scope: Scope, receive: Receive, send: Send) -> None:
    """``GET /v1/sessions/{id}/messages``: what a session holds (the page shows it).

    ``pending`` lists the calls that wait for approval, each
    ``{"tool_call_id", "name", "arguments", "token"}``: a decision needs the token.
    """
    session_id = str(scope["path_params"]["session_id"])
    session = await served.session(scope, scope["raf.key_scope"], session_id)
    try:
        messages = await session.get_messages()
        waiting = () if missing_pending(session) else await session.list_pending()
    except Exception as exc:
        raise HttpError(503, f"the session store failed: {exc}", "server_error") from None
    pending = [
        {"tool_call_id": p.call.id, "name": p.call.name, "arguments": p.call.arguments,
         "token": p.token}
        for p in waiting
    ]  # fmt: skip
    body = {"object": "list", "data": [m.to_dict() for m in messages], "pending": pending}
    await send_json(send, 200, body)


async def healthz(served: Served, scope: Scope, receive: Receive, send: Send) -> None:
    """``GET /healthz``: 200 when the store answers, 503 when it does not."""
    started = time.perf_counter()
    problem = (
        "the session store is not open" if served.store is None else await check_store(served.store)
    )
    took = round((time.perf_counter() - started) * 1000, 1)
    if problem is not None:
        await send_json(send, 503, {"status": "unavailable", "error": problem, "ms": took})
        return
    await send_json(send, 200, {"status": "ok", "model": served.model, "ms": took})


async def page(served: Served, scope: Scope, receive: Receive, send: Send) -> None:
    """``GET /``: the chat page, one file of HTML and plain JavaScript."""
    html = (files("raf.serve") / "page.html").read_bytes()
    html = html.replace(b"{{MODEL}}", escape(served.model).encode())
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-length", str(len(html)).encode()),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": html})


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(error_body(message, kind), exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    _log.error("raf.serve: unexpected error", error=repr(exc), exc_info=exc)
    body = error_body(f"internal error: {type(exc).__name__}", "server_error")
    return JSONResponse(body, 500)
