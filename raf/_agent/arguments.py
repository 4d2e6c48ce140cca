"""The arguments of an agent and of its runs, checked: mistakes caught where they are made."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import attrs

from raf._agent.output import output_spec
from raf._onion.compose import is_provider
from raf._sessions.history import HistoryProvider
from raf._sessions.memory import InMemorySession
from raf._values.decision import Decision
from raf._values.messages import ChatMessage, checked_messages
from raf._values.options import AgentRunOptions
from raf._values.protocols import Session, Tool, keeps_history

_DEFAULT_OPTIONS = AgentRunOptions()


def middleware_only(items: Iterable[Any], where: str) -> tuple[Any, ...]:
    """The chat or tool stack, checked: middleware callables, nothing else."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"{where} must be a list of middleware, got {items!r}")
    checked = tuple(items)
    for index, item in enumerate(checked):
        if is_provider(item) or not callable(item) or isinstance(item, type):
            raise TypeError(
                f"{where}[{index}] must be middleware (async (request, call_next)); "
                f"context providers go in stack: {item!r}"
            )
    return checked


def with_history(stack: Sequence[Any]) -> tuple[Any, ...]:
    """``stack`` with a :class:`raf.HistoryProvider` outermost (``Agent(history=True)``)."""
    for index, item in enumerate(stack):
        if getattr(item, "kind", None) == "memory":
            raise TypeError(
                f"history=True adds a history provider, but stack[{index}] is one already "
                f"({item!r}): drop one of the two"
            )
    return (HistoryProvider(), *stack)


def stack_keeps_history(stack: Sequence[Any]) -> bool:
    """Whether an item of the stack (or of one of its groups) keeps the history: a
    :class:`raf._values.protocols.HistoryKeeper`, such as :class:`raf.HistoryProvider`."""
    for item in stack:
        if keeps_history(item):
            return True
        members = getattr(item, "members", None)
        if isinstance(members, tuple) and stack_keeps_history(members):
            return True
    return False


def decisions_of(messages: object) -> tuple[Decision, ...]:
    """The decisions of a run that resumes paused calls; ``()`` for a run of messages."""
    if type(messages) is Decision:
        return (messages,)
    # Only a sequence that starts with a decision is looked through (a long history passed
    # as the input costs nothing here); one that starts with a message is checked, item by
    # item, as messages.
    if (
        isinstance(messages, Sequence)
        and not isinstance(messages, (str, bytes))
        and messages
        and type(messages[0]) is Decision
    ):
        if all(type(item) is Decision for item in messages):
            return tuple(messages)
        raise TypeError(
            "run(messages) takes messages or decisions, not both: send the decisions first, "
            "then the new message"
        )
    return ()


def run_arguments(
    messages: str | ChatMessage | Sequence[ChatMessage],
    session: Session | None,
    options: AgentRunOptions | None,
    output_type: Any = None,
    output_retries: int | None = None,
) -> tuple[tuple[ChatMessage, ...], Session, AgentRunOptions]:
    """A turn's request messages, session and options, checked (``run`` and ``stream``);
    ``output_type`` and ``output_retries``, when given, go into the options."""
    request = request_messages(messages)
    if session is None:
        session = InMemorySession()
    else:
        _check_session(session)
    if options is None:
        options = _DEFAULT_OPTIONS
    elif type(options) is not AgentRunOptions:
        raise TypeError(f"options must be AgentRunOptions, got {type(options).__name__}")
    if output_type is not None or output_retries is not None:
        changes: dict[str, Any] = {}
        if output_type is not None:
            changes["output_type"] = output_type
        if output_retries is not None:
            changes["output_retries"] = output_retries
        options = attrs.evolve(options, **changes)
    if options.output_type is not None:
        output_spec(options.output_type)  # a type without a schema is refused before the run
    return request, session, options


def _check_session(session: object) -> None:
    missing = [
        name
        for name in ("get_messages", "add_messages", "touch_request_hash", "request_hashes")
        if not callable(getattr(session, name, None))
    ]
    if missing or isinstance(session, (str, bytes)):
        raise TypeError(
            f"session must be a Session (raf.InMemorySession(), or 'await store.get(id)' of a "
            f"session store), got {type(session).__name__} {session!r:.60}"
        )


def checked_tools(tools: Iterable[Tool]) -> tuple[Tool, ...]:
    if isinstance(tools, (str, bytes)) or callable(tools):
        raise TypeError(f"tools must be a list of tools, got {tools!r}")
    checked = tuple(tools)
    for index, item in enumerate(checked):
        if not isinstance(getattr(item, "name", None), str) or not callable(
            getattr(item, "invoke", None)
        ):
            hint = (
                " (a plain function: decorate it with @raf.tool to make a tool of it)"
                if callable(item)
                else ""
            )
            raise TypeError(f"tools[{index}] is not a Tool: {item!r}{hint}")
    return checked


def request_messages(
    messages: str | ChatMessage | Sequence[ChatMessage],
) -> tuple[ChatMessage, ...]:
    if isinstance(messages, str):
        return (ChatMessage("user", messages),)
    if type(messages) is ChatMessage:
        return (messages,)
    if isinstance(messages, Sequence):
        return checked_messages(cast("Sequence[ChatMessage]", messages), "run(messages)")
    raise TypeError(
        "run(messages) takes a str, a ChatMessage or a sequence of ChatMessage, "
        f"got {type(messages).__name__}"
    )
