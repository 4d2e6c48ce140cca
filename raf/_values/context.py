"""What providers return (ContextResult), what a run carries (Invocation), and merge;
what a model call and a tool call carry through their stacks (ChatRequest, ToolRequest)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import countOf
from typing import Any, Protocol, runtime_checkable

import attrs

from raf._values.decision import Decision
from raf._values.messages import ChatMessage, OnUpdate, ToolCall
from raf._values.options import AgentRunOptions, ChatOptions
from raf._values.protocols import Session, Tool
from raf._values.run import Run
from raf.errors import ContextResultError

__all__ = [
    "AgentLike",
    "ChatRequest",
    "ContextProviderLike",
    "ContextResult",
    "Invocation",
    "ToolRequest",
    "merge",
]


class AgentLike(Protocol):
    """What providers and middleware may see of the agent running them.

    :class:`raf.Agent` is one; ``Invocation.agent`` is ``None`` for a stack
    composed and run without an agent.
    """

    @property
    def name(self) -> str | None:
        """The agent's name, if it was given one."""
        ...

    @property
    def instructions(self) -> str | None:
        """The agent's own instructions (the first lines of the system message)."""
        ...

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The agent's own tools (providers' tools come on top)."""
        ...


@runtime_checkable
class ContextProviderLike(Protocol):
    """What the run stack accepts as a provider: anything with ``on_invoking``.

    ``on_invoked``, ``name`` and ``kind`` are optional; a missing
    ``on_invoked`` means the provider has no post stage.
    """

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult: ...


@attrs.frozen(slots=True)
class ContextResult:
    """What a provider's ``on_invoking`` adds to a run.

    ``instructions`` is appended to the system prompt (``None`` or ``""``
    adds nothing); ``messages`` are appended to the messages injected so far,
    or replace them when ``replace_messages`` is true (compression); ``tools``
    are offered to the model after those of the agent and earlier providers.

    ``volatile`` marks content that changes from turn to turn (retrieved
    passages, the time, live state): its instructions and messages go to the
    *tail*, after the history and before the request messages, and are never
    stored, so the stable prefix the provider caches stays put. A volatile
    result cannot replace the history (``replace_messages``).

    >>> ContextResult(instructions="Answer in French.")  # doctest: +NORMALIZE_WHITESPACE
    ContextResult(instructions='Answer in French.', messages=(), tools=(),
                  replace_messages=False, volatile=False)
    """

    instructions: str | None = None
    messages: Sequence[ChatMessage] = ()
    tools: Sequence[Tool] = ()
    replace_messages: bool = False
    volatile: bool = False


#: Who contributed a run of messages: ``(provider name, how many)``, in order.
Segments = tuple[tuple[str, int], ...]


@attrs.frozen(slots=True)
class Invocation:
    """One run on its way to the model (ASGI's ``scope``).

    ``request_messages`` are the caller's messages; ``instructions``,
    ``messages`` and ``tools`` are what the providers outside this point have
    contributed, in registration order (``tool_sources`` names who offered
    each tool, ``instruction_sources`` each instruction, ``message_sources``
    the messages as runs of ``(provider, count)``; the ``tail_`` ones the
    same for the tail: what :class:`raf.observe.ContextLedger` reads to say which
    layer cost what); ``tail_instructions`` and ``tail_messages`` what they
    contributed as volatile results (the tail: after the history, before the
    request messages, never stored). ``request_hash`` is the digest the session recorded for the
    request messages and ``repeated`` whether the session had seen it before
    (a client's retried turn, for example). ``on_update`` is where a
    streamed run sends its updates (ASGI's ``send``), ``None`` for a run
    that is not streamed; a middleware may wrap it with
    ``attrs.evolve(invocation, on_update=...)``. ``decisions`` are the
    :class:`raf.Decision` objects of a run that resumes paused tool calls
    (its request messages are then empty). ``run`` is the run's own
    :class:`raf.Run`, the same object in every layer's copy: its sink and
    early close, and the post stages that failed. Immutable: a layer passes
    an evolved copy inward (see :func:`merge`).
    """

    agent: AgentLike | None
    session: Session
    request_messages: tuple[ChatMessage, ...]
    options: AgentRunOptions
    instructions: tuple[str, ...] = ()
    messages: Sequence[ChatMessage] = ()
    tools: tuple[Tool, ...] = ()
    tail_instructions: tuple[str, ...] = attrs.field(default=(), kw_only=True)
    tail_messages: tuple[ChatMessage, ...] = attrs.field(default=(), kw_only=True)
    request_hash: str | None = attrs.field(default=None, kw_only=True)
    repeated: bool = attrs.field(default=False, kw_only=True)
    tool_sources: tuple[str, ...] = attrs.field(default=(), kw_only=True, repr=False)
    instruction_sources: tuple[str, ...] = attrs.field(default=(), kw_only=True, repr=False)
    message_sources: Segments = attrs.field(default=(), kw_only=True, repr=False)
    tail_sources: tuple[str, ...] = attrs.field(default=(), kw_only=True, repr=False)
    tail_message_sources: Segments = attrs.field(default=(), kw_only=True, repr=False)
    on_update: OnUpdate | None = attrs.field(default=None, kw_only=True, repr=False)
    decisions: tuple[Decision, ...] = attrs.field(default=(), kw_only=True)
    run: Run = attrs.field(factory=Run, kw_only=True, repr=False, eq=False)


@attrs.frozen(slots=True)
class ChatRequest:
    """One model call on its way through the chat stack.

    ``on_update`` is where the call's updates go in a streamed run (``None``
    otherwise); a chat middleware may wrap it to see them, with
    ``attrs.evolve(request, on_update=...)``. ``invocation`` is the run the
    call belongs to (``None`` for a call made outside a run): who
    contributed which part of the messages and tools.
    """

    messages: Sequence[ChatMessage]
    options: ChatOptions
    on_update: OnUpdate | None = attrs.field(default=None, repr=False)
    invocation: Invocation | None = attrs.field(default=None, kw_only=True, repr=False, eq=False)


@attrs.frozen(slots=True)
class ToolRequest:
    """One tool call on its way through the tool stack (``Agent(tool_stack=[...])``).

    ``call`` is the model's call as it came; ``tool`` the tool it names;
    ``arguments`` the call's arguments parsed from JSON (always a JSON
    object, so a ``dict``), **not yet checked against the tool's schema**:
    the check is the first step of the innermost point, just before
    ``tool.invoke``, so arguments that a middleware rewrites (with
    ``attrs.evolve(request, arguments=...)``) are checked too. A middleware
    that must see only valid arguments calls
    ``raf.check_tool_arguments(request.tool, request.arguments)`` itself.
    ``invocation`` is the run the call belongs to (its session, options,
    agent).

    A call that names no known tool, or whose arguments are not a JSON
    object, never reaches the tool stack: there is no tool (or no
    arguments) to hand it, and the model is told at once.
    """

    call: ToolCall
    tool: Tool
    arguments: Mapping[str, Any]
    invocation: Invocation = attrs.field(repr=False)

    def reply(self, text: str) -> ChatMessage:
        """The tool message that answers this call with ``text``, without running the tool.

        What a middleware returns to refuse or short-cut a call: the model
        reads ``text`` as the tool's result.
        """
        return ChatMessage.tool(self.call.id, text, name=self.call.name)


def merge(
    invocation: Invocation, result: ContextResult, *, source: str = "a provider"
) -> Invocation:
    """Apply one provider's result to an invocation.

    Instructions and tools are appended; messages are appended, or replace
    the injected messages when ``result.replace_messages`` is true; a
    volatile result's instructions and messages are appended to the tail
    instead (``tail_instructions``, ``tail_messages``). The request messages
    are never touched. An empty result returns
    ``invocation`` itself, so a provider with nothing to say costs no copy.
    A field of the wrong type raises :class:`raf.errors.ContextResultError`
    naming the field. ``source`` names the provider, for the error of a
    tool-name clash.

    >>> from raf import InMemorySession, AgentRunOptions
    >>> start = Invocation(None, InMemorySession(), (), AgentRunOptions())
    >>> merge(start, ContextResult()) is start
    True
    >>> merge(start, ContextResult(instructions="Be brief.")).instructions
    ('Be brief.',)
    """
    text, messages, tools, replace, volatile = checked_result(result)
    if not (text or messages or tools or replace):
        return invocation
    # Built once, every field named: attrs.evolve would look each field up by name.
    instructions, instruction_sources = invocation.instructions, invocation.instruction_sources
    tail_instructions, tail_sources = invocation.tail_instructions, invocation.tail_sources
    injected, sources = invocation.messages, invocation.message_sources
    tail, tail_message_sources = invocation.tail_messages, invocation.tail_message_sources
    if volatile:
        if text:
            tail_instructions, tail_sources = (*tail_instructions, text), (*tail_sources, source)
        if messages:
            tail = tail + messages
            tail_message_sources = (*tail_message_sources, (source, len(messages)))
    else:
        if text:
            instructions = (*instructions, text)
            instruction_sources = (*instruction_sources, source)
        if replace:
            injected, sources = messages, ()
        if messages:
            # `+` of tuples copies each once; `(*a, *b)` builds a list and then copies that.
            injected = messages if replace else tuple(injected) + messages
            sources = (*sources, (source, len(messages)))
    tool_sources = invocation.tool_sources
    if tools:
        tool_sources = (*tool_sources, *(source,) * len(tools))
    return Invocation(
        invocation.agent,
        invocation.session,
        invocation.request_messages,
        invocation.options,
        instructions,
        injected,
        (*invocation.tools, *tools) if tools else invocation.tools,
        tail_instructions=tail_instructions,
        tail_messages=tail,
        request_hash=invocation.request_hash,
        repeated=invocation.repeated,
        tool_sources=tool_sources,
        instruction_sources=instruction_sources,
        message_sources=sources,
        tail_sources=tail_sources,
        tail_message_sources=tail_message_sources,
        on_update=invocation.on_update,
        decisions=invocation.decisions,
        run=invocation.run,
    )


def start_invocation(
    agent: AgentLike | None,
    session: Session,
    request_messages: tuple[ChatMessage, ...],
    options: AgentRunOptions,
    request_hash: str | None,
    repeated: bool,
    run: Run,
    decisions: tuple[Decision, ...] = (),
) -> Invocation:
    """A run's first invocation, nothing contributed yet: its ``on_update`` is the run's
    :meth:`Run.send` when the run is streamed."""
    return Invocation(
        agent,
        session,
        request_messages,
        options,
        request_hash=request_hash,
        repeated=repeated,
        on_update=run.send if run.sink is not None else None,
        decisions=decisions,
        run=run,
    )


#: ``(instructions, messages, tools, replace_messages, volatile)`` of a result that passed
#: the checks.
CheckedResult = tuple[str | None, Any, tuple[Tool, ...], bool, bool]


def checked_result(result: object) -> CheckedResult:
    """A result's ``(instructions, messages, tools, replace_messages, volatile)``, each
    type-checked.

    Raises :class:`raf.errors.ContextResultError` naming the first wrong
    field. ``messages`` comes back as a checked tuple.
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
    volatile = result.volatile
    if volatile is not False:
        if volatile is not True:
            raise ContextResultError("volatile", "bool", volatile)
        if replace:
            # The tail is never stored: a volatile history would vanish after the turn.
            raise ContextResultError(
                "volatile",
                "False when replace_messages is true (the tail cannot replace the history)",
                volatile,
            )
    if messages != ():
        messages = _checked_messages(messages)
    if tools != ():
        tools = _checked_tools(tools)
    return instructions, messages, tools, replace, volatile


def _checked_messages(value: object) -> tuple[ChatMessage, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ContextResultError("messages", "a sequence of ChatMessage", value)
    messages = tuple(value)
    # A long history's types are counted in C; the index of the first wrong one is
    # looked for only when there is one.
    if countOf(map(type, messages), ChatMessage) != len(messages):
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
