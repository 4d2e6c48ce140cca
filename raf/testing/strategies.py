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
- :func:`outputs`: values of a structured ``output_type``, for property
  tests of the code that uses ``response.output`` (and :func:`output_json`,
  the JSON a model answers one with, to script a :class:`raf.ScriptedChatClient`);
- :func:`stacks`: random stacks of recording providers, parallel groups and
  run middleware, with random failure points, that write what runs into a
  journal (:class:`raf.testing.journal.RecordingStack`).

The journal law of raf (pluggy's journal tests, made random) is spelled out
in :mod:`raf.testing.journal`: the order in which the stages of a scenario
must run and the outcome each must see. This module is the
only part of :mod:`raf.testing` that imports hypothesis (the ``testing``
extra: ``pip install 'raf-agents[testing]'``).
"""

from __future__ import annotations

import functools
import itertools
import json
import string
from collections.abc import Sequence
from typing import Any

import attrs

try:
    from hypothesis import strategies as st
except ModuleNotFoundError as exc:  # pragma: no cover - the extra is not installed
    raise ModuleNotFoundError(
        "raf.testing.strategies needs hypothesis: pip install 'raf-agents[testing]'",
        name="hypothesis",
    ) from exc

from raf._agent.tools import FunctionTool, tool
from raf._providers.compression import check_tool_pairing
from raf._values.context import ContextResult
from raf._values.messages import AgentResponse, ChatMessage, Role, ToolCall, Update, Usage
from raf.testing._outputs import output_json, outputs
from raf.testing.journal import ProviderSpec, RecordingStack, Scenario, StackItem, build_stack

__all__ = [
    "chat_messages",
    "context_results",
    "histories",
    "make_tool",
    "output_json",
    "outputs",
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
    (:func:`raf.compression.check_tool_pairing` finds nothing wrong with it).
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


@functools.cache
def make_tool(name: str) -> FunctionTool:
    """A tool named ``name`` that echoes its argument ``text``: one per name, made once.

    Building a tool's argument model is most of a draw's cost; a tool is frozen, so the
    examples of a test can share it.
    """

    def echo(text: str = "") -> str:
        """Echo the text."""
        return text

    return tool(name=name)(echo)


@st.composite
def context_results(
    draw: st.DrawFn, tool_prefix: str = "t", max_messages: int = 3, volatile: bool = False
) -> ContextResult:
    """Any well-formed ContextResult; its tools are named ``tool_prefix`` + a number.

    Results drawn with different prefixes can be merged into one run
    without a tool-name clash. ``volatile=True`` draws volatile results too
    (never with ``replace_messages``, which a volatile result cannot have).
    """
    n_tools = draw(st.integers(0, 2))
    replace = draw(st.booleans())
    return ContextResult(
        instructions=draw(st.none() | texts),
        messages=tuple(draw(st.lists(chat_messages(text=texts), max_size=max_messages))),
        tools=tuple(make_tool(f"{tool_prefix}{i}") for i in range(n_tools)),
        replace_messages=replace,
        volatile=volatile and not replace and draw(st.booleans()),
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
