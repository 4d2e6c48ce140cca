"""A2A: the agent served with the ``a2a-sdk`` server, its card and its JSON-RPC route.

The SDK answers the protocol (JSON-RPC at ``/a2a``, the methods of A2A 1.0
and, on the same route, those of 0.3: ``message/send``, ``message/stream``,
``tasks/get``, ``tasks/cancel``); raf gives it an executor (:class:`_Executor`)
that runs the agent for each message. The message's ``contextId`` is the
session (under the caller's key); a task is one turn: ``working``, its answer
as the chunks of one artifact (replaced at the end by one text part, the whole
answer), then ``completed``, ``failed``, or
``input-required`` when calls wait for a person's approval. The next message
of that task decides them: a data part ``{"decisions": [{"token", "approve",
"reason"}]}``, as AG-UI's ``forwardedProps.decisions``. Cancelling a task is
an early close of its run: every entered provider gets ``StreamClosedError``
with the partial answer before the task is ``canceled``; cancelling a task
that waits for input denies its calls in the session (none runs later).

The SDK's server runs its tasks as asyncio tasks: an app with ``a2a=True``
runs on asyncio only.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import anyio
import attrs
import structlog
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import AgentCard
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive

from raf._agent.deferred import Decision, deny_pending
from raf._metadata import installed_version
from raf._values.assembly import Assembly
from raf._values.messages import ChatMessage, PendingCall, Update
from raf._values.run import Run
from raf.serve._agui import decisions_of
from raf.serve._client import TEXT_JOIN, turn_text
from raf.serve._http import HttpError, failure, read_json
from raf.serve._mcp import describe
from raf.serve._served import Served
from raf.serve._sessions import keyed_run

__all__: list[str] = []

_log = structlog.get_logger("raf.serve")
#: Where the caller's key scope travels in the SDK's call context (its ``state``).
_KEY = "raf_key_scope"
#: The path of the JSON-RPC route (the card names it, absolute).
RPC_PATH = "/a2a"
CARD_PATH = "/.well-known/agent-card.json"
#: The tasks kept for each key (the least recently updated go first): the SDK's
#: in-memory store would keep every task, its messages and answer, for ever.
MAX_TASKS = 1000


def a2a_routes(served: Served) -> list[BaseRoute]:
    """The card and JSON-RPC routes of ``served``; the SDK's task registry is closed on
    the app's lifespan end."""
    template = _card(served, "")
    executor = _Executor(served)
    handler = DefaultRequestHandler(
        agent_executor=executor, task_store=_Kept(), agent_card=template
    )
    served.lifespans.append(lambda: _Closed(handler, executor))
    dispatcher = JsonRpcDispatcher(
        handler, context_builder=_KeyedContext(), enable_v0_3_compat=True
    )

    async def rpc(served: Served, request: Request) -> ASGIApp:
        # Read here as every route reads JSON (its type, its size, its depth): the SDK
        # reads any length, of any type, and answers its parser's words.
        body = json.dumps(await read_json(request, served.max_body)).encode()
        response: Response = await dispatcher.handle_requests(
            Request(request.scope, _replay(body, request.receive))
        )
        return response

    async def card(served: Served, request: Request) -> ASGIApp:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict

        return JSONResponse(agent_card_to_dict(_card(served, _base(served, request))))

    return [
        served.route(CARD_PATH, "GET", card, keyed=False),
        served.route(RPC_PATH, "POST", rpc),
    ]


def _base(served: Served, request: Request) -> str:
    """Where the card says the agent answers: the configured public address, else the
    address the server is bound to as the connection came in on it (its scheme, host and
    port). Never the request's ``Host``: any caller can write one, and a cache or a proxy
    would hand the card naming it to the next caller."""
    if served.public_url is not None:
        return served.public_url
    server = request.scope.get("server")
    if not server:  # a Unix socket: no address to name, the path alone
        return str(request.scope.get("root_path", "")).rstrip("/")
    host, port = server[0], server[1]
    host = f"[{host}]" if ":" in host else host
    scheme = request.scope.get("scheme", "http")
    default = {"http": 80, "https": 443}.get(scheme)
    netloc = host if port in (None, default) else f"{host}:{port}"
    return f"{scheme}://{netloc}" + str(request.scope.get("root_path", "")).rstrip("/")


class _KeyedContext(DefaultServerCallContextBuilder):
    """The SDK's call context, with the caller's key scope (its tasks are the key's)."""

    def build(self, request: Request) -> Any:
        context = super().build(request)
        headers = context.state.get("headers", {})  # the SDK reads A2A-Version there
        headers.pop("authorization", None)  # the key stays out of the tasks' context
        context.state[_KEY] = request.state.key_scope
        return context


def _owner(context: Any) -> str:
    """Whose a task is: the key scope of the call that made it."""
    owner: str = context.state.get(_KEY, "")
    return owner


class _Kept(TaskStore):
    """The SDK's in-memory task store, keeping the last :data:`MAX_TASKS` tasks of each key."""

    def __init__(self) -> None:
        self._store = InMemoryTaskStore(owner_resolver=_owner)
        self._order: dict[str, dict[str, None]] = {}  # owner -> task ids, oldest update first

    async def save(self, task: Any, context: Any) -> None:
        await self._store.save(task, context)
        order = self._order.setdefault(_owner(context), {})
        order.pop(task.id, None)
        order[task.id] = None
        while len(order) > MAX_TASKS:
            oldest = next(iter(order))
            del order[oldest]
            await self._store.delete(oldest, context)

    async def get(self, task_id: str, context: Any) -> Any:
        return await self._store.get(task_id, context)

    async def list(self, params: Any, context: Any) -> Any:
        return await self._store.list(params, context)

    async def delete(self, task_id: str, context: Any) -> None:
        self._order.get(_owner(context), {}).pop(task_id, None)
        await self._store.delete(task_id, context)


def _card(served: Served, base: str) -> AgentCard:
    """The agent card: what the agent is, its skills (its tools, and the agent itself),
    where it answers (``base`` + ``/a2a``) and how (streaming; a bearer key when keyed)."""
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        HTTPAuthSecurityScheme,
        SecurityRequirement,
        SecurityScheme,
        StringList,
    )

    agent = served.agent
    about = describe(agent)
    skills = [AgentSkill(id=served.model, name=served.model, description=about, tags=["agent"])]
    skills += [
        AgentSkill(
            id=f"tool:{tool.name}", name=tool.name, description=tool.description or tool.name,
            tags=["tool"],
        )
        for tool in agent.tools
    ]  # fmt: skip
    card = AgentCard(
        name=served.model,
        description=about,
        version=installed_version(),
        supported_interfaces=[
            AgentInterface(url=base + RPC_PATH, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=skills,
    )
    if served.keys.keyed:
        scheme = HTTPAuthSecurityScheme(scheme="bearer", description="an api key of the server")
        card.security_schemes["bearer"].CopyFrom(SecurityScheme(http_auth_security_scheme=scheme))
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card


class _Closed:
    """The SDK's request handler, closed (its tasks drained) when the app stops; the runs
    still going are closed early first (the SDK would cancel them)."""

    def __init__(self, handler: Any, executor: _Executor) -> None:
        self._handler = handler
        self._executor = executor

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        await self._executor.close_all()
        await self._handler.aclose()


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` (already read) once, then the connection's own."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


@attrs.define
class _Run:
    """One task's run in flight: what a cancel closes, and when it is over."""

    handle: Run  # the run's own object: its close
    sent: Assembly = attrs.field(factory=Assembly)  # the partial answer, not the updates
    done: anyio.Event = attrs.field(factory=anyio.Event)


class _Executor(AgentExecutor):
    """The SDK's ``AgentExecutor`` for a raf agent: each message of a task is a turn."""

    def __init__(self, served: Served) -> None:
        self._served = served
        self._runs: dict[str, _Run] = {}

    async def execute(self, context: RequestContext, queue: EventQueue) -> None:
        from a2a.server.tasks import TaskUpdater
        from a2a.types import Part, Task, TaskState, TaskStatus

        message = context.message
        task_id, context_id = context.task_id or "", context.context_id or ""
        if message is None:
            return
        if context.current_task is None:
            submitted = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
            task = Task(id=task_id, context_id=context_id, status=submitted, history=[message])
            await queue.enqueue_event(task)
        updater = TaskUpdater(queue, task_id, context_id)
        try:
            given = _input(message)
            scope = context.call_context.state.get(_KEY, "")
            session = await self._served.session_of(scope, context_id)
        except HttpError as exc:
            await updater.reject(updater.new_agent_message([Part(text=exc.message)]))
            return
        except Exception as exc:  # the store: its words stay in the log
            _log.warning("raf.serve: an A2A task found no session", task=task_id, error=repr(exc))
            await updater.failed(updater.new_agent_message([Part(text="the session store failed")]))
            return
        await updater.start_work()
        answer = _Answer(updater)

        async def sink(update: Update) -> None:
            run.sent.add(update)
            await answer.update(update)

        run = self._runs[task_id] = _Run(keyed_run(scope, sink))
        try:
            response = await self._served.agent.run(
                given, session=session, options=self._served.options, on_update=run.handle
            )
        except Exception as exc:
            if run.handle.closed is not None:  # cancelled: the cancel writes the state
                if exc is not run.handle.closed:  # a post stage failed on the way out
                    _log.warning("raf.serve: a cancelled A2A task failed", error=repr(exc))
                return
            _log.warning("raf.serve: an A2A task failed", task=task_id, error=repr(exc))
            problem = failure(exc)
            text = f"{problem.message} ({problem.code or problem.status})"
            await updater.failed(updater.new_agent_message([Part(text=text)]))
            return
        finally:
            run.done.set()
            del self._runs[task_id]
        await answer.end(turn_text(response))
        if response.pending:
            await updater.requires_input(
                updater.new_agent_message(_pending_parts(response.pending))
            )
        else:
            await updater.complete()

    async def close_all(self) -> None:
        """Close every run still going early, and wait for their post stages."""
        runs = list(self._runs.values())
        for run in runs:
            run.handle.close(run.sent.response())
        for run in runs:
            await run.done.wait()

    async def cancel(self, context: RequestContext, queue: EventQueue) -> None:
        from a2a.server.tasks import TaskUpdater

        run = self._runs.get(context.task_id or "")
        if run is not None:
            run.handle.close(run.sent.response())
            await run.done.wait()  # every entered provider had its post stage
        elif (tokens := _waiting(context.current_task)) and context.context_id:
            # Its calls wait in the session: denied, or a later decision would still run them.
            scope = context.call_context.state.get(_KEY, "") if context.call_context else ""
            session = await self._served.session_of(scope, context.context_id)
            await deny_pending(session, tokens, "the task was cancelled.")
        await TaskUpdater(queue, context.task_id or "", context.context_id or "").cancel()


class _Answer:
    """The answer of a task as one artifact, sent in chunks as the text streams, then
    replaced by one text part, the chunks joined: a client reading the finished task
    (the SDK's ``get_artifact_text``, whose parts it joins with a newline) reads the answer."""

    def __init__(self, updater: Any) -> None:
        self._updater = updater
        self._id = uuid.uuid4().hex
        self._chunks: list[str] = []
        self._between = False  # whether a model call ended since the last text

    async def update(self, update: Update) -> None:
        """A text update as the next chunk (the text of two model calls kept apart)."""
        if update.kind == "tool_result":  # the next text is a later model call's
            self._between = True
        if update.kind != "text" or not update.text:
            return
        text = TEXT_JOIN + update.text if self._between and self._chunks else update.text
        self._between = False
        await self._send(text, append=bool(self._chunks), last=False)
        self._chunks.append(text)

    async def end(self, text: str) -> None:
        """The last chunk: the whole answer, as one part that replaces the streamed ones
        (the chunks joined; ``text`` for a run that sent no text update, a resumed one
        whose updates went elsewhere)."""
        whole = "".join(self._chunks) if self._chunks else text
        if whole:
            await self._send(whole, append=False, last=True)

    async def _send(self, text: str, *, append: bool, last: bool) -> None:
        from a2a.types import Part

        await self._updater.add_artifact(
            [Part(text=text)], artifact_id=self._id, name="answer", append=append,
            last_chunk=last,
        )  # fmt: skip


def _input(message: Any) -> list[ChatMessage] | tuple[Decision, ...]:
    """What a message asks: its text as a user message, or the decisions of its data part."""
    from a2a.helpers import get_data_parts, get_text_parts

    if any(not (part.HasField("text") or part.HasField("data")) for part in message.parts):
        raise HttpError(400, "only text and data parts are understood here")
    text = "\n".join(get_text_parts(message.parts))
    decisions: tuple[Decision, ...] = ()
    for data in get_data_parts(message.parts):
        decisions += decisions_of(data, "the data part")
    if decisions and text.strip():
        raise HttpError(400, "a message decides pending calls or asks something, not both")
    if decisions:
        return decisions
    if not text.strip():
        raise HttpError(400, "the message has no text")
    return [ChatMessage.user(text)]


def _waiting(task: Any) -> tuple[str, ...]:
    """The tokens of the calls an ``input-required`` task waits for (its status says them)."""
    from a2a.helpers import get_data_parts
    from a2a.types import TaskState

    if task is None or task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
        return ()
    data = get_data_parts(task.status.message.parts)
    return tuple(call["token"] for part in data for call in part.get("pending", ()))


def _pending_parts(pending: tuple[PendingCall, ...]) -> list[Any]:
    """What an ``input-required`` status says: the calls that wait, as text and as data."""
    from a2a.helpers import new_data_part
    from a2a.types import Part

    calls = "; ".join(f"{p.call.name}({p.call.arguments})" for p in pending)
    text = (
        f"waiting for a person's approval: {calls}. Answer with a data part "
        '{"decisions": [{"token": ..., "approve": true or false, "reason": ...}]}'
    )
    data = {
        "pending": [
            {"toolCallId": p.call.id, "name": p.call.name, "arguments": p.call.arguments,
             "token": p.token}
            for p in pending
        ]
    }  # fmt: skip
    return [Part(text=text), new_data_part(data)]
