"""POST /ag-ui: the AG-UI protocol, through the ``ag-ui-protocol`` package's own types."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import attrs
import pydantic
from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    CustomEvent,
    DeveloperMessage,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    SystemMessage,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    ToolMessage,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from starlette.requests import Request
from starlette.types import ASGIApp

from raf._values.decision import Decision
from raf._values.messages import AgentResponse, ChatMessage, PendingCall, Role, ToolCall, Update
from raf._values.protocols import Tool
from raf.serve._client import client_tools
from raf.serve._http import HttpError, read_json
from raf.serve._pending import parse_decisions
from raf.serve._served import Served
from raf.serve._sessions import unheld
from raf.serve._stream import TurnStream
from raf.serve._wire import check_answers, new_messages

__all__: list[str] = []

_ENCODER = EventEncoder()
#: The name of the CUSTOM event that gives a pending call's token (after its tool-call events).
APPROVAL_EVENT = "raf.approval"


async def ag_ui(served: Served, request: Request) -> ASGIApp:
    """``POST /ag-ui``: a ``RunAgentInput`` in, the run's AG-UI events out (SSE).

    The ``threadId`` is the session: the stored history is the agent's
    history provider's, and only the messages after the input's last
    assistant message are new. A failure of the run is a ``RUN_ERROR``
    event (the AG-UI way), bad input a 400 before any event.

    ``forwardedProps.decisions`` (a list of ``{"token", "approve", "reason"}``)
    resumes the calls that wait for approval instead: the input then has no
    new message. Each pending call is reported as TOOL_CALL_START/ARGS/END
    with no result, then a ``raf.approval`` CUSTOM event with its token.

    The input's ``tools`` are the client's: offered to the model beside the
    agent's, and a call of one ends the run (TOOL_CALL_START/ARGS/END, then
    RUN_FINISHED); the client's next input brings its result as a tool message.
    """
    body = await read_json(request, served.max_body)
    try:
        run = RunAgentInput.model_validate(body)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise HttpError(400, f"the body is not a RunAgentInput: {problems}") from None
    given = tuple(_message(m, i) for i, m in enumerate(run.messages))
    messages = new_messages(given)
    decisions = decisions_of(run.forwarded_props)
    if decisions and messages:
        raise HttpError(
            400, "forwardedProps.decisions resume a paused run: send them with no new message"
        )
    if not messages and not decisions:
        raise HttpError(400, "no new message after the last assistant message")
    session = await served.session(request, run.thread_id)
    if messages:
        messages = await unheld(session, given)
        await check_answers(messages, session, {tool.name for tool in served.agent.tools})
    framing = EventFraming(run.thread_id, run.run_id)
    offered = [{"function": tool.model_dump()} for tool in run.tools or ()]
    tools: tuple[Tool, ...] = ()
    if offered:  # their schemas are checked in a worker thread, never on the event loop
        tools = await anyio.to_thread.run_sync(client_tools, offered, served.agent.tools)
    options = attrs.evolve(served.options, tools=tools) if tools else served.options
    return TurnStream(
        served.agent,
        decisions or messages,
        session,
        options,
        framing,
        error_status=lambda error: False,
    )


def decisions_of(props: Any, named: str = "forwardedProps") -> tuple[Decision, ...]:
    """``forwardedProps.decisions`` (``named`` says where the object came from) as raf
    decisions (none when absent); a bad one is a 400."""
    if not isinstance(props, dict):
        return ()
    return parse_decisions(props.get("decisions"), f"{named}.decisions")


def _message(message: Any, index: int) -> ChatMessage:
    """An AG-UI message as a raf message; kinds raf cannot take are a 400."""
    if isinstance(message, (UserMessage, SystemMessage, DeveloperMessage)):
        role: Role = "user" if isinstance(message, UserMessage) else "system"
        content = message.content
        if not isinstance(content, str):
            texts = [getattr(part, "text", None) for part in content]
            if not all(isinstance(text, str) for text in texts):
                raise HttpError(400, f"messages[{index}]: only text content is supported")
            content = "".join(t for t in texts if t is not None)
        return ChatMessage(role, content)
    if isinstance(message, AssistantMessage):
        calls = tuple(
            ToolCall(call.id, call.function.name, call.function.arguments)
            for call in message.tool_calls or ()
        )
        return ChatMessage("assistant", message.content, tool_calls=calls)
    if isinstance(message, ToolMessage):
        if not isinstance(message.content, str):
            raise HttpError(400, f"messages[{index}]: a tool message's content must be text")
        return ChatMessage.tool(message.tool_call_id, message.content)
    raise HttpError(
        400, f"messages[{index}]: a {getattr(message, 'role', '?')!r} message is not supported"
    )


class EventFraming:
    """A streamed run as AG-UI events: RUN_STARTED, the text messages and tool calls
    of each model call with their results, then RUN_FINISHED or RUN_ERROR."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self._thread = thread_id
        self._run = run_id
        self._text: str | None = None  # the id of the text message being streamed
        # The id of the model call's text message, the parent of the calls it makes after
        # it (also once TEXT_MESSAGE_END went out): one assistant turn, not two.
        self._parent: str | None = None
        self._calls: set[str] = set()  # the calls whose tool-call events went out
        self._updated = False  # whether the run sent any update

    def start(self) -> list[bytes]:
        return [_frame(RunStartedEvent(thread_id=self._thread, run_id=self._run))]

    def update(self, update: Update) -> list[bytes]:
        self._updated = True
        if update.kind == "text":
            if not update.text:
                return []
            frames = []
            if self._text is None:
                self._text = self._parent = uuid.uuid4().hex
                frames.append(
                    _frame(TextMessageStartEvent(message_id=self._text, role="assistant"))
                )
            frames.append(_frame(TextMessageContentEvent(message_id=self._text, delta=update.text)))
            return frames
        if update.kind == "tool_call" and update.tool_call is not None:
            self._calls.add(update.tool_call.id)
            return self._end_text() + tool_call_events(update.tool_call, self._parent)
        if update.kind == "approval" and update.pending is not None:
            return self._end_text() + self._pending(update.pending)
        if update.kind == "tool_result" and update.message is not None:
            self._parent = None  # the next text is the next model call's
            message = update.message
            result = ToolCallResultEvent(
                message_id=uuid.uuid4().hex,
                tool_call_id=message.tool_call_id or "",
                content=message.content or "",
                role="tool",
            )
            return self._end_text() + [_frame(result)]
        return []

    def _pending(self, pending: PendingCall) -> list[bytes]:
        """A call that waits: its tool-call events (unless this run sent them), then its token."""
        call = pending.call
        frames = [] if call.id in self._calls else tool_call_events(call)
        self._calls.add(call.id)
        return frames + [_frame(approval_event(pending))]

    def _end_text(self) -> list[bytes]:
        if self._text is None:
            return []
        end = TextMessageEndEvent(message_id=self._text)
        self._text = None
        return [_frame(end)]

    def finish(self, response: AgentResponse) -> list[bytes]:
        # A run that sent no update still answers: a decision that a durable run's wait
        # applied returns what the run did, while its updates went to the run's caller.
        frames = [] if self._updated else [f for u in response.to_updates() for f in self.update(u)]
        done = RunFinishedEvent(thread_id=self._thread, run_id=self._run)
        return frames + self._end_text() + [_frame(done)]

    def failed(self, error: HttpError) -> list[bytes]:
        event = RunErrorEvent(
            message=f"{error.message} (request id {error.request_id})",
            code=error.code or str(error.status),
            metadata={"requestId": error.request_id},
        )
        return self._end_text() + [_frame(event)]


def tool_call_events(call: ToolCall, parent: str | None = None) -> list[bytes]:
    """TOOL_CALL_START, _ARGS and _END of one complete call (a pending one, later, too)."""
    return [
        _frame(
            ToolCallStartEvent(
                tool_call_id=call.id, tool_call_name=call.name, parent_message_id=parent
            )
        ),
        _frame(ToolCallArgsEvent(tool_call_id=call.id, delta=call.arguments)),
        _frame(ToolCallEndEvent(tool_call_id=call.id)),
    ]


def approval_event(pending: PendingCall) -> CustomEvent:
    """The ``raf.approval`` CUSTOM event: what a client needs to show the call and decide it."""
    call = pending.call
    value = {
        "toolCallId": call.id,
        "toolCallName": call.name,
        "arguments": call.arguments,
        "token": pending.token,
    }
    return CustomEvent(name=APPROVAL_EVENT, value=value)


def _frame(event: BaseEvent) -> bytes:
    return _ENCODER.encode(event).encode()
