"""Hypothesis strategies for raf: messages, context results, and whole run scenarios.

A :class:`Scenario` is a random stack of journaling providers, parallel
groups and run middleware plus a random way for the run to end (success, a
failing pre stage, a failing model, a cancellation, a BaseException from the
model, failing post stages). :func:`expected_journal` is the simple
model the real pipeline is checked against, in the style of pluggy's
journal tests.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Literal

import anyio
import anyio.lowlevel
import attrs
from hypothesis import strategies as st

from raf import (
    AgentResponse,
    ChatMessage,
    ContextProvider,
    ContextResult,
    FunctionTool,
    Invocation,
    ToolCall,
    Update,
    Usage,
    parallel,
    tool,
)

texts = st.text(alphabet="abcdefgh xyz\n", max_size=12)

roles = st.sampled_from(["user", "assistant", "system"])


@st.composite
def chat_messages(draw: st.DrawFn) -> ChatMessage:
    """A plain chat message (no tool traffic)."""
    return ChatMessage(draw(roles), draw(st.none() | texts))


def make_tool(name: str) -> FunctionTool:
    """A tool named ``name`` that echoes its argument."""

    def echo(text: str = "") -> str:
        """Echo the text."""
        return text

    return tool(name=name)(echo)


@st.composite
def context_results(draw: st.DrawFn, tool_prefix: str = "t") -> ContextResult:
    """Any well-formed ContextResult; tool names are unique per prefix."""
    n_tools = draw(st.integers(0, 2))
    return ContextResult(
        instructions=draw(st.none() | texts),
        messages=tuple(draw(st.lists(chat_messages(), max_size=3))),
        tools=tuple(make_tool(f"{tool_prefix}{i}") for i in range(n_tools)),
        replace_messages=draw(st.booleans()),
    )


Ending = Literal["ok", "model_error", "cancel", "fatal"]


@attrs.frozen
class ProviderSpec:
    """What one journaling provider returns and whether its stages fail."""

    name: str
    result: ContextResult
    fail_pre: bool = False
    fail_post: bool = False


@attrs.frozen
class StackItem:
    """One item of a scenario's stack: a provider, a parallel group, or a run middleware.

    ``members`` are indices into ``Scenario.providers`` (one for a provider,
    one or more for a group); a middleware has none, only a ``name``.
    """

    kind: Literal["provider", "group", "middleware"]
    members: tuple[int, ...] = ()
    name: str = ""


@attrs.frozen
class Scenario:
    """A random run: the stack, the agent's instructions and how the run ends.

    ``providers`` lists every provider in registration order (group members
    in declaration order); ``stack`` says how they are laid out: alone, in
    :func:`raf.parallel` groups, with run middleware between them. An empty
    ``stack`` means every provider alone, in order.
    """

    providers: tuple[ProviderSpec, ...]
    agent_instructions: str | None
    ending: Ending
    request: tuple[ChatMessage, ...]
    stack: tuple[StackItem, ...] = ()

    @property
    def items(self) -> tuple[StackItem, ...]:
        """The stack items, outermost first."""
        if self.stack:
            return self.stack
        return tuple(StackItem("provider", (i,)) for i in range(len(self.providers)))

    @property
    def failing_item(self) -> int | None:
        """Index (into ``items``) of the first item with a failing pre stage, if any."""
        for index, item in enumerate(self.items):
            if any(self.providers[m].fail_pre for m in item.members):
                return index
        return None

    @property
    def failing_pre(self) -> int | None:
        """Index of the first provider whose pre stage fails, if any."""
        for index, spec in enumerate(self.providers):
            if spec.fail_pre:
                return index
        return None

    @property
    def failing_names(self) -> frozenset[str]:
        """The providers one of which the run's ProviderError may name (several in a group)."""
        k = self.failing_item
        if k is None:
            return frozenset()
        return frozenset(
            self.providers[m].name for m in self.items[k].members if self.providers[m].fail_pre
        )

    @property
    def reached(self) -> tuple[StackItem, ...]:
        """The items whose pre stage (or middleware) ran: up to the failing item."""
        k = self.failing_item
        return self.items if k is None else self.items[: k + 1]

    @property
    def entered(self) -> tuple[ProviderSpec, ...]:
        """The providers whose pre stage returned, in registration order.

        In a group with a failing member, every other member has returned
        too: a failing pre stage passes a checkpoint before it raises.
        """
        return tuple(
            self.providers[m]
            for item in self.reached
            for m in item.members
            if not self.providers[m].fail_pre
        )


@st.composite
def scenarios(draw: st.DrawFn, max_providers: int = 6) -> Scenario:
    """A random stack of 0..max_providers providers, groups and middleware, and an ending."""
    n = draw(st.integers(0, max_providers))
    specs = []
    for i in range(n):
        specs.append(
            ProviderSpec(
                name=f"p{i}",
                result=draw(context_results(tool_prefix=f"p{i}_t")),
                fail_pre=draw(st.integers(0, 4)) == 0,
                fail_post=draw(st.integers(0, 3)) == 0,
            )
        )
    items: list[StackItem] = []
    i = 0
    while True:
        if draw(st.integers(0, 3)) == 0:
            items.append(StackItem("middleware", name=f"m{len(items)}"))
        if i == n:
            break
        size = draw(st.integers(1, min(3, n - i)))
        grouped = size > 1 or draw(st.integers(0, 4)) == 0
        members = tuple(range(i, i + size))
        items.append(StackItem("group" if grouped else "provider", members))
        i += size
    return Scenario(
        providers=tuple(specs),
        agent_instructions=draw(st.none() | texts),
        ending=draw(st.sampled_from(["ok", "ok", "model_error", "cancel", "fatal"])),
        request=(ChatMessage.user(draw(texts)),),
        stack=tuple(items),
    )


class PreFailure(Exception):
    """What a provider's failing pre stage raises."""


class PostFailure(Exception):
    """What a provider's failing post stage raises."""


class ModelFailure(Exception):
    """What the model raises when the scenario says so."""


class ModelFatal(BaseException):
    """What the model raises for the ending "fatal": a BaseException, not an Exception."""


class JournalingProvider(ContextProvider):
    """A provider that writes each stage it runs into a shared journal."""

    def __init__(self, spec: ProviderSpec, journal: list[tuple[Any, ...]]) -> None:
        self.spec = spec
        self.name = spec.name
        self.journal = journal

    async def on_invoking(
        self, agent: Any, session: Any, messages: Sequence[ChatMessage], options: Any
    ) -> ContextResult:
        self.journal.append(("pre", self.name))
        if self.spec.fail_pre:
            # In a group, this lets every other member start (and return) first.
            await anyio.lowlevel.checkpoint()
            raise PreFailure(self.name)
        return self.spec.result

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        self.journal.append(("post", self.name, response, error))
        if self.spec.fail_post:
            raise PostFailure(self.name)


class JournalingMiddleware:
    """Run middleware that journals the way in (with the instructions so far) and out."""

    def __init__(self, name: str, journal: list[tuple[Any, ...]]) -> None:
        self.name = name
        self.journal = journal

    async def __call__(self, invocation: Invocation, call_next: Any) -> AgentResponse:
        self.journal.append(("mw", self.name, invocation.instructions))
        try:
            response: AgentResponse = await call_next(invocation)
        except BaseException as error:
            self.journal.append(("mw-out", self.name, None, error))
            raise
        self.journal.append(("mw-out", self.name, response, None))
        return response


def build_stack(scenario: Scenario, journal: list[tuple[Any, ...]]) -> list[Any]:
    """The scenario's stack of journaling providers, groups and middleware."""
    stack: list[Any] = []
    for item in scenario.items:
        if item.kind == "middleware":
            stack.append(JournalingMiddleware(item.name, journal))
            continue
        members = [JournalingProvider(scenario.providers[m], journal) for m in item.members]
        stack.append(parallel(*members) if item.kind == "group" else members[0])
    return stack


def expected_prompt(scenario: Scenario) -> tuple[tuple[ChatMessage, ...], tuple[str, ...]]:
    """The messages and tool names the model must see, by the merge rules."""
    instructions, injected, tools = merge_model([spec.result for spec in scenario.providers])
    lines = [scenario.agent_instructions] if scenario.agent_instructions else []
    lines.extend(instructions)
    system = (ChatMessage.system("\n".join(lines)),) if lines else ()
    return system + injected + scenario.request, tools


def merge_model(
    results: Sequence[ContextResult],
) -> tuple[tuple[str, ...], tuple[ChatMessage, ...], tuple[str, ...]]:
    """The merge rules on plain lists: instructions, injected messages, tool names."""
    instructions: list[str] = []
    injected: list[ChatMessage] = []
    tools: list[str] = []
    for result in results:
        if result.instructions:
            instructions.append(result.instructions)
        if result.replace_messages:
            injected = list(result.messages)
        else:
            injected.extend(result.messages)
        tools.extend(t.name for t in result.tools)
    return tuple(instructions), tuple(injected), tuple(tools)


def expected_journal(scenario: Scenario) -> list[tuple[Any, ...]]:
    """The stages in the order they must run, with each outcome's kind.

    The pre stages of a group run concurrently, in no fixed order: a group
    is one entry ``("pre-group", frozenset(names))`` (see
    :func:`collapse_groups`). A middleware's entry on the way in carries the
    instructions the providers outside it contributed.
    """
    journal: list[tuple[Any, ...]] = []
    instructions: list[str] = []
    for item in scenario.reached:
        names = [scenario.providers[m].name for m in item.members]
        if item.kind == "middleware":
            journal.append(("mw", item.name, tuple(instructions)))
        elif item.kind == "group":
            journal.append(("pre-group", frozenset(names)))
        else:
            journal.append(("pre", names[0]))
        for m in item.members:
            text = scenario.providers[m].result.instructions
            if text:
                instructions.append(text)
    k = scenario.failing_item
    outcome: str
    if k is None:
        journal.append(("model",))
        outcome = "response" if scenario.ending == "ok" else scenario.ending
    else:
        outcome = "pre_error"
    # A failed post stage of a successful run does not change what the providers outside
    # it see, up to the next middleware: that one sees the ProviderError, as a caller would.
    failed_post = False
    for item in reversed(scenario.reached):
        if item.kind == "middleware":
            if failed_post and outcome == "response":
                outcome = "post_error"
            journal.append(("mw-out", item.name, outcome))
            continue
        for m in reversed(item.members):
            spec = scenario.providers[m]
            if not spec.fail_pre:
                journal.append(("post", spec.name, outcome))
                failed_post = failed_post or spec.fail_post
    return journal


def collapse_groups(scenario: Scenario, journal: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``journal`` with the pre stages of each group collapsed into one order-free entry."""
    group_of = {
        scenario.providers[m].name: index
        for index, item in enumerate(scenario.items)
        if item.kind == "group"
        for m in item.members
    }
    collapsed: list[tuple[Any, ...]] = []
    current: tuple[int, set[str]] | None = None
    for entry in journal:
        group = group_of.get(entry[1]) if entry[0] == "pre" else None
        if group is None:
            current = None
            collapsed.append(entry)
        elif current is not None and current[0] == group:
            current[1].add(entry[1])
            collapsed[-1] = ("pre-group", frozenset(current[1]))
        else:
            current = (group, {entry[1]})
            collapsed.append(("pre-group", frozenset(current[1])))
    return collapsed


def tool_call(name: str, arguments: str = "{}", call_id: str = "c1") -> ToolCall:
    """Shorthand for a ToolCall."""
    return ToolCall(call_id, name, arguments)


# Streamed runs ---------------------------------------------------------------------------


arguments = st.sampled_from(["{}", '{"a": 1}', '{"text": "x y"}'])


@st.composite
def run_responses(draw: st.DrawFn) -> AgentResponse:
    """A response shaped like a run's: assistant turns, each answered by its tool messages.

    Two assistant turns always have a tool message between them, and a turn
    has text (maybe ``""``) or tool calls: the shapes a stream can tell apart.
    """
    messages: list[ChatMessage] = []
    turns = draw(st.integers(0, 3))
    for turn in range(turns):
        calls = [
            ToolCall(f"c{turn}_{n}", draw(st.sampled_from(["now", "add"])), draw(arguments))
            for n in range(draw(st.integers(0, 2)))
        ]
        text = draw(st.none() | texts) if calls else draw(texts)
        messages.append(ChatMessage.assistant(text, tool_calls=calls))
        answered = draw(st.integers(1 if turn < turns - 1 else 0, 2))
        for n in range(answered):
            messages.append(
                ChatMessage.tool(f"c{turn}_{n}", draw(texts), name=draw(st.none() | st.just("add")))
            )
    usage = draw(st.none() | st.builds(Usage, st.integers(0, 99), st.integers(0, 99)))
    return AgentResponse(tuple(messages), usage)


def rechunk(updates: Sequence[Update], cuts: Sequence[int]) -> list[Update]:
    """``updates`` with each text update split at the positions ``cuts`` (as a stream may)."""
    out: list[Update] = []
    for update in updates:
        if update.kind != "text" or not update.text:
            out.append(update)
            continue
        positions = sorted({0, len(update.text), *(c % (len(update.text) + 1) for c in cuts)})
        out.extend(Update.of_text(update.text[a:b]) for a, b in itertools.pairwise(positions))
    return out


@st.composite
def updates(draw: st.DrawFn) -> list[Update]:
    """The updates of a streamed run's answer, text split anywhere: ``from_updates`` assembles
    them to a run-shaped response (what ``raf.testing.strategies.updates()`` is to offer)."""
    response = draw(run_responses())
    return rechunk(response.to_updates(), draw(st.lists(st.integers(0, 20), max_size=4)))
