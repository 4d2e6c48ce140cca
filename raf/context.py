"""What providers return (ContextResult), what a run carries (Invocation), and merge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from raf.errors import ContextResultError
from raf.messages import ChatMessage, Messages, join_messages
from raf.options import AgentRunOptions
from raf.sessions.base import Session
from raf.tools import Tool

if TYPE_CHECKING:
    from raf.agent import Agent

__all__ = ["EMPTY_RESULT", "CheckedResult", "ContextResult", "Invocation", "merge", "merge_all"]


@attrs.frozen(slots=True)
class ContextResult:
    """What a provider's ``on_invoking`` adds to a run.

    ``instructions`` is appended to the system prompt (``None`` or ``""``
    adds nothing); ``messages`` are appended to the messages injected so far,
    or replace them when ``replace_messages`` is true (compression); ``tools``
    are offered to the model after those of the agent and earlier providers.

    >>> ContextResult(instructions="Answer in French.")
    ContextResult(instructions='Answer in French.', messages=(), tools=(), replace_messages=False)
    """

    instructions: str | None = None
    messages: Sequence[ChatMessage] = ()
    tools: Sequence[Tool] = ()
    replace_messages: bool = False


#: The result that changes nothing; what ``ContextProvider.on_invoking`` returns by default.
EMPTY_RESULT: Final = ContextResult()


@attrs.frozen(slots=True)
class Invocation:
    """One run on its way to the model (ASGI's ``scope``).

    ``request_messages`` are the caller's messages; ``instructions``,
    ``messages`` and ``tools`` are what the providers outside this point have
    contributed, in registration order. Immutable: a layer passes an evolved
    copy inward (see :func:`merge`).
    """

    agent: Agent | None
    session: Session
    request_messages: tuple[ChatMessage, ...]
    options: AgentRunOptions
    instructions: tuple[str, ...] = ()
    messages: Sequence[ChatMessage] = ()
    tools: tuple[Tool, ...] = ()


def merge(invocation: Invocation, result: ContextResult) -> Invocation:
    """Apply one provider's result to an invocation.

    Instructions and tools are appended; messages are appended, or replace
    the injected messages when ``result.replace_messages`` is true. The
    request messages are never touched. An empty result returns
    ``invocation`` itself, so a provider with nothing to say costs no copy.
    A field of the wrong type raises :class:`raf.errors.ContextResultError`
    naming the field.

    >>> from raf import InMemorySession, AgentRunOptions
    >>> start = Invocation(None, InMemorySession(), (), AgentRunOptions())
    >>> merge(start, ContextResult()) is start
    True
    >>> merge(start, ContextResult(instructions="Be brief.")).instructions
    ('Be brief.',)
    """
    return merge_all(invocation, (checked_result(result),))


#: ``(instructions, messages, tools, replace_messages)`` of a result that passed the checks.
CheckedResult = tuple[str | None, Any, tuple[Tool, ...], bool]


def merge_all(invocation: Invocation, results: Sequence[CheckedResult]) -> Invocation:
    """Apply several checked results in order, building one invocation instead of one each.

    Equal to folding :func:`merge` over the results (and, like it, returns
    ``invocation`` itself when they add nothing); the provider layer uses
    it for consecutive providers, which see the same arguments anyway.

    >>> from raf import InMemorySession, AgentRunOptions
    >>> start = Invocation(None, InMemorySession(), (), AgentRunOptions())
    >>> parts = [checked_result(ContextResult(instructions=t)) for t in ("A.", "B.")]
    >>> merge_all(start, parts).instructions
    ('A.', 'B.')
    """
    instructions: list[str] = []
    base = invocation.messages
    chunks: list[tuple[ChatMessage, ...]] = []
    tools: list[Tool] = []
    replaced = False
    for text, messages, more_tools, replace in results:
        if text:
            instructions.append(text)
        if replace:
            base, replaced = messages, True
            chunks.clear()
        elif messages:
            chunks.append(messages)
        if more_tools:
            tools.extend(more_tools)
    if not (instructions or chunks or tools or replaced):
        return invocation
    if not chunks:
        injected = base
    elif not base and len(chunks) == 1:
        injected = chunks[0]
    else:
        injected = join_messages(base, *chunks)
    return Invocation(
        invocation.agent,
        invocation.session,
        invocation.request_messages,
        invocation.options,
        invocation.instructions + tuple(instructions) if instructions else invocation.instructions,
        injected,
        invocation.tools + tuple(tools) if tools else invocation.tools,
    )


def checked_result(result: object) -> CheckedResult:
    """A result's ``(instructions, messages, tools, replace_messages)``, each type-checked.

    Raises :class:`raf.errors.ContextResultError` naming the first wrong
    field. ``messages`` comes back as given when it is already
    :class:`raf.Messages` (checked when it was built), else as a checked tuple.
    """
    if type(result) is not ContextResult and not isinstance(result, ContextResult):
        hint = " (did on_invoking forget to return?)" if result is None else ""
        raise ContextResultError("result", "a ContextResult" + hint, result)
    instructions = result.instructions
    messages: Any = result.messages
    tools: Any = result.tools
    replace = result.replace_messages
    if instructions is not None and type(instructions) is not str:
        raise ContextResultError("instructions", "str or None", instructions)
    if replace is not False and replace is not True:
        raise ContextResultError("replace_messages", "bool", replace)
    if messages != () and type(messages) is not Messages:
        messages = _checked_messages(messages)
    if tools != ():
        tools = _checked_tools(tools)
    return instructions, messages, tools, replace


def _checked_messages(value: object) -> tuple[ChatMessage, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ContextResultError("messages", "a sequence of ChatMessage", value)
    messages = tuple(value)
    for index, message in enumerate(messages):
        if type(message) is not ChatMessage:
            raise ContextResultError(f"messages[{index}]", "a ChatMessage", message)
    return messages


def _checked_tools(value: object) -> tuple[Tool, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ContextResultError("tools", "a sequence of Tool", value)
    tools = tuple(value)
    for index, tool in enumerate(tools):
        if type(getattr(tool, "name", None)) is not str or not callable(
            getattr(tool, "invoke", None)
        ):
            raise ContextResultError(
                f"tools[{index}]", "a Tool (with a str name and an invoke method)", tool
            )
    return tools
