"""The tool loop: call the model, run the tools it asks for, call it again."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import anyio
import attrs

from raf._agent.approvals import Opening, RunApprovals, wants_approval
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
    ApprovalError,
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
    tool_stack: ToolStack | None = None,
    approvals: RunApprovals | None = None,
) -> AgentResponse:
    """Call the model until it stops asking for tools: at most ``max_tool_iterations`` calls.

    Returns every message the loop produced (assistant turns, tool results,
    the final answer), the summed usage and the last raw response. In a
    streamed run (``on_update`` set; ``chat`` then streams each call), each
    tool message is sent as a ``"tool_result"`` update once the batch ran.
    Each call goes through ``tool_stack`` (the composed tool stack, whose
    core is :func:`invoke_tool`; ``None`` means that core alone).

    With ``approvals`` (the agent keeps a history), the run first applies
    its decisions (or refuses what waits, when a new turn begins): those
    answers open the response. A model turn whose calls include some that
    need approval runs the others, then ends the run with them ``pending``.

    A tool whose ``runs_on_client`` is true is never invoked here: a model
    turn that calls one runs the others, then ends the run with that call
    unanswered (the caller runs it; its next request brings the result).
    ``options.tool_choice`` goes with the first model call only; later calls
    are ``"auto"``, so a required tool cannot loop forever.
    """
    call_tool = invoke_tool if tool_stack is None else tool_stack
    produced: list[ChatMessage] = []
    usage: Usage | None = None
    try:
        if approvals is not None:
            opening = await _open(approvals, messages, tools, call_tool, invocation, on_update)
            produced.extend(opening.answers)
            if not opening.goes_on:
                return AgentResponse(tuple(produced), pending=opening.waiting)
            options = _answered_history(options, len(opening.messages) - len(messages))
            messages = opening.messages
        for call_number in range(1, max_tool_iterations + 1):
            response = await chat(messages, options)
            if options.tool_choice is not None:
                options = attrs.evolve(options, tool_choice="auto")
            produced.extend(response.messages)
            if response.usage is not None:
                usage = response.usage if usage is None else usage + response.usage
            calls = response.tool_calls
            if not calls:
                if (
                    call_number == 1
                    and type(response) is AgentResponse
                    and len(produced) == len(response.messages)  # nothing resumed before it
                ):
                    return response  # one call, no tools, nothing resumed: the run's response
                return AgentResponse(tuple(produced), usage, response.raw, model=response.model)
            held = _held(approvals, calls, tools)
            left = [call for call in calls if runs_on_client(tools.get(call.name))]
            if call_number == max_tool_iterations and not (held or left):
                raise ToolLoopError(max_tool_iterations, tuple(call.name for call in calls))
            if held or left:
                waiting = {call.id for call in (*held, *left)}
                calls = tuple(call for call in calls if call.id not in waiting)
            results = await run_tool_calls(calls, tools, call_tool, invocation) if calls else ()
            await _send_results(on_update, results)
            produced.extend(results)
            if held or left:  # the others ran: the run ends, these wait for a person or caller
                pending = approvals.pending(held) if held and approvals is not None else ()
                await _send_pending(on_update, pending)
                return AgentResponse(
                    tuple(produced), usage, response.raw, pending=pending, model=response.model
                )
            turn = (*response.messages, *results)
            # `+` copies a long history once; `(*messages, ...)` builds a list, then a tuple.
            messages = messages + turn if type(messages) is tuple else (*messages, *turn)
    except BaseException as exc:
        if isinstance(exc, GuardrailError) and exc.partial is not None and produced:
            # The blocked call's partial is what the consumer saw of it; the consumer saw
            # the turns before it too, and the post stages keep what it saw.
            exc.partial = AgentResponse((*produced, *exc.partial.messages))
        if approvals is not None:
            await approvals.settle(exc)  # the calls this run claimed get their answers stored
        raise
    raise AssertionError("unreachable: max_tool_iterations >= 1")  # pragma: no cover


async def _open(
    approvals: RunApprovals,
    messages: Sequence[ChatMessage],
    tools: Mapping[str, Tool],
    call_tool: ToolStack,
    invocation: Invocation,
    on_update: OnUpdate | None,
) -> Opening:
    """The run's decisions applied (or what waits refused), their answers streamed."""

    async def run(calls: Sequence[ToolCall], done: Callable[[int, ChatMessage], None]) -> Any:
        return await run_tool_calls(calls, tools, call_tool, invocation, done)

    opening = await approvals.open(messages, invocation.messages, run)
    await _send_results(on_update, opening.answers)
    if not opening.goes_on:
        await _send_pending(on_update, opening.waiting)
    return opening


def _answered_history(options: ChatOptions, added: int) -> ChatOptions:
    """``options`` once ``added`` answers joined the end of the history (its last turn's
    results, stored with the response): the stable prefix grows by them."""
    if not added or options.history_end is None:
        return options
    return attrs.evolve(options, history_end=options.history_end + added)


def _held(
    approvals: RunApprovals | None, calls: Sequence[ToolCall], tools: Mapping[str, Tool]
) -> list[ToolCall]:
    """The calls of a model turn that wait for approval; an error when nothing can keep them."""
    if approvals is not None:
        return approvals.held(calls, tools)
    for call in calls:
        tool = tools.get(call.name)
        if tool is not None and wants_approval(tool):
            raise ApprovalError(
                f"tool {call.name!r} needs approval, but the agent keeps no history: add a "
                "raf.HistoryProvider to its stack (Agent(history=True)), where a paused call waits"
            )
    return []


def runs_on_client(tool: object) -> bool:
    """Whether ``tool`` is the caller's to run (a served agent's client tool), not raf's."""
    return getattr(tool, "runs_on_client", False) is True


async def _send_results(on_update: OnUpdate | None, results: Sequence[ChatMessage]) -> None:
    if on_update is not None:
        for result in results:
            await on_update(Update("tool_result", message=result))


async def _send_pending(on_update: OnUpdate | None, pending: Sequence[PendingCall]) -> None:
    if on_update is not None:
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
