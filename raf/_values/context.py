"""What providers return (ContextResult), what a run carries (Invocation), and merge."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from raf._agent.tools import Tool
from raf._errors import ContextResultError
from raf._sessions.base import Session
from raf._values.messages import ChatMessage, OnUpdate
from raf._values.options import AgentRunOptions

if TYPE_CHECKING:
    from raf._agent.approvals import Decision

__all__ = ["AgentLike", "ContextResult", "Invocation", "merge"]


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


@attrs.frozen(slots=True)
class _StoredHistory(ContextResult):
    """A result whose messages are a session store's own snapshot, already checked.

    raf's stores build their snapshots from checked or decoded messages
    only, so the per-message check of :func:`checked_result` (one pass over
    a history that may hold 100,000 messages) is skipped for it.
    """


def stored_history(messages: tuple[ChatMessage, ...]) -> ContextResult:
    """The result that injects ``messages``, a snapshot from one of raf's own stores."""
    return _StoredHistory(messages=messages)


@attrs.frozen(slots=True)
class Invocation:
    """One run on its way to the model (ASGI's ``scope``).

    ``request_messages`` are the caller's messages; ``instructions``,
    ``messages`` and ``tools`` are what the providers outside this point have
    contributed, in registration order (``tool_sources`` names who offered
    each tool). ``request_hash`` is the digest the session recorded for the
    request messages and ``repeated`` whether the session had seen it before
    (a client's retried turn, for example). ``on_update`` is where a
    streamed run sends its updates (ASGI's ``send``), ``None`` for a run
    that is not streamed; a middleware may wrap it with
    ``attrs.evolve(invocation, on_update=...)``. ``decisions`` are the
    :class:`raf.Decision` objects of a run that resumes paused tool calls
    (its request messages are then empty). Immutable: a layer passes an
    evolved copy inward (see :func:`merge`).
    """

    agent: AgentLike | None
    session: Session
    request_messages: tuple[ChatMessage, ...]
    options: AgentRunOptions
    instructions: tuple[str, ...] = ()
    messages: Sequence[ChatMessage] = ()
    tools: tuple[Tool, ...] = ()
    request_hash: str | None = attrs.field(default=None, kw_only=True)
    repeated: bool = attrs.field(default=False, kw_only=True)
    tool_sources: tuple[str, ...] = attrs.field(default=(), kw_only=True, repr=False)
    on_update: OnUpdate | None = attrs.field(default=None, kw_only=True, repr=False)
    decisions: tuple[Decision, ...] = attrs.field(default=(), kw_only=True)


def merge(
    invocation: Invocation, result: ContextResult, *, source: str = "a provider"
) -> Invocation:
    """Apply one provider's result to an invocation.

    Instructions and tools are appended; messages are appended, or replace
    the injected messages when ``result.replace_messages`` is true. The
    request messages are never touched. An empty result returns
    ``invocation`` itself, so a provider with nothing to say costs no copy.
    A field of the wrong type raises :class:`raf.ContextResultError`
    naming the field. ``source`` names the provider, for the error of a
    tool-name clash.

    >>> from raf import InMemorySession, AgentRunOptions
    >>> start = Invocation(None, InMemorySession(), (), AgentRunOptions())
    >>> merge(start, ContextResult()) is start
    True
    >>> merge(start, ContextResult(instructions="Be brief.")).instructions
    ('Be brief.',)
    """
    if (
        type(result) is ContextResult
        and result.messages == ()
        and result.tools == ()
        and result.replace_messages is False
    ):
        # Instructions alone, the commonest result: one copy, no further checks.
        text = result.instructions
        if text is None or text == "":
            return invocation
        if type(text) is str:
            return _copy(
                invocation,
                (*invocation.instructions, text),
                invocation.messages,
                invocation.tools,
                invocation.tool_sources,
            )
    text, messages, tools, replace = checked_result(result)
    if not (text or messages or tools or replace):
        return invocation
    injected = invocation.messages
    if replace:
        injected = messages
    elif messages:
        # `+` of two tuples copies each once (and `() + t` is `t`); `(*a, *b)` builds a
        # list, then copies that: a long history injected after other messages costs double.
        joined = type(injected) is tuple and type(messages) is tuple
        injected = injected + messages if joined else (*injected, *messages)
    if tools:
        all_tools = (*invocation.tools, *tools)
        sources = (*invocation.tool_sources, *(source,) * len(tools))
    else:
        all_tools, sources = invocation.tools, invocation.tool_sources
    return _copy(
        invocation,
        (*invocation.instructions, text) if text else invocation.instructions,
        injected,
        all_tools,
        sources,
    )


def start_invocation(
    agent: AgentLike | None,
    session: Session,
    request_messages: tuple[ChatMessage, ...],
    options: AgentRunOptions,
    request_hash: str | None,
    repeated: bool,
    on_update: OnUpdate | None,
    decisions: tuple[Decision, ...] = (),
) -> Invocation:
    """A run's first invocation, nothing contributed yet."""
    return Invocation(
        agent,
        session,
        request_messages,
        options,
        request_hash=request_hash,
        repeated=repeated,
        on_update=on_update,
        decisions=decisions,
    )


# merge() copies an invocation once per provider with something to say: the copy is
# the per-provider cost of a run. Setting the slots directly skips the generated
# __init__ (keyword arguments and a bound __setattr__ per field), which has no validator
# or converter to run. A benchmark row needs it (benchmarks/bench_pipeline.py): through
# Invocation(...) run/10 providers is 15 % slower and run/50 providers 20 %; through
# attrs.evolve (2 us a copy) far more. The check below fails at import when a field is
# added to Invocation and not here.
_FIELDS = (
    "agent",
    "session",
    "request_messages",
    "options",
    "instructions",
    "messages",
    "tools",
    "request_hash",
    "repeated",
    "tool_sources",
    "on_update",
    "decisions",
)
if tuple(field.name for field in attrs.fields(Invocation)) != _FIELDS:  # pragma: no cover
    raise AssertionError("raf._values.context._copy does not set every field of Invocation")
(
    _set_agent,
    _set_session,
    _set_request,
    _set_options,
    _set_instructions,
    _set_messages,
    _set_tools,
    _set_hash,
    _set_repeated,
    _set_sources,
    _set_on_update,
    _set_decisions,
) = (vars(Invocation)[name].__set__ for name in _FIELDS)
_new = object.__new__


def _copy(
    invocation: Invocation,
    instructions: tuple[str, ...],
    messages: Sequence[ChatMessage],
    tools: tuple[Tool, ...],
    sources: tuple[str, ...],
) -> Invocation:
    """``invocation`` with what the providers contributed replaced, the rest shared."""
    copy: Invocation = _new(Invocation)
    _set_agent(copy, invocation.agent)
    _set_session(copy, invocation.session)
    _set_request(copy, invocation.request_messages)
    _set_options(copy, invocation.options)
    _set_instructions(copy, instructions)
    _set_messages(copy, messages)
    _set_tools(copy, tools)
    _set_hash(copy, invocation.request_hash)
    _set_repeated(copy, invocation.repeated)
    _set_sources(copy, sources)
    _set_on_update(copy, invocation.on_update)
    _set_decisions(copy, invocation.decisions)
    return copy


#: ``(instructions, messages, tools, replace_messages)`` of a result that passed the checks.
CheckedResult = tuple[str | None, Any, tuple[Tool, ...], bool]


def checked_result(result: object) -> CheckedResult:
    """A result's ``(instructions, messages, tools, replace_messages)``, each type-checked.

    Raises :class:`raf.ContextResultError` naming the first wrong
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
    if messages != () and type(result) is not _StoredHistory:
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
