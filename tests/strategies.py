"""Hypothesis strategies for raf: messages, context results, and whole run scenarios.

A :class:`Scenario` is a random stack of journaling providers plus a random
way for the run to end (success, a failing pre stage, a failing model, a
cancellation, failing post stages). :func:`expected_journal` is the simple
model the real pipeline is checked against, in the style of pluggy's
journal tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs
from hypothesis import strategies as st

from raf import (
    AgentResponse,
    ChatMessage,
    ContextProvider,
    ContextResult,
    FunctionTool,
    ToolCall,
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


Ending = Literal["ok", "model_error", "cancel"]


@attrs.frozen
class ProviderSpec:
    """What one journaling provider returns and whether its stages fail."""

    name: str
    result: ContextResult
    fail_pre: bool = False
    fail_post: bool = False


@attrs.frozen
class Scenario:
    """A random run: the stack, the agent's instructions and how the run ends."""

    providers: tuple[ProviderSpec, ...]
    agent_instructions: str | None
    ending: Ending
    request: tuple[ChatMessage, ...]

    @property
    def failing_pre(self) -> int | None:
        """Index of the first provider whose pre stage fails, if any."""
        for index, spec in enumerate(self.providers):
            if spec.fail_pre:
                return index
        return None

    @property
    def entered(self) -> tuple[ProviderSpec, ...]:
        """The providers whose pre stage returned."""
        k = self.failing_pre
        return self.providers if k is None else self.providers[:k]


@st.composite
def scenarios(draw: st.DrawFn, max_providers: int = 6) -> Scenario:
    """A random stack of 0..max_providers providers and a random ending."""
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
    return Scenario(
        providers=tuple(specs),
        agent_instructions=draw(st.none() | texts),
        ending=draw(st.sampled_from(["ok", "ok", "model_error", "cancel"])),
        request=(ChatMessage.user(draw(texts)),),
    )


class PreFailure(Exception):
    """What a provider's failing pre stage raises."""


class PostFailure(Exception):
    """What a provider's failing post stage raises."""


class ModelFailure(Exception):
    """What the model raises when the scenario says so."""


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


def expected_prompt(scenario: Scenario) -> tuple[tuple[ChatMessage, ...], tuple[str, ...]]:
    """The messages and tool names the model must see, by the merge rules."""
    lines = [scenario.agent_instructions] if scenario.agent_instructions else []
    injected: list[ChatMessage] = []
    tools: list[str] = []
    for spec in scenario.providers:
        result = spec.result
        if result.instructions:
            lines.append(result.instructions)
        if result.replace_messages:
            injected = list(result.messages)
        else:
            injected.extend(result.messages)
        tools.extend(t.name for t in result.tools)
    system = (ChatMessage.system("\n".join(lines)),) if lines else ()
    return system + tuple(injected) + scenario.request, tuple(tools)


def expected_journal(scenario: Scenario) -> list[tuple[str, ...]]:
    """The stages in the order they must run, with each post stage's outcome kind."""
    journal: list[tuple[str, ...]] = []
    k = scenario.failing_pre
    for spec in scenario.providers[: len(scenario.providers) if k is None else k + 1]:
        journal.append(("pre", spec.name))
    if k is None:
        journal.append(("model",))
    if k is not None:
        outcome = "pre_error"
    elif scenario.ending == "ok":
        outcome = "response"
    else:
        outcome = scenario.ending
    for spec in reversed(scenario.entered):
        journal.append(("post", spec.name, outcome))
    return journal


def tool_call(name: str, arguments: str = "{}", call_id: str = "c1") -> ToolCall:
    """Shorthand for a ToolCall."""
    return ToolCall(call_id, name, arguments)
