"""/mcp: the agent as an MCP server, one tool named after it, over the ``mcp`` SDK's
streamable HTTP.

The SDK's low-level :class:`mcp.server.Server` answers the protocol; its
session manager runs *stateless* (a fresh transport per request), so any
worker of ``raf serve --workers N`` answers any call, and a conversation
lives where every other route keeps it: in the session store, under
``session_id`` and the caller's key. The key is checked here, before the SDK
sees the request (a 401 like every route's).

A client that goes away mid-answer (or cancels its call) makes the SDK cancel
the call's handler; the run is kept out of that cancellation and closed early
instead (:func:`closable_run`): every entered provider gets
``StreamClosedError`` with the partial answer, as on the other routes.

A ``GET`` (the stream a server may push on) is a 405 with ``Allow: POST``:
stateless, the server has nothing to push, and the SDK's stream would stay
open, empty, until the client leaves.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from raf._agent.agent import Agent
from raf._metadata import installed_version
from raf._sessions.base import Session
from raf._values.assembly import Assembly
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import AgentRunOptions
from raf.errors import ConfigError
from raf.serve._client import TEXT_JOIN, turn_text
from raf.serve._http import HttpError, failure, note_failure
from raf.serve._served import Served
from raf.serve._sessions import keyed_run

__all__: list[str] = []

#: Where the key scope of an /mcp request waits for the tool's handler (the ASGI scope's state).
_SCOPE_KEY = "raf_key_scope"


def mcp_route(served: Served) -> Route:
    """The ``/mcp`` route of ``served``; its session manager runs on the app's lifespan."""
    try:
        import mcp_types as types
    except ImportError as exc:
        raise ConfigError(
            f"app(mcp=True) needs the mcp extra: pip install 'raf-agents[mcp]' ({exc})"
        ) from None
    from mcp.server import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.shared.exceptions import MCPError

    name = served.model
    tool = types.Tool(
        name=name,
        description=describe(served.agent),
        input_schema={
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "what to ask the agent"},
                "session_id": {
                    "type": "string",
                    "description": "a conversation to go on with (its history is kept); "
                    "without it, the call stands alone",
                },
            },
            "required": ["message"],
            "additionalProperties": False,
        },
    )

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name != name:
            unknown = f"no tool {params.name!r:.80} here: it is {name!r}"
            raise MCPError(types.INVALID_PARAMS, unknown)
        message, session_id = _arguments(params.arguments, MCPError, types.INVALID_PARAMS)
        request = ctx.request
        key_scope = None if request is None else request.scope.get("state", {}).get(_SCOPE_KEY)
        if key_scope is None:  # never a session of no key's in place of the caller's
            raise MCPError(types.INTERNAL_ERROR, "the call came without its HTTP request")
        try:
            session = None if session_id is None else await served.session_of(key_scope, session_id)
        except HttpError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message) from None
        except Exception as exc:
            note_failure(request.scope, exc)
            raise MCPError(types.INTERNAL_ERROR, "the session store failed") from None
        counted, between = 0, False

        async def progress(update: Update) -> None:
            nonlocal counted, between
            between = between or update.kind == "tool_result"  # a later model call's text
            if update.kind == "text" and update.text:
                text = TEXT_JOIN + update.text if between and counted else update.text
                counted, between = counted + len(text), False
                await ctx.session.report_progress(counted, None, text)

        try:
            response = await closable_run(
                served.agent,
                [ChatMessage.user(message)],
                session,
                served.options,
                progress,
                key_scope=key_scope,
            )
        except Exception as exc:
            note_failure(request.scope, exc)
            problem = failure(exc)
            text = f"{problem.message} ({problem.code or problem.status})"
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], is_error=True
            )
        result: types.CallToolResult = _result(response, session_id, types)
        return result

    # The agent's instructions are its own (a system prompt): callers see what the card
    # and the tool's description show of them, their first paragraph.
    server: Server[Any] = Server(
        name, version=installed_version(), instructions=tool.description,
        on_list_tools=list_tools, on_call_tool=call_tool,
    )  # fmt: skip
    manager = StreamableHTTPSessionManager(
        server, stateless=True, max_request_body_size=served.max_body
    )
    served.lifespans.append(manager.run)
    endpoint = _Endpoint(served, manager.handle_request)
    return Route("/mcp", endpoint, methods=["GET", "POST", "DELETE"])


class _Endpoint:
    """The ASGI app of /mcp: the caller's key first, then the SDK."""

    def __init__(
        self, served: Served, handle: Callable[[Scope, Receive, Send], Awaitable[None]]
    ) -> None:
        self._served = served
        self._handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key_scope = self._served.keys.scope(scope)  # a 401 (HttpError) before the SDK runs
        if scope["method"] == "GET":
            # Stateless, nothing is ever pushed: the SDK's GET stream would stay open, empty,
            # for ever. The streamable-HTTP spec lets a server without one answer 405.
            raise HttpError(
                405, "/mcp offers no GET stream: POST the requests",
                code="method_not_allowed", headers={"Allow": "POST"},
            )  # fmt: skip
        scope.setdefault("state", {})[_SCOPE_KEY] = key_scope
        await self._handle(scope, receive, send)


def describe(agent: Agent) -> str:
    """What the agent is, for a client choosing it: its instructions' first paragraph."""
    instructions = getattr(agent, "instructions", None) or ""
    first = " ".join(instructions.split("\n\n", 1)[0].split())
    name = agent.name or "raf-agent"
    return first or f"Ask the agent {name!r} anything; it answers in text."


def _arguments(arguments: Any, error: Any, code: int) -> tuple[str, str | None]:
    """``message`` and ``session_id`` of a call, or the SDK's error naming what is wrong."""
    given = dict(arguments or {})
    unknown = sorted(set(given) - {"message", "session_id"})
    if unknown:
        raise error(code, f"unknown arguments: {', '.join(repr(u)[:80] for u in unknown[:5])}")
    message, session_id = given.get("message"), given.get("session_id")
    if not isinstance(message, str) or not message.strip():
        raise error(code, "'message' must be a non-empty string")
    if session_id is not None and not isinstance(session_id, str):
        raise error(code, "'session_id' must be a string")
    return message, session_id


def _result(response: AgentResponse, session_id: str | None, types: Any) -> Any:
    """The answer as a tool result; calls that wait for approval are named in it."""
    text = turn_text(response)
    structured: dict[str, Any] = {"answer": text}
    if session_id is not None:
        structured["session_id"] = session_id
    if response.pending:
        names = ", ".join(p.call.name for p in response.pending)
        text = (text + "\n\n" if text else "") + f"(waiting for a person's approval: {names})"
        structured["pending"] = [
            {"tool_call_id": p.call.id, "name": p.call.name, "arguments": p.call.arguments,
             "token": p.token}
            for p in response.pending
        ]  # fmt: skip
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=structured
    )


async def closable_run(
    agent: Agent,
    messages: Sequence[ChatMessage],
    session: Session | None,
    options: AgentRunOptions,
    on_update: Callable[[Update], Awaitable[None]],
    *,
    key_scope: str = "",
) -> AgentResponse:
    """``agent.run(messages, on_update=...)``, where a cancellation of the caller is an
    early close of the run, never a cancellation of it (``key_scope``: the caller's, for
    the run's budgets).

    The run goes on in a shielded task; when the caller is cancelled (the client
    left, or cancelled its call), the run is closed early with what ``on_update``
    was given, its post stages run (each bounded by the agent's
    ``post_timeout``), and then the cancellation goes on. ``on_update`` failing
    (a connection that broke) closes the run early too.
    """
    sent = Assembly()  # the partial answer (not the updates, their chunks can be large)
    outcome: list[AgentResponse | Exception] = []
    done = anyio.Event()

    async def forward(update: Update) -> None:
        sent.add(update)
        try:
            await on_update(update)
        except Exception:  # the client cannot be told any more: as if it left
            run.close(sent.response())  # the run's send raises the close

    run = keyed_run(key_scope, forward)

    async def go() -> None:
        with anyio.CancelScope(shield=True):
            try:
                response = await agent.run(
                    messages, session=session, options=options, on_update=run
                )
                outcome.append(response)
            except Exception as exc:
                outcome.append(exc)
            finally:
                done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            run.close(sent.response())
            with anyio.CancelScope(shield=True):
                await done.wait()
            raise
    result = outcome[0]
    if isinstance(result, Exception):
        raise result
    return result
