"""POST /v1/responses: the OpenAI Responses protocol on the server side.

A response's id names its conversation: ``resp_<session>_<random>``, the
session id in URL-safe base64, so ``previous_response_id`` goes on in that
session on any worker (a request without ``X-Session-Id`` or
``previous_response_id`` gets a session of its own, unless ``store`` is
false: then it is stateless). The id says no more than ``X-Session-Id``
would: sessions are scoped per key either way.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from raf._values.decision import Decision
from raf._values.messages import AgentResponse, ChatMessage, PendingCall, ToolCall, Update, Usage
from raf._values.protocols import Tool
from raf.serve._client import (
    TEXT_JOIN,
    client_calls,
    client_tools,
    parallel_calls,
    parsed,
    run_options,
    tool_choice,
    turn_text,
)
from raf.serve._client import output_type as output_of
from raf.serve._http import HttpError, failure, note_failure, read_json
from raf.serve._pending import (
    PENDING,
    decisions_in,
    no_session,
    pending_json,
    pending_text,
    with_message,
)
from raf.serve._served import Served
from raf.serve._sessions import keyed_run, unheld
from raf.serve._stream import TurnStream
from raf.serve._wire import check_answers, refused_fields, sampling

__all__: list[str] = []

#: The fields of a Responses body that the server honours.
ACCEPTED = frozenset(
    {
        "model", "input", "instructions", "tools", "tool_choice", "text", "stream",
        "previous_response_id", "store", "temperature", "max_output_tokens", "user",
        "metadata", "prompt_cache_key", "raf_decisions",
        "parallel_tool_calls",
    }
)  # fmt: skip
_ROLES = frozenset({"user", "system", "developer", "assistant"})


@attrs.frozen
class ResponsesRequest:
    """A checked ``POST /v1/responses`` body."""

    model: str
    messages: tuple[ChatMessage, ...]
    instructions: str | None
    tools: tuple[Tool, ...]
    overrides: Mapping[str, Any]
    stream: bool
    previous: str | None  # the session of previous_response_id
    store: bool
    # raf_decisions: the calls that wait, decided (the input then adds no message)
    decisions: tuple[Decision, ...] = ()


async def responses(served: Served, request: Request) -> ASGIApp:
    """``POST /v1/responses``: one turn, whole or streamed (Responses events)."""
    data = await read_json(request, served.max_body)
    body = await parsed(parse_responses, data, served.agent.tools)
    if body.model != served.model:
        raise HttpError(
            404, f"the model {body.model!r:.80} does not exist here", code="model_not_found"
        )
    session_id = request.headers.get("x-session-id") or body.previous
    messages: Sequence[ChatMessage] = body.messages
    if body.decisions:  # they resume the calls that wait in the session: no new message
        if session_id is None:
            raise no_session()
        if messages:
            raise with_message()
    session = None
    # A session the client did not name (the server's, or its previous_response_id's) may
    # never be continued: this process's own store keeps a bounded number of those.
    unnamed = request.headers.get("x-session-id") is None
    if session_id is None and body.store:
        session_id = uuid.uuid4().hex
    if session_id is not None:
        session = await served.session(request, session_id, unnamed=unnamed)
        if body.previous is None and not body.decisions:
            messages = await unheld(session, messages)
    server_tools = {t.name for t in served.agent.tools}
    await check_answers(body.messages, session, server_tools, "a function_call_output", "call_id")
    if body.instructions:  # after the agent's own, for this turn
        messages = (ChatMessage.system(body.instructions), *messages)
    options = run_options(served.options, body.overrides, served.agent.chat_client)
    response_id = _response_id(session_id)
    turn: Sequence[ChatMessage] | Sequence[Decision] = body.decisions or messages
    if body.stream:
        framing = ResponseFraming(response_id, served.model, body.tools)
        return TurnStream(served.agent, turn, session, options, framing)
    try:
        response = await served.agent.run(
            turn, session=session, options=options, on_update=keyed_run(request.state.key_scope)
        )
    except Exception as exc:
        note_failure(request.scope, exc)
        raise failure(exc) from None
    return JSONResponse(whole(response_id, served.model, response, body.tools))


def parse_responses(body: Any, agent_tools: Sequence[Tool]) -> ResponsesRequest:
    """Check a Responses body; anything wrong is an :class:`HttpError` 400."""
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    refused_fields(body, ACCEPTED)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise HttpError(400, "'model' must be a non-empty string", code="invalid_model")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise HttpError(400, "'instructions' must be a string")
    tools = client_tools([_as_chat_tool(t) for t in _list(body.get("tools"), "tools")], agent_tools)
    overrides: dict[str, Any] = {"tools": tools} if tools else {}
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    named = tool_choice(choice, (*agent_tools, *tools))
    if named is not None:
        overrides["tool_choice"] = named
    text = body.get("text")
    if text is None:
        text = {}
    if not isinstance(text, dict):  # ignored, its format was silently not honoured
        raise HttpError(400, "'text' must be an object, such as {\"format\": {...}}")
    form = text.get("format")
    if isinstance(form, dict) and form.get("type") == "json_schema":
        form = {"type": "json_schema", "json_schema": form}
    output = output_of(form, "text.format")
    if output is not None:
        overrides["output_type"] = output
    # The same checks as a chat completion's, under the chat names.
    numbers = {"temperature": body.get("temperature"), "max_tokens": body.get("max_output_tokens")}
    overrides.update(sampling({k: v for k, v in numbers.items() if v is not None}))
    overrides.update(parallel_calls(body.get("parallel_tool_calls")))
    previous = body.get("previous_response_id")
    decisions = decisions_in(body)
    given = body.get("input")
    return ResponsesRequest(
        model,
        () if decisions and not given else _input(given),
        instructions,
        tools,
        overrides,
        body.get("stream") is True,
        None if previous is None else _session_of(previous),
        body.get("store") is not False,
        decisions,
    )


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise HttpError(400, f"'{where}' must be a list")
    return value


def _as_chat_tool(tool: Any) -> Any:
    """A Responses function tool (flat) in the chat completions shape (nested)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise HttpError(400, f"only function tools can be offered here, got {kind!r:.40}")
    fields = {k: tool.get(k) for k in ("name", "description", "parameters")}
    return {"type": "function", "function": fields}


def _input(value: Any) -> tuple[ChatMessage, ...]:
    """``input``, a string or a list of items, as raf messages."""
    if isinstance(value, str) and value:
        return (ChatMessage.user(value),)
    if not isinstance(value, list) or not value:
        raise HttpError(400, "'input' must be a non-empty string or list of items")
    messages: list[ChatMessage] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise HttpError(400, f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "function_call":
            call = _strings(item, ("call_id", "name", "arguments"), where)
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":
                messages[-1] = attrs.evolve(last, tool_calls=(*last.tool_calls, ToolCall(*call)))
            else:
                messages.append(ChatMessage("assistant", None, tool_calls=(ToolCall(*call),)))
        elif kind == "function_call_output":
            call_id, output = _strings(item, ("call_id", "output"), where)
            messages.append(ChatMessage.tool(call_id, output))
        elif kind == "message":
            messages.append(_message(item, where))
        else:
            raise HttpError(400, f"{where}: an item of type {kind!r:.40} is not supported")
    return tuple(messages)


def _strings(item: Mapping[str, Any], names: Sequence[str], where: str) -> tuple[str, ...]:
    values = tuple(item.get(name) for name in names)
    if not all(isinstance(value, str) for value in values):
        raise HttpError(400, f"{where} must have string {', '.join(names)}")
    return values  # type: ignore[return-value]  # checked above


def _message(item: Mapping[str, Any], where: str) -> ChatMessage:
    role = item.get("role")
    if role not in _ROLES:
        raise HttpError(400, f"{where}.role must be one of {', '.join(sorted(_ROLES))}")
    content = item.get("content")
    if isinstance(content, list):
        texts = [part.get("text") if isinstance(part, dict) else None for part in content]
        if not all(isinstance(text, str) for text in texts):
            raise HttpError(400, f"{where}.content must be text parts")
        content = "".join(texts)  # type: ignore[arg-type]  # checked above
    if not isinstance(content, str):
        raise HttpError(400, f"{where}.content must be a string or a list of text parts")
    return ChatMessage("system" if role == "developer" else role, content)


def _response_id(session_id: str | None) -> str:
    if session_id is None:
        return f"resp_{uuid.uuid4().hex}"
    named = base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=")
    return f"resp_{named}_{uuid.uuid4().hex[:12]}"


def _session_of(previous: Any) -> str:
    """The session a ``previous_response_id`` names; 400 if it names none."""
    if not isinstance(previous, str):
        raise HttpError(400, "'previous_response_id' must be a string")
    named = previous[5:].rpartition("_")[0]
    try:
        if previous.startswith("resp_") and named:
            return base64.urlsafe_b64decode(named + "=" * (-len(named) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        pass
    raise HttpError(
        400, "'previous_response_id' names no stored response", code="previous_response_not_found"
    )


def _usage(response: AgentResponse) -> dict[str, Any]:
    usage = response.usage or Usage()
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def _text_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [part] if status == "completed" else [],
    }


def _call_item(call: ToolCall, status: str = "completed") -> dict[str, Any]:
    arguments = call.arguments if status == "completed" else ""
    return {
        "type": "function_call",
        "id": f"fc_{call.id}",
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _envelope(response_id: str, model: str, status: str, output: list[Any]) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
    }


def whole(
    response_id: str, model: str, response: AgentResponse, tools: Sequence[Tool]
) -> dict[str, Any]:
    """A whole ``response``: the turn's text as one message item, then the client calls;
    the calls that wait for approval in the text, and listed as ``raf_pending``."""
    text = turn_text(response)
    if response.pending:
        text = TEXT_JOIN.join(t for t in (text, pending_text(response.pending)) if t)
    output = [_text_item(f"msg_{uuid.uuid4().hex}", text)] if text else []
    output += [_call_item(call) for call in client_calls(response, tools)]
    whole = {**_envelope(response_id, model, "completed", output), "usage": _usage(response)}
    if response.pending:
        whole[PENDING] = pending_json(response.pending)
    return whole


class ResponseFraming:
    """A streamed turn as Responses events: ``response.created``, one message item
    whose text is the turn's (a later model call's after a blank line, then a
    line per call that waits for approval), an item per client call, and
    ``response.completed`` (its response lists the calls that wait as
    ``raf_pending``), or ``response.failed``."""

    def __init__(self, response_id: str, model: str, tools: Sequence[Tool]) -> None:
        self._id = response_id
        self._model = model
        self._client_tools = {tool.name for tool in tools}
        # The stream writes start()'s two events before the first update's, which it
        # asks for first: those two are numbered 0 and 1, the others from 2 on.
        self._sequence = 2
        self._output: list[dict[str, Any]] = []  # the items done
        self._message: str | None = None  # the id of the open message item
        self._text: list[str] = []
        self._between = False  # whether a model call ended since the last text
        self._pending: list[PendingCall] = []  # the calls that wait for approval

    def _event(self, kind: str, number: int | None = None, **fields: Any) -> bytes:
        if number is None:
            number, self._sequence = self._sequence, self._sequence + 1
        body = {"type": kind, "sequence_number": number, **fields}
        data = json.dumps(body, ensure_ascii=False)
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def start(self) -> list[bytes]:
        created = _envelope(self._id, self._model, "in_progress", [])
        return [
            self._event("response.created", 0, response=created),
            self._event("response.in_progress", 1, response=created),
        ]

    def update(self, update: Update) -> list[bytes]:
        if update.kind == "tool_result":
            self._between = True
        call = update.tool_call
        if update.kind == "tool_call" and call is not None and call.name in self._client_tools:
            return self._end_text() + self._call(call)
        text = update.text
        if update.kind == "approval" and update.pending is not None:
            first = not self._pending
            self._pending.append(update.pending)
            text = pending_text([update.pending])
            if self._text and not first:  # a line each, after a blank line
                text = "\n" + text
            self._between = self._between or first
        elif update.kind != "text":
            return []
        if not text:
            return []
        frames = [] if self._message is not None else self._open_text()
        delta = text
        if self._between and self._text:
            delta = TEXT_JOIN + delta
        self._between = False
        self._text.append(delta)
        where: dict[str, Any] = {
            "item_id": self._message,
            "output_index": len(self._output),
            "content_index": 0,
        }
        return [*frames, self._event("response.output_text.delta", **where, delta=delta)]

    def _open_text(self) -> list[bytes]:
        self._message = f"msg_{uuid.uuid4().hex}"
        item = _text_item(self._message, "", "in_progress")
        part = {"type": "output_text", "text": "", "annotations": []}
        index = len(self._output)
        return [
            self._event("response.output_item.added", output_index=index, item=item),
            self._event(
                "response.content_part.added",
                item_id=self._message,
                output_index=index,
                content_index=0,
                part=part,
            ),
        ]

    def _end_text(self) -> list[bytes]:
        if self._message is None:
            return []
        text = "".join(self._text)
        item = _text_item(self._message, text)
        where: dict[str, Any] = {
            "item_id": self._message,
            "output_index": len(self._output),
            "content_index": 0,
        }
        frames = [
            self._event("response.output_text.done", **where, text=text),
            self._event("response.content_part.done", **where, part=item["content"][0]),
            self._event("response.output_item.done", output_index=len(self._output), item=item),
        ]
        self._output.append(item)
        self._message = None
        return frames

    def _call(self, call: ToolCall) -> list[bytes]:
        index = len(self._output)
        item = _call_item(call)
        where: dict[str, Any] = {"item_id": item["id"], "output_index": index}
        frames = [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=_call_item(call, "in_progress"),
            ),
            self._event("response.function_call_arguments.delta", **where, delta=call.arguments),
            self._event("response.function_call_arguments.done", **where, arguments=call.arguments),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
        self._output.append(item)
        return frames

    def finish(self, response: AgentResponse) -> list[bytes]:
        frames = self._end_text()
        done = _envelope(self._id, self._model, "completed", self._output)
        done["usage"] = _usage(response)
        # The run's own: a durable run's wait that was decided in the stream waits no more.
        pending = response.pending
        if pending:
            done[PENDING] = pending_json(pending)
        return [*frames, self._event("response.completed", response=done)]

    def failed(self, error: HttpError) -> list[bytes]:
        failed = _envelope(self._id, self._model, "failed", self._output)
        failed["error"] = {"code": error.code or "server_error", "message": error.message}
        return [self._event("response.failed", response=failed)]
