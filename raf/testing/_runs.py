"""The simulated runs of check_provider: their data, what a stage may not touch, how
two observations of runs differ."""

from __future__ import annotations

import contextvars
import copy
import json
import types
from collections.abc import Awaitable, Generator, Iterable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import attrs

from raf._sessions.memory import InMemorySession
from raf._values.messages import AgentResponse, ChatMessage, ToolCall
from raf._values.options import AgentRunOptions

__all__: list[str] = []


class _Broken(AssertionError):
    """A rule the provider broke, with what happened."""

    def __init__(self, rule: str, detail: str) -> None:
        super().__init__(rule, detail)
        self.rule = rule
        self.detail = detail


# The simulated runs --------------------------------------------------------------------


@attrs.frozen
class _RunSpec:
    """One simulated run: its key, the session's history, the request, options and answer."""

    key: str
    history: tuple[ChatMessage, ...]
    request: tuple[ChatMessage, ...]
    model: str
    extra: dict[str, Any]
    tool_choice: Any
    response: AgentResponse


_CALL_A = ToolCall("call_alpha", "lookup", '{"project": "alpha"}')
_CALL_B = ToolCall("call_bravo", "lookup", '{"project": "bravo"}')

_RUNS = (
    _RunSpec(
        "A",
        history=(
            ChatMessage.user("Earlier in session A: when does project alpha ship?"),
            ChatMessage.assistant("Alpha ships in May."),
        ),
        request=(ChatMessage.user("What does alpha cost? Answer for session A."),),
        model="model-a",
        extra={"user": "ann", "tags": ["alpha"]},
        tool_choice="auto",
        response=AgentResponse(
            (
                ChatMessage.assistant(None, tool_calls=[_CALL_A]),
                ChatMessage.tool("call_alpha", "alpha: 3 units", name="lookup"),
                ChatMessage.assistant("Alpha costs 3 units."),
            )
        ),
    ),
    _RunSpec(
        "B",
        history=(
            ChatMessage.system("Session B speaks French."),
            ChatMessage.user("Quand sort le projet bravo ?"),
            ChatMessage.assistant(None, tool_calls=[_CALL_B]),
            ChatMessage.tool("call_bravo", "bravo: juin", name="lookup"),
            ChatMessage.assistant("Bravo sort en juin."),
        ),
        request=(
            ChatMessage.user("Et combien coûte bravo ? (session B)", name="bob"),
            ChatMessage.user("Réponds en une phrase."),
        ),
        model="model-b",
        extra={"user": "bob", "budget": {"max": 5}},
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        response=AgentResponse((ChatMessage.assistant("Bravo coûte 5 unités."),)),
    ),
)


def _options(spec: _RunSpec) -> AgentRunOptions:
    """The run's options, with ``extra`` a plain dict a stage could write to (and be caught)."""
    options = AgentRunOptions(model=spec.model, temperature=0.2, tool_choice=spec.tool_choice)
    # AgentRunOptions freezes extra into a read-only view; the check hands a writable
    # dict on purpose, to see whether the provider writes to it.
    object.__setattr__(options, "extra", copy.deepcopy(spec.extra))
    return options


class _YieldingSession(InMemorySession):
    """An InMemorySession that lets other tasks run in every call, as a remote store would."""

    async def get_messages(self) -> tuple[ChatMessage, ...]:
        await anyio.lowlevel.checkpoint()
        messages = await super().get_messages()
        await anyio.lowlevel.checkpoint()
        return messages

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None:
        await anyio.lowlevel.checkpoint()
        await super().add_messages(messages)
        await anyio.lowlevel.checkpoint()


@attrs.define
class _Run:
    """One simulated run in progress: its arguments, and what its stages did."""

    spec: _RunSpec
    session: InMemorySession
    messages: list[ChatMessage]
    options: AgentRunOptions
    originals: tuple[ChatMessage, ...] = ()
    snapshot: tuple[ChatMessage, ...] = ()
    options_before: dict[str, Any] = attrs.Factory(dict)
    option_ids: dict[str, int] = attrs.Factory(dict)
    result: Any = None
    post_error: str | None = None
    #: The run's own context: its stages see its context variables, as the stages of a
    #: real run (one task) do, however the battery interleaves them with other runs'.
    context: contextvars.Context = attrs.Factory(contextvars.copy_context)


async def _new_run(spec: _RunSpec, *, yielding: bool = False) -> _Run:
    session = (_YieldingSession if yielding else InMemorySession)(f"check-{spec.key}")
    await InMemorySession.add_messages(session, spec.history)
    options = _options(spec)
    # Copies: a stage that changes a message in place must not change the next runs'.
    run = _Run(spec, session, [attrs.evolve(m) for m in spec.request], options)
    run.originals = tuple(run.messages)
    run.snapshot = tuple(attrs.evolve(m) for m in run.messages)
    run.options_before = {
        field.name: copy.deepcopy(getattr(options, field.name))
        for field in attrs.fields(AgentRunOptions)
    }
    run.option_ids = {
        field.name: id(getattr(options, field.name)) for field in attrs.fields(AgentRunOptions)
    }
    return run


@types.coroutine
def _in_context(
    context: contextvars.Context, awaitable: Awaitable[Any]
) -> Generator[Any, Any, Any]:
    """Await ``awaitable`` with each of its steps run in ``context``.

    What the event loop sees passes through unchanged (so it works on any
    backend); only the context the stage's code runs in is ``context``.
    """
    steps = awaitable.__await__()
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            if error is not None:
                yielded = context.run(steps.throw, error)
            else:
                yielded = context.run(steps.send, value)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        try:
            value = yield yielded
        except BaseException as exc:
            error = exc


def _short(value: object, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_untouched(run: _Run, stage: str) -> None:
    """Raise the no-mutation rule if ``stage`` changed the messages or options of ``run``."""
    messages = run.messages
    if len(messages) != len(run.originals) or any(
        now is not then or now != then for now, then in zip(messages, run.originals, strict=False)
    ):
        raise _Broken(
            "no-mutation",
            f"{stage} changed the request messages it was given: they were "
            f"{_short(list(run.spec.request))}, afterwards they are {_short(messages)}",
        )
    if tuple(messages) != run.snapshot:
        raise _Broken(
            "no-mutation",
            f"{stage} changed a request message in place: {_short(messages)}",
        )
    for name, before in run.options_before.items():
        now = getattr(run.options, name)
        if now != before or id(now) != run.option_ids[name]:
            raise _Broken(
                "no-mutation",
                f"{stage} changed options.{name}: it was {_short(before)}, "
                f"afterwards it is {_short(now)}",
            )


def _describe_order(order: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{stage} {_RUNS[index].key}" for stage, index in order)


def _normalized(result: Any) -> Any:
    """A ContextResult as plain values (tools by name, description and schema)."""
    if result is None:
        return None
    tools = []
    for item in result.tools:
        try:
            schema = json.dumps(getattr(item, "parameters", None), sort_keys=True, default=repr)
        except (TypeError, ValueError):
            schema = repr(getattr(item, "parameters", None))
        tools.append((item.name, getattr(item, "description", None), schema))
    return (result.instructions, tuple(result.messages), tuple(tools), result.replace_messages)


def _difference_one(got: Any, reference: Any, again: Any, parts: list[str]) -> str | None:
    """What differs between one run's observation and its reference, where it is stable."""
    result, history, error = got
    ref_result, ref_history, ref_error = reference
    again_result, again_history, again_error = again
    if "pre" in parts and ref_result == again_result and result != ref_result:
        return f"on_invoking returned {_short(result)} instead of {_short(ref_result)}"
    if "post" in parts:
        if ref_error == again_error and error != ref_error:
            return f"on_invoked raised {error} (one run at a time: {ref_error})"
        if ref_history == again_history and history != ref_history:
            start = next(
                (i for i, (a, b) in enumerate(zip(history, ref_history, strict=False)) if a != b),
                min(len(history), len(ref_history)),
            )
            return (
                f"the session holds {_lines(history[start:])} after message {start}, "
                f"instead of {_lines(ref_history[start:])}"
            )
    return None


def _lines(messages: Sequence[ChatMessage]) -> str:
    return _short([f"{m.role}: {m.content}" for m in messages]) if messages else "nothing"


def _difference(got: Any, reference: Any, again: Any, parts: list[str]) -> str | None:
    for index, spec in enumerate(_RUNS):
        difference = _difference_one(got[index], reference[index], again[index], parts)
        if difference is not None:
            return f"run {spec.key}: {difference} (as when the runs come one after the other)"
    return None
