"""Tools a tool-stack middleware answers itself, offered to the model only while they apply.

A middleware in ``Agent(tool_stack=[...])`` may have ``answers`` (the tools it
answers itself, never run by the loop's core) and ``offered_tools(messages)``
(which of them the model is offered with those messages): raf.ToolOutputLimit
offers ``read_tool_result`` while a result it cut is in view. The agent knows
the answered tools by name from the start (a call to one reaches the stack),
and adds the offered ones to each model call's tools; it imports no middleware.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from raf._values.messages import ChatMessage
from raf._values.options import ChatOptions
from raf._values.protocols import Tool

__all__: list[str] = []


def offering(tool_stack: Sequence[Any]) -> tuple[Any, ...]:
    """The items of ``tool_stack`` that offer tools of their own."""
    return tuple(item for item in tool_stack if callable(getattr(item, "offered_tools", None)))


def answered_tools(offerers: Sequence[Any]) -> tuple[Tool, ...]:
    """The tools ``offerers`` answer, each once (two limits share one read tool)."""
    found: list[Tool] = []
    for item in offerers:
        for tool in getattr(item, "answers", ()):
            if not any(tool is known for known in found):
                found.append(tool)
    return tuple(found)


def with_offered(
    offerers: Sequence[Any], messages: Sequence[ChatMessage], options: ChatOptions
) -> ChatOptions:
    """``options`` with the tools ``offerers`` offer for ``messages`` after its own (the
    same options when they offer none, or only tools already there)."""
    added: list[Tool] = []
    for item in offerers:
        for tool in item.offered_tools(messages):
            if not any(tool is known for known in (*options.tools, *added)):
                added.append(tool)
    return attrs.evolve(options, tools=(*options.tools, *added)) if added else options
