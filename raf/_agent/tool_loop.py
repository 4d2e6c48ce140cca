"""The tool loop: call the model, run the tools it asks for, call it again."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio
import attrs

from raf._agent.deferred import RunDeferred
from raf._agent.tools import FunctionTool, Tool, check_tool_arguments, check_tool_json
from raf._log import log as _log
from raf._values.context import Invocation, ToolRequest
from raf._values.messages import (
    AgentResponse,
    ChatMessage,
    OnUpdate,
    PendingCall,
    ToolCall,
    Update,
    Usage,
)
from raf._values.options import ChatOptions
from raf.errors import (
    GuardrailError,
    ToolArgumentsError,
    ToolConflictError,
    ToolLoopError,
    ToolSchemaError,
)

__all__ = ["ToolRequest"]


ChatCall = Callable[[Sequence[ChatMessage], ChatOptions], Awaitable[AgentResponse]]


#: The composed tool stack: a tool request in, the call's tool message out.
ToolStack = Callable[[ToolRequest], Awaitable[ChatMessage]]


def index_tools(
    tools: Sequence[Tool],
    sources: Sequence[str],
    known: Mapping[str, Tool] | None = None,
    *,
    source: str = "a provider",
) -> dict[str, Tool]:
    """Tools by name; a second tool with a taken name is a ToolConflictError, a tool
    whose parameters are not JSON a ToolSchemaError (see :func:`check_tool_json`).

    ``sources`` names who offered each tool (parallel to ``tools``; shorter
    means ``source`` for the rest); ``known`` are the agent's own tools.
    """
    index = dict(known) if known else {}
    offered_by: dict[str, str] = {}
    for number, tool in enumerate(tools):
        owner = _describe_source(sources[number] if number < len(sources) else source)
        if tool.name in index:
            first = offered_by.get(tool.name, "the agent")
            raise ToolConflictError(tool.name, first, owner)
        check_tool_json(tool)  # no client could send it: refused before the model is called
        index[tool.name] = tool
        offered_by[tool.name] = owner
    return index


def _describe_source(source: str) -> str:
    return source if source.startswith(("the ", "a provider")) else f"provider {source!r}"


async def run_tool_loop(
    chat: ChatCall,
    messages: Sequence[ChatMessage],
    options: ChatOptions,
    tools: Mapping[str, Tool],
    max_tool_iterations: int,
    on_update: OnUpdate | None = None,
    *,
    invocation: Invocation,
    deferred: RunDeferred,
    tool_stack: ToolStack | None = None,
) -> AgentResponse:
    """Call the model until it stops asking for tools: at most ``max_tool_iterations`` calls.

    Returns every message the loop produced (the answers owed to deferred
    calls, assistant turns, tool results, the final answer), the summed
    usage and the last raw response. In a streamed run (``on_update`` set;
    ``chat`` then streams each call), each tool message is sent as a
    ``"tool_result"`` update once its batch ran. Each call goes through
    ``tool_stack`` (the composed tool stack, whose core is
    :func:`invoke_tool`; ``None`` means that core alone).

    ``deferred`` (the run's :class:`RunDeferred`) first resumes what waits
    in the session; a model turn with deferred calls (approval, a client's
    tool) runs the others, then ends the run with them waiting.
    ``options.tool_choice`` goes with the first model call only; later calls
    are ``"auto"``, so a required tool cannot loop forever.
    """
    call_tool = invoke_tool if tool_stack is None else tool_stack

    def run(calls: Sequence[ToolCall], done: Done | None = None) -> Awaitable[Results]:
        return run_tool_calls(calls, tools, call_tool, invocation, done)

    turns = Turns([])
    opening = await deferred.open(messages, options, invocation, run)
    if opening is not None:  # what waited in the session was resumed, or refused
        await _send(on_update, opening.answers, opening.waiting)
        if not opening.goes_on:
            return AgentResponse(opening.answers, pending=opening.waiting)
        messages, options = opening.messages, opening.options
        turns.messages.extend(opening.answers)
    for call_number in range(1, max_tool_iterations + 1):
        response = await turns.ask(chat, messages, options)
        if options.tool_choice is not None:
            options = attrs.evolve(options, tool_choice="auto")
        if not response.tool_calls:
            return turns.answer(response)
        calls, waiting = deferred.split(response.tool_calls, tools)
        if call_number == max_tool_iterations and not waiting:
            raise ToolLoopError(max_tool_iterations, tuple(c.name for c in response.tool_calls))
        results = await run(calls) if calls else ()
        await _send(on_update, results, waiting.pending)
        turns.messages.extend(results)
        if waiting:  # the others ran: the run ends, these wait for a person or the caller
            return turns.answer(response, waiting.pending)
        turn = (*response.messages, *results)
        # `+` copies a long history once; `(*messages, ...)` builds a list, then a tuple.
        messages = messages + turn if type(messages) is tuple else (*messages, *turn)
    raise AssertionError("unreachable: max_tool_iterations >= 1")  # pragma: no cover


#: ``done(index, message)``: told of each call's message as soon as it is there.
Done = Callable[[int, ChatMessage], None]
Results = tuple[ChatMessage, ...]


@attrs.define
class Turns:
    """What one tool loop produced so far, and the usage of its model calls."""

    messages: list[ChatMessage]
    usage: Usage | None = None

    async def ask(
        self, chat: ChatCall, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """One model call; its messages and usage join the loop's."""
        try:
            response = await chat(messages, options)
        except GuardrailError as exc:
            if exc.partial is not None and self.messages:
                # The blocked call's partial is what the consumer saw of it; the consumer saw
                # the turns before it too, and the post stages keep what it saw.
                exc.partial = AgentResponse((*self.messages, *exc.partial.messages))
            raise
        if response.usage is not None:
            self.usage = response.usage if self.usage is None else self.usage + response.usage
        self.messages.extend(response.messages)
        return response

    def answer(self, last: AgentResponse, pending: tuple[PendingCall, ...] = ()) -> AgentResponse:
        """The loop's response, ending with ``last``: ``last`` itself when it is all there
        is (one model call, no tools, nothing resumed: no copy)."""
        if not pending and type(last) is AgentResponse and len(self.messages) == len(last.messages):
            return last
        return AgentResponse(
            tuple(self.messages), self.usage, last.raw, pending=pending, model=last.model
        )


async def _send(
    on_update: OnUpdate | None, results: Sequence[ChatMessage], pending: Sequence[PendingCall]
) -> None:
    """Stream tool results, then the calls that wait for approval."""
    if on_update is not None:
        for result in results:
            await on_update(Update("tool_result", message=result))
        for call in pending:
            await on_update(Update("approval", pending=call))


async def run_tool_calls(
    calls: Sequence[ToolCall],
    tools: Mapping[str, Tool],
    call_tool: ToolStack,
    invocation: Invocation,
    done: Callable[[int, ChatMessage], None] | None = None,
) -> tuple[ChatMessage, ...]:
    """Run the calls concurrently; the tool messages come back in call order.

    ``done(index, message)``, when given, hears of each call's message as
    soon as it is there (approved calls: a cancellation loses none).
    """
    if len(calls) == 1:
        message = await _run_one(calls[0], tools, call_tool, invocation)
        if done is not None:
            done(0, message)
        return (message,)
    results: list[ChatMessage | None] = [None] * len(calls)
    escaped: list[BaseException] = []

    async def run(index: int, call: ToolCall, scope: anyio.CancelScope) -> None:
        try:
            results[index] = message = await _run_one(call, tools, call_tool, invocation)
            if done is not None:
                done(index, message)
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            # What ends the run propagates unchanged, not wrapped in an exception group.
            escaped.append(exc)
            scope.cancel()

    async with anyio.create_task_group() as group:
        for index, call in enumerate(calls):
            group.start_soon(run, index, call, group.cancel_scope)
    if escaped:
        raise escaped[0]
    return tuple(result for result in results if result is not None)


#: Arguments nested deeper than this are refused before any validator walks them:
#: recursive validators (jsonschema) and error messages (reprs) would hit Python's
#: recursion limit long before a model's honest arguments come near it.
MAX_ARGUMENT_DEPTH = 64


async def _run_one(
    call: ToolCall, tools: Mapping[str, Tool], call_tool: ToolStack, invocation: Invocation
) -> ChatMessage:
    """One call's tool message; what goes wrong is told to the model, not raised.

    The checks that need no tool stack come first (a known tool, arguments
    that are a JSON object); then the call goes through the tool stack,
    and an ``Exception`` out of it (the tool's, or a middleware's) becomes
    the tool message. A ``BaseException`` that is not an ``Exception``
    propagates unchanged.
    """
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return _error(call, f"there is no tool named {call.name!r} (available: {known})")
    try:
        arguments = call.parsed_arguments
    except RecursionError:  # json's own limit, from arguments like [[[[...]]]]
        return _error(
            call, f"the arguments of {call.name!r} are not valid JSON (nested too deeply)"
        )
    except ValueError as exc:
        return _error(call, f"the arguments of {call.name!r} are not valid JSON ({exc})")
    if not isinstance(arguments, dict):
        return _error(call, f"the arguments of {call.name!r} must be a JSON object")
    if _deeper_than(arguments, MAX_ARGUMENT_DEPTH):
        return _error(
            call,
            f"the arguments of {call.name!r} are not valid: "
            f"nested deeper than {MAX_ARGUMENT_DEPTH} levels",
        )
    try:
        message = await call_tool(ToolRequest(call, tool, arguments, invocation))
    except (ToolArgumentsError, ToolSchemaError) as exc:
        if exc.tool != tool.name:  # raised by another tool the tool itself called
            return _error(call, f"tool {call.name!r} failed: {_describe(exc)}")
        if isinstance(exc, ToolSchemaError):
            _log.warning("tool.schema_invalid", tool=tool.name, problem=exc.problem)
            return _error(call, f"tool {call.name!r} cannot be called: {exc}")
        return _error(call, str(exc))
    except _Unwritable as exc:
        return _error(call, f"the result of tool {call.name!r} cannot be sent to the model: {exc}")
    except Exception as exc:
        return _error(call, f"tool {call.name!r} failed: {_describe(exc)}")
    if (
        type(message) is not ChatMessage
        or message.tool_call_id != call.id
        or (message.role != "tool")
    ):
        # A bug in a tool middleware, not something the model can mend: the run ends.
        raise TypeError(
            f"the tool stack answered call {call.id!r} (tool {call.name!r}) with "
            f"{message!r:.100}, not its tool message: a tool middleware must return "
            "'await call_next(request)' or 'request.reply(text)'"
        )
    return message


async def invoke_tool(request: ToolRequest) -> ChatMessage:
    """The core of the tool stack: check the arguments, invoke the tool, write its result.

    Raises what goes wrong (the tool's own exception, ``ToolArgumentsError``
    for arguments that do not fit the schema), so the tool middleware see
    it; the tool loop turns it into the message for the model.
    """
    tool, arguments = request.tool, request.arguments
    if not isinstance(tool, FunctionTool):  # a FunctionTool checks its own arguments
        check_tool_arguments(tool, arguments)
    # A tool that needs the run it is called in (an agent as a tool) is given the request.
    invoke_request = getattr(tool, "invoke_request", None)
    if invoke_request is not None:
        result = await invoke_request(request)
    else:
        result = await tool.invoke(arguments)
    try:
        text = _as_text(result)
    except _Unwritable:
        raise
    except Exception as exc:
        raise _Unwritable(_describe(exc)) from exc
    return ChatMessage.tool(request.call.id, text, name=request.call.name)


def _error(call: ToolCall, text: str) -> ChatMessage:
    return ChatMessage.tool(call.id, f"Error: {text}", name=call.name)


def _as_text(result: Any) -> str:
    """A ``str`` as it is, anything else as JSON (``_Unwritable`` when it cannot be)."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=_jsonable)
    except RecursionError:  # json's own limit: a result nested thousands deep
        raise _Unwritable("it is nested too deeply to be written as JSON") from None
    except ValueError as exc:  # "Circular reference detected", pydantic's depth limit
        raise _Unwritable(f"it cannot be written as JSON ({exc})") from None


class _Unwritable(ValueError):
    """A tool's result that cannot be written as JSON; the message says why."""


def _describe(exc: BaseException, *, with_type: bool = True) -> str:
    """``"ValueError: text"``, even for an exception whose ``str()`` itself fails."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not turn a told failure into a crash
        text = "(its message cannot be shown)"
    return f"{type(exc).__name__}: {text}" if with_type else text


def _jsonable(value: Any) -> Any:
    # Imported here: only a result that is not plain JSON needs it, and `import raf` must not.
    import pydantic_core

    # pydantic knows models, dataclasses, sets, enums, dates, paths, ...; str() the rest
    return pydantic_core.to_jsonable_python(value, fallback=str)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests arrays and objects more than ``limit`` deep, without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
