"""Parallel groups: concurrent pre stages that merge like the same providers in sequence."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raf
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ContextProvider,
    ContextResult,
    Invocation,
    ProviderError,
    ProviderGroup,
    ScriptedChatClient,
    parallel,
    tool,
)

pytestmark = pytest.mark.anyio

# Hypothesis runs each example inside the anyio test; keep the budget modest.
PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def make_tool(name: str) -> Any:
    async def invoke() -> str:
        return name

    invoke.__name__ = name
    invoke.__doc__ = f"The {name} tool."
    return tool(invoke)


class Scripted(ContextProvider):
    """Returns a fixed result after a given number of checkpoints; logs its stages."""

    def __init__(self, name: str, result: Any, checkpoints: int, log: list[Any]) -> None:
        self.name = name
        self.result = result
        self.checkpoints = checkpoints
        self.log = log

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        for _ in range(self.checkpoints):
            await anyio.lowlevel.checkpoint()
        self.log.append(("pre", self.name))
        return self.result

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Any,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        self.log.append(("post", self.name, response is not None, error))


class Capture:
    """Run middleware that records the invocation the providers produced."""

    def __init__(self) -> None:
        self.seen: list[Invocation] = []

    async def __call__(self, invocation: Invocation, call_next: Any) -> AgentResponse:
        self.seen.append(invocation)
        response: AgentResponse = await call_next(invocation)
        return response


message = st.builds(
    ChatMessage,
    st.sampled_from(["user", "assistant", "system"]),
    st.text(max_size=8),
)
result = st.builds(
    ContextResult,
    instructions=st.none() | st.text(max_size=8),
    messages=st.lists(message, max_size=3).map(tuple),
    replace_messages=st.booleans(),
)


async def run_stack(stack: Sequence[Any], capture: Capture) -> Any:
    client = ScriptedChatClient(["done"])
    agent = Agent(client, instructions="Base.", stack=[*stack, capture])
    response = await agent.run("hi")
    return response, client.requests[0]


@PROPERTY
@given(
    results=st.lists(result, min_size=1, max_size=6),
    checkpoints=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    tools_at=st.sets(st.integers(0, 5)),
)
async def test_a_group_merges_exactly_like_the_same_providers_in_sequence(
    results: list[ContextResult], checkpoints: list[int], tools_at: set[int]
) -> None:
    results = [
        attrs.evolve(r, tools=(make_tool(f"t{i}"),) if i in tools_at else ())
        for i, r in enumerate(results)
    ]
    seq_log: list[Any] = []
    grp_log: list[Any] = []
    in_sequence = [Scripted(f"p{i}", r, checkpoints[i], seq_log) for i, r in enumerate(results)]
    in_group = [Scripted(f"p{i}", r, checkpoints[i], grp_log) for i, r in enumerate(results)]
    seq_capture, grp_capture = Capture(), Capture()

    seq_response, seq_request = await run_stack(in_sequence, seq_capture)
    grp_response, grp_request = await run_stack([parallel(*in_group)], grp_capture)

    (seq,), (grp,) = seq_capture.seen, grp_capture.seen
    assert grp.instructions == seq.instructions
    assert tuple(grp.messages) == tuple(seq.messages)
    assert [t.name for t in grp.tools] == [t.name for t in seq.tools]
    assert grp_request.messages == seq_request.messages
    assert grp_response == seq_response
    # Post stages: every member, innermost (last declared) first, as in a sequence.
    assert [e for e in grp_log if e[0] == "post"] == [e for e in seq_log if e[0] == "post"]


async def test_an_empty_group_result_passes_the_invocation_through() -> None:
    log: list[Any] = []
    capture = Capture()
    members = [Scripted(f"p{i}", ContextResult(), 0, log) for i in range(3)]
    client = ScriptedChatClient(["done"])

    async def outer(invocation: Invocation, call_next: Any) -> AgentResponse:
        capture.seen.append(invocation)
        response: AgentResponse = await call_next(invocation)
        return response

    inner = Capture()
    agent = Agent(client, stack=[outer, parallel(*members), inner])
    await agent.run("hi")
    assert inner.seen[0] is capture.seen[0]


async def test_pre_stages_of_a_group_overlap() -> None:
    # Each member waits for the next one's signal: only concurrent pre stages can finish.
    events = [anyio.Event() for _ in range(3)]

    class Relay(ContextProvider):
        def __init__(self, index: int) -> None:
            self.name = f"relay{index}"
            self.index = index

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            if self.index + 1 < len(events):
                await events[self.index + 1].wait()
            events[self.index].set()
            return ContextResult(instructions=self.name)

    agent = Agent(ScriptedChatClient(["done"]), stack=[parallel(*(Relay(i) for i in range(3)))])
    with anyio.fail_after(5):  # a deadlock guard, not a timing assertion
        response = await agent.run("hi")
    assert response.text == "done"


class Boom(RuntimeError):
    pass


@PROPERTY
@given(size=st.integers(2, 5), data=st.data())
async def test_a_failing_member_cancels_the_others_and_its_error_is_raised(
    size: int, data: st.DataObject
) -> None:
    failing = data.draw(st.integers(0, size - 1), label="failing")
    fast = data.draw(st.sets(st.integers(0, size - 1)), label="returns before the failure")
    log: list[Any] = []
    cancelled: list[str] = []
    gate = anyio.Event()  # never set: members not in ``fast`` wait until cancelled

    class Member(ContextProvider):
        def __init__(self, index: int) -> None:
            self.name = f"m{index}"
            self.index = index

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            if self.index == failing:
                for _ in range(3):  # let the fast members return first
                    await anyio.lowlevel.checkpoint()
                raise Boom(f"{self.name} broke")
            if self.index not in fast:
                try:
                    await gate.wait()
                except anyio.get_cancelled_exc_class():
                    cancelled.append(self.name)
                    raise
            return ContextResult(instructions=self.name)

        async def on_invoked(
            self, agent: Any, session: Any, request: Any, response: Any, error: Any
        ) -> None:
            log.append((self.name, response, error))

    outer_log: list[Any] = []
    outer = Scripted("outer", ContextResult(instructions="outer"), 0, outer_log)
    client = ScriptedChatClient(["never"])
    agent = Agent(client, stack=[outer, parallel(*(Member(i) for i in range(size)))])

    with anyio.fail_after(5), pytest.raises(ProviderError) as caught:
        await agent.run("hi")

    error = caught.value
    assert (error.provider, error.stage) == (f"m{failing}", "on_invoking")
    assert isinstance(error.__cause__, Boom)
    assert client.requests == []
    returned = [f"m{i}" for i in range(size) if i in fast and i != failing]
    waiting = [f"m{i}" for i in range(size) if i not in fast and i != failing]
    assert sorted(cancelled) == waiting
    # Exactly the members that returned get their post stage, innermost first, with the error.
    assert [name for name, _, _ in log] == returned[::-1]
    assert all(response is None and err is error for _, response, err in log)
    assert outer_log[-1] == ("post", "outer", False, error)


async def test_a_member_with_a_malformed_result_is_named_and_the_others_get_their_post() -> None:
    log: list[Any] = []
    good = Scripted("good", ContextResult(instructions="ok"), 0, log)
    bad = Scripted("bad", ContextResult(instructions=42), 1, log)  # type: ignore[arg-type]
    agent = Agent(ScriptedChatClient(["never"]), stack=[parallel(good, bad)])
    with pytest.raises(ProviderError) as caught:
        await agent.run("hi")
    assert (caught.value.provider, caught.value.field) == ("bad", "instructions")
    assert [entry[:2] for entry in log if entry[0] == "post"] == [("post", "good")]


async def test_post_stages_of_a_group_get_the_response_or_the_model_error() -> None:
    log: list[Any] = []
    members = [Scripted(f"p{i}", ContextResult(instructions=f"p{i}"), 0, log) for i in range(3)]
    failure = RuntimeError("model down")
    agent = Agent(ScriptedChatClient(["fine", failure]), stack=[parallel(*members)])

    await agent.run("one")
    assert [e for e in log if e[0] == "post"] == [
        ("post", "p2", True, None),
        ("post", "p1", True, None),
        ("post", "p0", True, None),
    ]
    log.clear()
    with pytest.raises(RuntimeError, match="model down"):
        await agent.run("two")
    assert [e for e in log if e[0] == "post"] == [
        ("post", name, False, failure) for name in ("p2", "p1", "p0")
    ]


async def test_cancelling_the_run_during_a_group_gives_returned_members_their_post() -> None:
    log: list[Any] = []
    started = anyio.Event()

    class Hang(ContextProvider):
        name = "hang"

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            started.set()
            await anyio.sleep_forever()

    quick = Scripted("quick", ContextResult(instructions="q"), 0, log)
    agent = Agent(ScriptedChatClient(["never"]), stack=[parallel(quick, Hang())])
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run, "hi")
        await started.wait()
        group.cancel_scope.cancel()
    (post,) = [e for e in log if e[0] == "post"]
    assert post[:3] == ("post", "quick", False)
    assert isinstance(post[3], anyio.get_cancelled_exc_class())


async def test_a_failing_post_stage_of_a_member_is_reported_with_its_name() -> None:
    class Leaky(ContextProvider):
        name = "leaky"

        async def on_invoked(self, *args: Any) -> None:
            raise OSError("disk full")

    log: list[Any] = []
    fine = Scripted("fine", ContextResult(instructions="f"), 0, log)
    agent = Agent(ScriptedChatClient(["ok"]), stack=[parallel(Leaky(), fine)])
    with pytest.raises(ProviderError) as caught:
        await agent.run("hi")
    assert (caught.value.provider, caught.value.stage) == ("leaky", "on_invoked")
    assert [e[:2] for e in log if e[0] == "post"] == [("post", "fine")]


def test_parallel_checks_its_members() -> None:
    class P(ContextProvider):
        pass

    with pytest.raises(TypeError, match="at least one"):
        parallel()
    with pytest.raises(TypeError, match="member 1 is not a context provider"):
        parallel(P(), object())
    with pytest.raises(TypeError, match="itself a group"):
        parallel(P(), parallel(P()))
    group = parallel(P(), P(), name="both")
    assert isinstance(group, ProviderGroup)
    assert (group.name, group.kind, len(group.members)) == ("both", "parallel", 2)


def test_a_group_is_a_provider_of_the_stack() -> None:
    class P(ContextProvider):
        pass

    group = parallel(P())
    agent = Agent(ScriptedChatClient(), stack=[group])
    assert agent.providers == (group,)
    assert raf.parallel is parallel


class Fatal(BaseException):
    """A BaseException that is not an Exception (like KeyboardInterrupt)."""


async def test_a_base_exception_in_a_member_pre_stage_propagates_unwrapped() -> None:
    fatal = Fatal("stop")
    log: list[Any] = []
    outer_log: list[Any] = []

    class Raises(ContextProvider):
        name = "raises"

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            for _ in range(3):  # let the quick member return first
                await anyio.lowlevel.checkpoint()
            raise fatal

    class Hangs(ContextProvider):
        name = "hangs"

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            await anyio.sleep_forever()

    quick = Scripted("quick", ContextResult(instructions="q"), 0, log)
    outer = Scripted("outer", ContextResult(), 0, outer_log)
    client = ScriptedChatClient(["never"])
    agent = Agent(client, stack=[outer, parallel(quick, Raises(), Hangs())])
    with anyio.fail_after(5), pytest.raises(Fatal) as caught:  # fail_after: a deadlock guard
        await agent.run("hi")
    # Never wrapped in an exception group, and every post stage saw the very same error.
    assert caught.value is fatal
    assert client.requests == []
    assert [e for e in log if e[0] == "post"] == [("post", "quick", False, fatal)]
    assert outer_log[-1] == ("post", "outer", False, fatal)


@pytest.mark.parametrize("on_cancel", ["exception", "fatal"])
async def test_a_member_failing_while_the_group_is_cancelled_from_outside_is_not_lost(
    on_cancel: str,
) -> None:
    """An Exception is attached to the cancellation as a note; a fatal BaseException wins."""
    log: list[Any] = []
    started = anyio.Event()
    fatal = Fatal("stop")

    class FailsOnCancel(ContextProvider):
        name = "fails-on-cancel"

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                if on_cancel == "fatal":
                    raise fatal from None
                raise RuntimeError("cleanup failed") from None

    class Hangs(ContextProvider):
        name = "hangs"

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            await anyio.sleep_forever()

    quick = Scripted("quick", ContextResult(instructions="q"), 0, log)
    agent = Agent(ScriptedChatClient(["never"]), stack=[parallel(quick, FailsOnCancel(), Hangs())])
    raised: list[BaseException] = []

    async def run() -> None:
        try:
            await agent.run("hi")
        except BaseException as exc:
            raised.append(exc)
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise

    with anyio.fail_after(5):  # a deadlock guard
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await started.wait()
            group.cancel_scope.cancel()
    (error,) = raised
    (post,) = [e for e in log if e[0] == "post"]
    assert post[3] is error  # the member that returned got the very error that propagated
    if on_cancel == "fatal":
        assert error is fatal
    else:
        assert isinstance(error, anyio.get_cancelled_exc_class())
        notes = getattr(error, "__notes__", [])
        assert len(notes) == 1
        assert "fails-on-cancel.on_invoking" in notes[0]
        assert "cleanup failed" in notes[0]


@pytest.mark.mock_clock
async def test_a_hung_member_post_stage_of_a_cancelled_run_is_bounded_by_post_timeout() -> None:
    log: list[Any] = []
    box: list[anyio.CancelScope] = []

    class HungPost(ContextProvider):
        name = "hung"

        async def on_invoked(self, *args: Any) -> None:
            await anyio.sleep(60)

    async def model(messages: Any, options: Any) -> str:
        box[0].cancel()
        await anyio.sleep(5)
        return "unreachable"

    fine = Scripted("fine", ContextResult(), 0, log)
    outer = Scripted("outer", ContextResult(), 0, log)
    agent = Agent(
        ScriptedChatClient([model]),
        stack=[outer, parallel(HungPost(), fine)],
        post_timeout=0.05,
    )
    notes: list[str] = []
    with anyio.fail_after(5), anyio.CancelScope() as scope:  # fail_after: a deadlock guard
        box.append(scope)
        try:
            await agent.run("hi")
        except anyio.get_cancelled_exc_class() as exc:
            notes = list(getattr(exc, "__notes__", []))
            raise
    assert scope.cancelled_caught
    assert [e[1] for e in log if e[0] == "post"] == ["fine", "outer"]
    assert len(notes) == 1
    assert "hung.on_invoked" in notes[0]
    assert "post_timeout=0.05" in notes[0]
