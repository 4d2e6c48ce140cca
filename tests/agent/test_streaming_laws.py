"""The laws of a streamed run, as hypothesis properties on both backends.

For random stacks (the providers, groups and middleware of the journal law
in test_providers.py), random update scripts, a random end of the model
(an answer, an error or a BaseException mid-stream) and a random point
where the consumer leaves or is cancelled, in both forms, the journal is:
the pre stages in order, the updates the consumer saw (a prefix of the
script), then exactly one post stage per entered provider in reverse order,
each with the right outcome.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ProviderError,
    ScriptedChatClient,
    StreamClosedError,
    ToolCall,
    Update,
    Usage,
)
from raf.testing.journal import (
    ModelFailure,
    ModelFatal,
    PostFailure,
    PreFailure,
    Scenario,
    build_stack,
    collapse_groups,
    expected_post_journal,
    expected_pre_journal,
)
from raf.testing.strategies import make_tool, scenarios, texts

pytestmark = pytest.mark.anyio

CALL = ToolCall("t1", "echo", '{"text": "r"}')
RESULT = ChatMessage.tool("t1", "r", name="echo")


class ConsumerStop(Exception):
    """What the callback form's consumer raises to stop."""


@attrs.frozen
class StreamScenario:
    """A stack, the model's calls in chunks, how the model ends and how the consumer does.

    Every call but the last ends with a tool call (answered by ``echo``).
    ``fail_at`` is where, in the last call's updates, the model raises for
    the endings "model_error" and "fatal". ``close_after`` is how many
    updates the consumer takes before it leaves (``"leave"``: ``break`` in
    the iterator form, raising in the callback) or cancels its scope
    (``"cancel"``); ``None``: it reads to the end.
    """

    base: Scenario
    calls: tuple[tuple[Update, ...], ...]
    ending: Literal["ok", "model_error", "fatal"]
    fail_at: int
    close_after: int | None
    close: Literal["leave", "cancel"]
    form: Literal["iterator", "callback"]

    @property
    def updates(self) -> tuple[Update, ...]:
        """What a consumer reading to the end sees (up to the model's failure)."""
        seen: list[Update] = []
        for number, call in enumerate(self.calls):
            last = number == len(self.calls) - 1
            if last and self.ending != "ok":
                seen.extend(call[: self.fail_at])
                break
            seen.extend(call)
            if not last:
                seen.append(Update.of_tool_result(RESULT))
        return tuple(seen)

    def script(self, failure: BaseException) -> list[Any]:
        """The ScriptedChatClient script: one list of chunks per call."""
        steps: list[Any] = [list(call) for call in self.calls]
        if self.ending != "ok":
            steps[-1].insert(self.fail_at, failure)
        return steps


@st.composite
def model_calls(draw: st.DrawFn) -> tuple[tuple[Update, ...], ...]:
    calls: list[tuple[Update, ...]] = []
    count = draw(st.integers(1, 2))
    for number in range(count):
        last = number == count - 1
        size = st.integers(1, 4) if last else st.integers(0, 3)
        chunks = [Update.of_text(t) for t in draw(st.lists(texts, min_size=draw(size), max_size=4))]
        if not last:
            chunks.append(Update.of_tool_call(CALL))
        if draw(st.booleans()):
            chunks.append(Update.of_usage(Usage(draw(st.integers(0, 9)), 1)))
        calls.append(tuple(chunks))
    return tuple(calls)


@st.composite
def stream_scenarios(draw: st.DrawFn) -> StreamScenario:
    base = draw(scenarios(max_providers=5))
    if draw(st.integers(0, 3)):  # mostly runs that reach the model: that is where streams are
        providers = tuple(attrs.evolve(spec, fail_pre=False) for spec in base.providers)
        base = attrs.evolve(base, providers=providers)
    calls = draw(model_calls())
    ending = draw(st.sampled_from(["ok", "ok", "model_error", "fatal"]))
    fail_at = draw(st.integers(0, len(calls[-1])))
    form = draw(st.sampled_from(["iterator", "callback"]))
    close = draw(st.sampled_from(["leave", "cancel"]))
    partial = StreamScenario(base, calls, ending, fail_at, None, close, form)
    # The consumer stops strictly before the run could end by itself; the callback
    # form and a cancel need one update to act on.
    first = 0 if (form == "iterator" and close == "leave") else 1
    available = len(partial.updates)
    close_after = None
    if available > first and draw(st.integers(0, 3)):
        close_after = draw(st.integers(first, available - 1))
    return attrs.evolve(partial, close_after=close_after)


def outcome_kind(response: AgentResponse | None, error: BaseException | None) -> str:
    if error is None:
        assert response is not None
        return "response"
    assert response is None
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return "cancel"
    if isinstance(error, StreamClosedError):
        return "closed"
    if isinstance(error, ConsumerStop):
        return "consumer_error"
    if isinstance(error, ProviderError) and isinstance(error.__cause__, PreFailure):
        return "pre_error"
    if isinstance(error, ProviderError) and isinstance(error.__cause__, PostFailure):
        return "post_error"
    if isinstance(error, ModelFailure):
        return "model_error"
    if isinstance(error, ModelFatal):
        return "fatal"
    return f"unexpected {error!r}"


def expected_outcome(scenario: StreamScenario) -> str:
    if scenario.base.failing_item is not None:
        return "pre_error"
    if scenario.close_after is not None:
        if scenario.close == "cancel":
            return "cancel"
        return "closed" if scenario.form == "iterator" else "consumer_error"
    return "response" if scenario.ending == "ok" else scenario.ending


def expected_journal(scenario: StreamScenario) -> list[tuple[Any, ...]]:
    """Pre stages in order, the updates seen, post stages in reverse (as in test_providers)."""
    base = scenario.base
    journal = expected_pre_journal(base)
    outcome = expected_outcome(scenario)
    if outcome != "pre_error":
        journal.extend(("update", update) for update in seen_updates(scenario))
    return journal + expected_post_journal(base, outcome)


def seen_updates(scenario: StreamScenario) -> tuple[Update, ...]:
    if scenario.base.failing_item is not None:
        return ()
    updates = scenario.updates
    return updates if scenario.close_after is None else updates[: scenario.close_after]


@asynccontextmanager
async def at_most_10_s(deadline: bool) -> AsyncIterator[None]:
    """A bound on a scenario: a deadline, or a watchdog that fails the test.

    The iterator form reads the model's stream in a cancel scope only when
    the run has a deadline; the watchdog leaves it none, so both ways of
    reading are under the laws.
    """
    if deadline:
        with anyio.fail_after(10):
            yield
        return

    async def watchdog() -> None:
        await anyio.sleep(10)
        raise AssertionError("the streamed run hung")

    async with anyio.create_task_group() as group:
        group.start_soon(watchdog)
        try:
            yield
        finally:
            group.cancel_scope.cancel()


async def run_streamed(
    scenario: StreamScenario, journal: list[tuple[Any, ...]], *, deadline: bool = True
) -> tuple[AgentResponse | None, BaseException | None, bool, list[Any]]:
    """Run the scenario in its form; the response, what was raised, whether cancelled."""
    base = scenario.base
    failures = {"model_error": ModelFailure("model down"), "fatal": ModelFatal("stop")}
    failure = failures.get(scenario.ending, ModelFailure("unused"))
    client = ScriptedChatClient(scenario.script(failure))
    agent = Agent(
        client,
        instructions=base.agent_instructions,
        tools=[make_tool("echo")],
        stack=build_stack(base, journal),
    )
    response: AgentResponse | None = None
    raised: BaseException | None = None
    count = 0

    async def consumer_step(update: Update, scope: anyio.CancelScope) -> bool:
        """The consumer takes one update; True when it leaves now."""
        nonlocal count
        journal.append(("update", update))
        count += 1
        if count != scenario.close_after:
            return False
        if scenario.close == "cancel":
            scope.cancel()
            await anyio.sleep(5)
        return True

    async with at_most_10_s(deadline):
        with anyio.CancelScope() as scope:
            try:
                if scenario.form == "callback":

                    async def on_update(update: Update) -> None:
                        if await consumer_step(update, scope):
                            raise ConsumerStop

                    response = await agent.run(base.request, on_update=on_update)
                else:
                    async with agent.stream(base.request) as stream:
                        if scenario.close_after != 0:
                            async for update in stream:
                                if await consumer_step(update, scope):
                                    break
                    response = stream.response
            except BaseException as exc:
                raised = exc
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    raise
    return response, raised, scope.cancelled_caught, [failure]


@settings(max_examples=200, deadline=None)
@given(stream_scenarios(), st.booleans())
@pytest.mark.slow
async def test_the_journal_of_a_streamed_run(scenario: StreamScenario, deadline: bool) -> None:
    event(f"{scenario.form}: {expected_outcome(scenario)}")
    journal: list[tuple[Any, ...]] = []
    response, raised, cancelled, (failure,) = await run_streamed(
        scenario, journal, deadline=deadline
    )
    simplified = [
        (entry[0], entry[1], outcome_kind(entry[2], entry[3]))
        if entry[0] in ("post", "mw-out")
        else entry
        for entry in journal
    ]
    assert collapse_groups(scenario.base, simplified) == expected_journal(scenario)

    # One outcome, one object: every layer saw the same error (or response).
    by_kind: dict[str, set[int]] = {}
    for entry in journal:
        if entry[0] in ("post", "mw-out"):
            seen = id(entry[2]) if entry[3] is None else id(entry[3])
            by_kind.setdefault(outcome_kind(entry[2], entry[3]), set()).add(seen)
    assert all(len(ids) == 1 for ids in by_kind.values())

    # An early close carries what the consumer saw.
    seen = seen_updates(scenario)
    for entry in journal:
        if entry[0] == "post" and isinstance(entry[3], StreamClosedError):
            assert entry[3].partial == AgentResponse.from_updates(seen)

    outcome = expected_outcome(scenario)
    post_failures = [spec for spec in scenario.base.entered if spec.fail_post]
    if outcome == "pre_error":
        assert isinstance(raised, ProviderError)
        assert raised.stage == "on_invoking"
    elif outcome == "cancel":
        assert cancelled
        assert isinstance(raised, anyio.get_cancelled_exc_class())
    elif outcome in ("model_error", "fatal"):
        assert raised is failure  # unchanged, never in an exception group
    elif outcome == "consumer_error":
        assert isinstance(raised, ConsumerStop)
    elif post_failures:  # "response" or "closed": raised as after a successful run
        assert isinstance(raised, ProviderError)
        assert (raised.provider, raised.stage) == (post_failures[-1].name, "on_invoked")
        assert isinstance(raised.__cause__, PostFailure)
    elif outcome == "closed":
        assert raised is None
        assert response is None
    else:
        assert raised is None
        assert response == AgentResponse.from_updates(seen)
    if outcome not in ("response", "closed"):
        notes = [n for n in getattr(raised, "__notes__", []) if "on_invoked" in n]
        assert len(notes) == len(post_failures)


@settings(max_examples=60, deadline=None)
@given(model_calls())
async def test_a_streamed_run_returns_what_an_unstreamed_one_does(
    calls: tuple[tuple[Update, ...], ...],
) -> None:
    def agent() -> Agent:
        return Agent(ScriptedChatClient([list(call) for call in calls]), tools=[make_tool("echo")])

    unstreamed = await agent().run("hi")
    updates: list[Update] = []

    async def on_update(update: Update) -> None:
        updates.append(update)

    assert await agent().run("hi", on_update=on_update) == unstreamed
    assert AgentResponse.from_updates(updates) == unstreamed
    async with agent().stream("hi") as stream:
        assert [update async for update in stream] == updates
    assert stream.response == unstreamed
