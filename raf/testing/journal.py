"""The journal law of raf, as a model: random stacks, recording providers, expected journals.

pluggy's journal tests, made random. A :class:`Scenario` is a stack of
providers, parallel groups and run middleware with failure points and an
ending; :func:`build_stack` makes the stack's items, which write what runs
into a journal; :func:`expected_journal` says what that journal must be: the
order in which the stages run and the outcome each sees. The strategies that
draw scenarios (:func:`raf.testing.strategies.stacks`) are in
:mod:`raf.testing.strategies`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import anyio
import anyio.lowlevel
import attrs

from raf._onion.compose import ContextProvider
from raf._onion.parallel import parallel
from raf._values.context import ContextResult, Invocation
from raf._values.messages import AgentResponse, ChatMessage

__all__ = [
    "Ending",
    "ModelFailure",
    "ModelFatal",
    "PostFailure",
    "PreFailure",
    "ProviderSpec",
    "RecordingMiddleware",
    "RecordingProvider",
    "RecordingStack",
    "Scenario",
    "StackItem",
    "build_stack",
    "collapse_groups",
    "expected_journal",
    "expected_post_journal",
    "expected_pre_journal",
    "expected_prompt",
    "merge_model",
]

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


class PreFailure(Exception):
    """What a provider's failing pre stage raises."""


class PostFailure(Exception):
    """What a provider's failing post stage raises."""


class ModelFailure(Exception):
    """What the model raises when the scenario says so."""


class ModelFatal(BaseException):
    """What the model raises for the ending "fatal": a BaseException, not an Exception."""


class RecordingProvider(ContextProvider):
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


class RecordingMiddleware:
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
            stack.append(RecordingMiddleware(item.name, journal))
            continue
        members = [RecordingProvider(scenario.providers[m], journal) for m in item.members]
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


def expected_pre_journal(scenario: Scenario) -> list[tuple[Any, ...]]:
    """The way in of :func:`expected_journal`: pre stages in order (a group's as one
    order-free entry), and each middleware with the instructions outside it."""
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
    return journal


def expected_journal(scenario: Scenario) -> list[tuple[Any, ...]]:
    """The stages in the order they must run, with each outcome's kind.

    The pre stages of a group run concurrently, in no fixed order: a group
    is one entry ``("pre-group", frozenset(names))`` (see
    :func:`collapse_groups`). A middleware's entry on the way in carries the
    instructions the providers outside it contributed.
    """
    journal = expected_pre_journal(scenario)
    k = scenario.failing_item
    outcome: str
    if k is None:
        journal.append(("model",))
        outcome = "response" if scenario.ending == "ok" else scenario.ending
    else:
        outcome = "pre_error"
    return journal + expected_post_journal(scenario, outcome)


def expected_post_journal(scenario: Scenario, outcome: str) -> list[tuple[Any, ...]]:
    """The way out of :func:`expected_journal`: post stages and middleware, innermost
    first, each with the kind of outcome it sees, starting from ``outcome``."""
    journal: list[tuple[Any, ...]] = []
    # A failed post stage does not change what the layers outside it see, providers and
    # middleware alike: the run raises it once every post stage has run.
    for item in reversed(scenario.reached):
        if item.kind == "middleware":
            journal.append(("mw-out", item.name, outcome))
            continue
        for m in reversed(item.members):
            spec = scenario.providers[m]
            if not spec.fail_pre:
                journal.append(("post", spec.name, outcome))
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


@attrs.define
class RecordingStack:
    """A drawn stack: ``items`` for ``Agent(stack=...)``, and the ``journal`` they write.

    The items are fresh :class:`RecordingProvider` objects (alone or in
    :func:`raf.parallel` groups) and :class:`RecordingMiddleware`, some of
    whose stages fail as ``scenario`` says (:class:`PreFailure`,
    :class:`PostFailure`). Each appends what it runs to ``journal``:
    ``("pre", name)``, ``("post", name, response, error)``,
    ``("mw", name, instructions)`` and ``("mw-out", name, response, error)``.
    """

    scenario: Scenario
    items: list[Any]
    journal: list[tuple[Any, ...]]

    @property
    def entered(self) -> tuple[str, ...]:
        """The providers whose pre stage returned, in registration order (as the scenario says)."""
        return tuple(spec.name for spec in self.scenario.entered)

    def check_journal(self) -> None:
        """Assert the journal law, whatever the model did.

        The pre stages ran in registration order (a group's in any order),
        up to the first failing one; every provider whose pre stage
        returned got exactly one post stage, innermost first; middleware
        ran where it stands. Outcomes are not compared (they depend on the
        model and on what was put in the stack around these items); raises
        ``AssertionError`` with both journals.
        """
        expected = [entry[:2] for entry in expected_journal(self.scenario) if entry[0] != "model"]
        simplified = [entry[:2] for entry in self.journal if entry[0] != "model"]
        got = collapse_groups(self.scenario, simplified)
        if got != expected:
            raise AssertionError(
                f"the stages ran as {got}, the journal law says {expected} "
                f"(stack {self.scenario.items}, failing pre stage: {self.scenario.failing_pre})"
            )
