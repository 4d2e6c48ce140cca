"""Hypothesis strategies for raf: messages, tool calls, context results, updates and stacks.

Every strategy here is a function that takes no required argument and
returns a hypothesis strategy, for ``@given``::

    from hypothesis import given
    from raf.testing import strategies as rs

    @given(rs.context_results())
    def test_merge_takes_any_result(result): ...

- :func:`chat_messages`, :func:`tool_calls`, :func:`histories` (well-formed
  conversations: every tool call answered), :func:`context_results`;
- :func:`updates`: the updates of a streamed answer, text split anywhere,
  that :meth:`raf.AgentResponse.from_updates` assembles;
- :func:`stacks`: random stacks of recording providers, parallel groups and
  run middleware, with random failure points, that write what runs into a
  journal (:class:`RecordingStack`).

The journal law of raf (pluggy's journal tests, made random) is spelled out
by :func:`expected_journal`: the order in which the stages of a
:class:`Scenario` must run and the outcome each must see. This module is the
only part of :mod:`raf.testing` that imports hypothesis (the ``testing``
extra: ``pip install 'raf-agents[testing]'``).
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import Sequence
from typing import Any, Literal

import anyio
import anyio.lowlevel
import attrs

try:
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is not installed
    raise ModuleNotFoundError(
        "raf.testing.strategies needs hypothesis: pip install 'raf-agents[testing]'",
        name="hypothesis",
    ) from exc

from raf._builtin.compression import check_tool_pairing
from raf._context import ContextResult, Invocation
from raf._messages import AgentResponse, ChatMessage, Role, ToolCall, Update, Usage
from raf._parallel import parallel
from raf._providers import ContextProvider
from raf._tools import FunctionTool, tool

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
    "chat_messages",
    "collapse_groups",
    "context_results",
    "expected_journal",
    "expected_post_journal",
    "expected_pre_journal",
    "expected_prompt",
    "histories",
    "make_tool",
    "merge_model",
    "rechunk",
    "run_responses",
    "scenarios",
    "stacks",
    "texts",
    "tool_calls",
    "updates",
]

#: Short texts over a small alphabet: collisions and edge cases come up often.
texts = st.text(alphabet="abcdefgh xyz\n", max_size=12)

_PLAIN_ROLES: tuple[Role, ...] = ("system", "user", "assistant")
_NAME_CHARS = string.ascii_lowercase + string.digits + "_"


def tool_calls(*, name: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[ToolCall]:
    """A tool call as a model sends it: an id, a tool name and JSON-object arguments.

    ``name`` draws the tool name (default: short identifiers). The arguments
    are always a valid JSON object, as a model's usually are.
    """
    names = name if name is not None else st.text(_NAME_CHARS, min_size=1, max_size=10)
    values = st.none() | st.booleans() | st.integers(-99, 99) | st.text(max_size=8)
    arguments = st.dictionaries(st.text(_NAME_CHARS, min_size=1, max_size=6), values, max_size=3)
    return st.builds(
        ToolCall,
        st.text(_NAME_CHARS, min_size=1, max_size=8),
        names,
        arguments.map(lambda a: json.dumps(a, ensure_ascii=False)),
    )


def chat_messages(
    *,
    roles: Sequence[Role] = _PLAIN_ROLES,
    text: st.SearchStrategy[str] | None = None,
    tool_traffic: bool = False,
) -> st.SearchStrategy[ChatMessage]:
    """One chat message, any of ``roles``, with text from ``text`` (default: any unicode) or none.

    With ``tool_traffic=True`` an assistant message may carry tool calls and
    ``"tool"`` messages come too (answering calls that may not be there: a
    list of these is not a well-formed history; :func:`histories` draws those).
    """
    texts_ = text if text is not None else st.text(max_size=20)
    options: list[st.SearchStrategy[ChatMessage]] = [
        st.builds(ChatMessage, st.sampled_from(list(roles)), st.none() | texts_)
    ]
    if tool_traffic:
        options.append(
            st.builds(
                ChatMessage.assistant,
                st.none() | texts_,
                tool_calls=st.lists(tool_calls(), min_size=1, max_size=3),
            )
        )
        options.append(
            st.builds(
                ChatMessage.tool,
                st.text(_NAME_CHARS, min_size=1, max_size=8),
                texts_,
                name=st.none() | st.text(_NAME_CHARS, min_size=1, max_size=8),
            )
        )
    return st.one_of(options)


@st.composite
def histories(draw: st.DrawFn, max_turns: int = 8) -> tuple[ChatMessage, ...]:
    """A well-formed conversation: every tool call is answered right after its turn.

    Maybe a system message first, then turns of user messages, assistant
    answers and assistant tool calls each followed by one result per call
    (:func:`raf._builtin.check_tool_pairing` finds nothing wrong with it).
    What a session holds after a few runs; what a compression strategy gets.
    """
    messages: list[ChatMessage] = []
    if draw(st.booleans()):
        messages.append(ChatMessage.system(draw(st.text(max_size=20))))
    for turn in range(draw(st.integers(0, max_turns))):
        kind = draw(st.sampled_from(["user", "assistant", "tools"]))
        if kind == "user":
            messages.append(ChatMessage.user(draw(st.text(max_size=20))))
        elif kind == "assistant":
            messages.append(ChatMessage.assistant(draw(st.text(max_size=20))))
        else:
            calls = [
                ToolCall(f"call_{turn}_{n}", call.name, call.arguments)
                for n, call in enumerate(draw(st.lists(tool_calls(), min_size=1, max_size=3)))
            ]
            messages.append(ChatMessage.assistant(draw(st.none() | texts), tool_calls=calls))
            for call in calls:
                messages.append(ChatMessage.tool(call.id, draw(texts), name=call.name))
    assert check_tool_pairing(messages) is None
    return tuple(messages)


def make_tool(name: str) -> FunctionTool:
    """A tool named ``name`` that echoes its argument ``text``."""

    def echo(text: str = "") -> str:
        """Echo the text."""
        return text

    return tool(name=name)(echo)


@st.composite
def context_results(
    draw: st.DrawFn, tool_prefix: str = "t", max_messages: int = 3
) -> ContextResult:
    """Any well-formed ContextResult; its tools are named ``tool_prefix`` + a number.

    Results drawn with different prefixes can be merged into one run
    without a tool-name clash.
    """
    n_tools = draw(st.integers(0, 2))
    return ContextResult(
        instructions=draw(st.none() | texts),
        messages=tuple(draw(st.lists(chat_messages(text=texts), max_size=max_messages))),
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
    :func:`raf._parallel` groups, with run middleware between them. An empty
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


@attrs.define
class RecordingStack:
    """A drawn stack: ``items`` for ``Agent(stack=...)``, and the ``journal`` they write.

    The items are fresh :class:`RecordingProvider` objects (alone or in
    :func:`raf._parallel` groups) and :class:`RecordingMiddleware`, some of
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


@st.composite
def stacks(draw: st.DrawFn, max_providers: int = 6, failures: bool = True) -> RecordingStack:
    """A random stack of recording providers, parallel groups and run middleware.

    Up to ``max_providers`` providers, each contributing a random
    :func:`context_results`; with ``failures`` (the default) a pre stage
    fails now and then (the run ends there with a :class:`raf.ProviderError`)
    and a post stage too. Put your own provider or middleware anywhere in
    ``stack.items``, run, and call :meth:`RecordingStack.check_journal`.
    """
    scenario = draw(scenarios(max_providers=max_providers))
    if not failures:
        scenario = attrs.evolve(
            scenario,
            providers=tuple(
                attrs.evolve(spec, fail_pre=False, fail_post=False) for spec in scenario.providers
            ),
            ending="ok",
        )
    journal: list[tuple[Any, ...]] = []
    return RecordingStack(scenario, build_stack(scenario, journal), journal)


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
    """The updates of a streamed run's answer, text split anywhere.

    :meth:`raf.AgentResponse.from_updates` assembles them to a response
    shaped like a run's (:func:`run_responses`): assistant turns, tool calls,
    tool results and maybe the usage. Script a streamed model with them:
    ``ScriptedChatClient([updates])``.
    """
    response = draw(run_responses())
    return rechunk(response.to_updates(), draw(st.lists(st.integers(0, 20), max_size=4)))
