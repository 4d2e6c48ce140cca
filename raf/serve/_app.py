"""app(agent): the agent as an ASGI app, its routes and what each one does."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from html import escape
from importlib.resources import files
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from raf._agent.agent import Agent
from raf._sessions.base import missing_pending
from raf._values.decision import Decision
from raf._values.messages import ChatMessage
from raf._values.options import AgentRunOptions
from raf.errors import ConfigError
from raf.serve._agui import ag_ui
from raf.serve._client import parsed
from raf.serve._edge import Edge
from raf.serve._fork import fork
from raf.serve._http import (
    HttpError,
    error_body,
    error_response,
    failure,
    note_failure,
    read_json,
    request_id,
)
from raf.serve._options import ServeOptions
from raf.serve._pending import no_session, with_message
from raf.serve._responses import responses
from raf.serve._served import Served
from raf.serve._sessions import Keys, check_store, keyed_run, unheld
from raf.serve._stream import TurnStream
from raf.serve._wire import (
    ChunkFraming,
    check_answers,
    completion,
    new_messages,
    parse_completion,
)

__all__: list[str] = []


def app(
    agent: Agent,
    serve_options: ServeOptions | None = None,
    /,
    *,
    options: AgentRunOptions | None = None,
    **changes: Any,
) -> ASGIApp:
    """Serve ``agent`` as an ASGI app: the OpenAI chat completions, Responses and AG-UI
    protocols.

    Routes: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``GET /v1/models``,
    ``POST /ag-ui``,
    ``GET /`` (a chat page), ``GET /v1/sessions/{id}/messages`` (a session's
    history, for the page), ``POST /v1/sessions/{id}/fork`` (a copy of a
    session's first turns, under the caller's key) and ``GET /healthz``.

    How it serves is a :class:`raf.serve.ServeOptions`, given whole
    (``app(agent, ServeOptions(store="sessions.db"))``) or as its keywords
    (``app(agent, store="sessions.db")``; with both, the keywords change the
    options given). Its options:

    ``store``: where sessions live, anything with ``await store.get(id)``
    (:class:`raf.SqliteSessionStore`, :class:`raf.RedisSessionStore`,
    :class:`raf.PostgresSessionStore`), or a ``--db`` value (a SQLite path,
    ``redis://...`` or ``postgresql://...``) that the app opens on
    its lifespan's start and closes at its end; ``None`` keeps sessions in
    this process (not for a durable agent: its sessions cross DBOS). The
    history of a session reaches the model through the agent's own history
    provider (``Agent(..., history=True)``; give it
    ``persist_partial=True`` to keep the partial answer of a client that left).
    ``api_keys``: when given, every route but ``/healthz`` needs
    ``Authorization: Bearer KEY``, and each key has its own sessions.
    ``max_body``: the largest request body, in bytes. ``cors_origins``: the
    origins allowed to call from a browser (CORS is off without it).
    Without ``api_keys``, only a request whose ``Host`` is served here
    (localhost, 127.0.0.1, ::1, the address it came in on, or one of
    ``allowed_hosts``; ``"*"`` for any) and whose ``Origin``, when sent, is
    the server's own (or one of ``allowed_origins`` or ``cors_origins``) is
    answered: another site's page, or a DNS-rebinding one, cannot drive the
    agent. Every response has an ``X-Request-Id``, every error body that id.
    ``manage_agent``: the lifespan also opens the agent's providers and chat
    middleware that are async context managers (a :class:`raf.SpendLimits`' store)
    and closes its client (what ``raf serve`` does).
    ``mcp``: also serve ``/mcp``, the agent as an MCP server (extra
    ``raf-agents[mcp]``); ``a2a``: also serve the agent over A2A, its card at
    ``/.well-known/agent-card.json`` and JSON-RPC at ``/a2a`` (extra
    ``raf-agents[a2a]``, asyncio only). See docs/services.md.
    ``body_timeout``: the seconds a request's body may take to come in (a 408
    then, and the connection closed). ``write_timeout``: the seconds a send may
    wait for the client to take it; a client that stops reading is then gone,
    and its streamed turn closes early (as when it hangs up).
    ``public_url``: the address callers reach the app at (``https://agents.example.com``,
    a path prefix allowed), which the A2A card names; without it, the card names the
    address the server is bound to, never a request's ``Host``.

    ``options``: the options of every run (a request's ``temperature`` and
    ``max_tokens`` go over them).

    >>> from raf import Agent, EchoChatClient
    >>> served = app(Agent(EchoChatClient(), name="echo"))
    >>> type(served).__name__
    'Starlette'
    """
    durable = sys.modules.get("raf.durable")  # an agent can be durable only once it is loaded
    if not isinstance(agent, Agent) and not (durable and isinstance(agent, durable.DurableAgent)):
        raise TypeError(f"app(agent): agent must be a raf.Agent, got {type(agent).__name__}")
    if serve_options is not None and not isinstance(serve_options, ServeOptions):
        raise TypeError(
            f"app(agent, serve_options): a raf.serve.ServeOptions, got {serve_options!r}"
        )
    if options is not None and not isinstance(options, AgentRunOptions):
        # A ServeOptions here was taken, and every request was a 500.
        raise TypeError(
            f"app(agent, options=...): a raf.AgentRunOptions (every run's), got {options!r:.80}; "
            "how it serves is app(agent, ServeOptions(...)) or its keywords"
        )
    given = serve_options or ServeOptions()
    serving = attrs.evolve(given, **changes) if changes else given
    if serving.store is None and durable is not None and isinstance(agent, durable.DurableAgent):
        raise ConfigError(
            "a durable agent needs a session store that another process can reopen "
            "(its run crosses DBOS): app(agent, store='sessions.db' or 'redis://...')"
        )
    served = Served(
        agent,
        serving.store,
        Keys(serving.api_keys),
        serving.max_body,
        options or AgentRunOptions(),
        serving.public_url,
    )
    routes = [
        served.route("/v1/chat/completions", "POST", chat_completions),
        served.route("/v1/responses", "POST", responses),
        served.route("/v1/models", "GET", models),
        served.route("/v1/sessions/{session_id}/messages", "GET", history),
        served.route("/v1/sessions/{session_id}/fork", "POST", fork),
        served.route("/healthz", "GET", healthz, keyed=False),
        served.route("/", "GET", page),
        served.route("/ag-ui", "POST", ag_ui),
        *_services(served, mcp=serving.mcp, a2a=serving.a2a),
    ]
    edge = Middleware(
        Edge,
        guarded=serving.api_keys is None,
        allowed_hosts=serving.allowed_hosts,
        allowed_origins=(*serving.allowed_origins, *serving.cors_origins),
        body_timeout=serving.body_timeout,
        write_timeout=serving.write_timeout,
    )
    middleware = [edge]  # the outermost: every response gets the request id
    if serving.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(serving.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["authorization", "content-type", "x-session-id"],
            )
        )
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            HttpError: _http_error,
            HTTPException: _http_exception,
        },
        lifespan=lambda _: served.lifespan(serving.manage_agent),
    )


async def chat_completions(served: Served, request: Request) -> ASGIApp:
    """``POST /v1/chat/completions``: one turn, whole or streamed."""
    data = await read_json(request, served.max_body)
    body = await parsed(parse_completion, data, served.agent.tools)
    if body.model != served.model:
        raise HttpError(
            404,
            f"the model {body.model!r:.80} does not exist here: this server serves "
            f"{served.model!r}",
            code="model_not_found",
        )
    session_id = request.headers.get("x-session-id")
    messages: Sequence[ChatMessage] = body.messages
    if body.decisions:  # they resume the calls that wait in the session: no new message
        if session_id is None:
            raise no_session()
        if new_messages(messages):
            raise with_message()
    # A stateless request's run has no session (a fresh one of its own, kept nowhere).
    session = None
    if session_id is not None:
        if not body.decisions and not new_messages(messages):
            raise HttpError(400, "no new message after the last assistant message")
        session = await served.session(request, session_id)
        if not body.decisions:
            messages = await unheld(session, messages)
    await check_answers(body.messages, session, {t.name for t in served.agent.tools})
    options = body.options(served.options, served.agent.chat_client)
    turn: Sequence[ChatMessage] | Sequence[Decision] = body.decisions or messages
    if body.stream:
        framing = ChunkFraming(served.model, body.include_usage, body.tools)
        return TurnStream(served.agent, turn, session, options, framing)
    try:
        response = await served.agent.run(
            turn, session=session, options=options, on_update=keyed_run(request.state.key_scope)
        )
    except Exception as exc:
        note_failure(request.scope, exc)
        raise failure(exc) from None
    return JSONResponse(completion(served.model, response, body.tools))


async def models(served: Served, request: Request) -> ASGIApp:
    """``GET /v1/models``: the one agent, as a model."""
    model = {"id": served.model, "object": "model", "created": 0, "owned_by": "raf"}
    return JSONResponse({"object": "list", "data": [model]})


async def history(served: Served, request: Request) -> ASGIApp:
    """``GET /v1/sessions/{id}/messages``: what a session holds (the page shows it).

    ``pending`` lists the calls that wait for approval, each
    ``{"tool_call_id", "name", "arguments", "token"}``: a decision needs the token.
    """
    session_id = str(request.path_params["session_id"])
    session = await served.session(request, session_id, keep=False)
    try:
        messages = await session.get_messages()
        waiting = () if missing_pending(session) else await session.list_pending()
    except Exception as exc:
        note_failure(request.scope, exc)
        raise HttpError(503, "the session store failed", "server_error") from None
    pending = [
        {"tool_call_id": p.call.id, "name": p.call.name, "arguments": p.call.arguments,
         "token": p.token}
        for p in waiting
    ]  # fmt: skip
    body = {"object": "list", "data": [m.to_dict() for m in messages], "pending": pending}
    return JSONResponse(body)


async def healthz(served: Served, request: Request) -> ASGIApp:
    """``GET /healthz``: 200 when the store answers, 503 when it does not."""
    started = time.perf_counter()
    problem = (
        "the session store is not open" if served.store is None else await check_store(served.store)
    )
    took = round((time.perf_counter() - started) * 1000, 1)
    if problem is not None:
        note_failure(request.scope, problem)
        # What failed, not how: "the session store failed", not the store's own words.
        short = problem.partition(":")[0]
        body = {"status": "unavailable", "error": short, "ms": took}
        return JSONResponse({**body, "request_id": request_id(request.scope)}, 503)
    return JSONResponse({"status": "ok", "model": served.model, "ms": took})


async def page(served: Served, request: Request) -> ASGIApp:
    """``GET /``: the chat page, one file of HTML and plain JavaScript."""
    html = (files("raf.serve") / "page.html").read_bytes()
    html = html.replace(b"{{MODEL}}", escape(served.model).encode())
    # No other site may frame the page (clickjacking its Approve button).
    headers = {"cache-control": "no-store", "content-security-policy": "frame-ancestors 'none'"}
    return HTMLResponse(html, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HttpError)
    return error_response(exc, request.scope)


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    message = f"{request.method} {request.url.path:.200}: {exc.detail}"
    note_failure(request.scope, message)
    body = error_body(message, kind, request_id=request_id(request.scope))
    return JSONResponse(body, exc.status_code, headers=exc.headers)


def _services(served: Served, *, mcp: bool, a2a: bool) -> list[BaseRoute]:
    """The routes of ``/mcp`` and of A2A, when asked for (their SDKs are optional extras)."""
    routes: list[BaseRoute] = []
    if mcp:
        from raf.serve._mcp import mcp_route

        routes.append(mcp_route(served))
    if a2a:
        try:
            from raf.serve._a2a import a2a_routes
        except ImportError as exc:
            raise ConfigError(
                f"app(a2a=True) needs the a2a extra: pip install 'raf-agents[a2a]' ({exc})"
            ) from None
        routes += a2a_routes(served)
    return routes
