"""The tool loop: call the model, run the tools it asks for, call it again."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from raf.errors import ToolConflictError, ToolLoopError
from raf.messages import AgentResponse, ChatMessage, OnUpdate, ToolCall, Update, Usage
from raf.options import ChatOptions
from raf.schema import SchemaError, check_arguments
from raf.streaming import closable
from raf.tools import Tool

__all__: list[str] = []  # internal: the agent's core

ChatCall = Callable[[Sequence[ChatMessage], ChatOptions], Awaitable[AgentResponse]]


def index_tools(
    tools: Sequence[Tool],
    sources: Sequence[str],
    known: Mapping[str, Tool] | None = None,
    *,
    source: str = "a provider",
) -> dict[str, Tool]:
    """Tools by name; a second tool with a taken name is a ToolConflictError.

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
        index[tool.name] = tool
        offered_by[tool.name] = owner
    return index


def _describe_source(source: str) -> str:
    return source if source.startswith(("the agent", "a provider")) else f"provider {source!r}"


async def run_tool_loop(
    chat: ChatCall,
    messages: Sequence[ChatMessage],
    options: ChatOptions,
    tools: Mapping[str, Tool],
    max_model_calls: int,
    on_update: OnUpdate | None = None,
) -> AgentResponse:
    """Call the model until it stops asking for tools, at most ``max_model_calls`` times.

    Returns every message the loop produced (assistant turns, tool results,
    the final answer), the summed usage and the last raw response. In a
    streamed run (``on_update`` set; ``chat`` then streams each call), each
    tool message is sent as a ``"tool_result"`` update once the batch ran.
    """
    produced: list[ChatMessage] = []
    usage: Usage | None = None
    for call_number in range(1, max_model_calls + 1):
        response = await chat(messages, options)
        produced.extend(response.messages)
        if response.usage is not None:
            usage = response.usage if usage is None else usage + response.usage
        calls = response.tool_calls
        if not calls:
            if call_number == 1 and type(response) is AgentResponse:
                return response  # one call, no tools: it already is the run's response
            return AgentResponse(tuple(produced), usage, response.raw)
        if call_number == max_model_calls:
            raise ToolLoopError(max_model_calls, tuple(call.name for call in calls))
        if on_update is None:
            results = await run_tool_calls(calls, tools)
        else:
            # An early close of an iterator-form run cancels the running tools.
            results = await closable(run_tool_calls, calls, tools)
            for result in results:
                await on_update(Update("tool_result", message=result))
        produced.extend(results)
        messages = (*messages, *response.messages, *results)
    raise AssertionError("unreachable: max_model_calls >= 1")  # pragma: no cover


async def run_tool_calls(
    calls: Sequence[ToolCall], tools: Mapping[str, Tool]
) -> tuple[ChatMessage, ...]:
    """Run the calls concurrently; the tool messages come back in call order."""
    if len(calls) == 1:
        return (await _run_one(calls[0], tools),)
    results: list[ChatMessage | None] = [None] * len(calls)
    escaped: list[BaseException] = []

    async def run(index: int, call: ToolCall, scope: anyio.CancelScope) -> None:
        try:
            results[index] = await _run_one(call, tools)
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


async def _run_one(call: ToolCall, tools: Mapping[str, Tool]) -> ChatMessage:
    """One call's tool message; what goes wrong is told to the model, not raised."""
    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return _error(call, f"there is no tool named {call.name!r} (available: {known})")
    try:
        arguments = call.parsed_arguments
    except ValueError as exc:
        return _error(call, f"the arguments of {call.name!r} are not valid JSON ({exc})")
    if not isinstance(arguments, dict):
        return _error(call, f"the arguments of {call.name!r} must be a JSON object")
    try:
        check_arguments(tool.parameters, arguments)
    except SchemaError as exc:
        return _error(call, f"invalid arguments for {call.name!r} at {exc.path}: {exc.problem}")
    try:
        result = await tool.invoke(arguments)
    except Exception as exc:
        return _error(call, f"tool {call.name!r} failed: {type(exc).__name__}: {exc}")
    return ChatMessage.tool(call.id, _as_text(result), name=call.name)


def _error(call: ToolCall, text: str) -> ChatMessage:
    return ChatMessage.tool(call.id, f"Error: {text}", name=call.name)


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except ValueError:  # circular structures
        return repr(result)
