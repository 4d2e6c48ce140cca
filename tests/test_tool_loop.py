"""The tool loop, through real Agent runs on a scripted model."""

from __future__ import annotations

import json

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatMessage,
    ScriptedChatClient,
    ToolCall,
    ToolLoopError,
    Usage,
    tool,
)

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(reason)


async def test_a_tool_call_round_trip() -> None:
    call = ToolCall("c1", "add", '{"a": 2, "b": 3}')
    client = ScriptedChatClient([turn(call, text="Let me add."), "The sum is 5."])
    agent = Agent(client, tools=[add])

    response = await agent.run("What is 2 + 3?")

    assert response.text == "The sum is 5."
    assert len(client.requests) == 2
    first, second = client.requests
    assert first.messages == (ChatMessage.user("What is 2 + 3?"),)
    assert [t.name for t in first.options.tools] == ["add"]
    # the second call sees the assistant turn and the tool result, after the request
    assert second.messages == (
        ChatMessage.user("What is 2 + 3?"),
        ChatMessage.assistant("Let me add.", tool_calls=[call]),
        ChatMessage.tool("c1", "5", name="add"),
    )
    # the response holds everything the run produced, in order
    assert response.messages == (
        ChatMessage.assistant("Let me add.", tool_calls=[call]),
        ChatMessage.tool("c1", "5", name="add"),
        ChatMessage.assistant("The sum is 5."),
    )
    assert response.tool_calls == (call,)


async def test_several_turns_accumulate_and_usage_adds_up() -> None:
    one = ToolCall("c1", "add", '{"a": 1, "b": 1}')
    two = ToolCall("c2", "add", '{"a": 2, "b": 2}')
    client = ScriptedChatClient(
        [
            AgentResponse((turn(one),), Usage(10, 1), raw="first"),
            AgentResponse((turn(two),), Usage(20, 2), raw="second"),
            AgentResponse((ChatMessage.assistant("2 and 4"),), Usage(30, 3), raw="last"),
        ]
    )
    response = await Agent(client, tools=[add]).run("go")
    assert [m.role for m in response.messages] == [
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [m.content for m in response.messages if m.role == "tool"] == ["2", "4"]
    assert response.usage == Usage(60, 6)
    assert response.raw == "last"
    assert len(client.requests[2].messages) == 5  # request + 2 x (turn, result)


async def test_several_calls_in_one_turn_run_concurrently_in_call_order() -> None:
    b_done = anyio.Event()
    finished: list[str] = []

    @tool
    async def wait_for_b() -> str:
        """A: only finishes once B has run."""
        await b_done.wait()
        finished.append("a")
        return "a"

    @tool
    async def set_b() -> str:
        """B: releases A."""
        b_done.set()
        finished.append("b")
        return "b"

    calls = (ToolCall("1", "wait_for_b"), ToolCall("2", "set_b"))
    client = ScriptedChatClient([turn(*calls), "done"])
    with anyio.fail_after(5):  # run sequentially, A would wait for B forever
        response = await Agent(client, tools=[wait_for_b, set_b]).run("go")

    assert finished == ["b", "a"]
    results = [m for m in response.messages if m.role == "tool"]
    assert [(m.tool_call_id, m.content) for m in results] == [("1", "a"), ("2", "b")]
    assert client.requests[1].messages[-2:] == tuple(results)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (
            ToolCall("c1", "subtract", "{}"),
            "Error: there is no tool named 'subtract' (available: add, explode)",
        ),
        (ToolCall("c1", "add", '{"a": 1,'), "Error: the arguments of 'add' are not valid JSON"),
        (ToolCall("c1", "add", "[1, 2]"), "Error: the arguments of 'add' must be a JSON object"),
        (
            ToolCall("c1", "add", '{"a": 1}'),
            "Error: invalid arguments for 'add' at $: missing required property 'b'",
        ),
        (
            ToolCall("c1", "add", '{"a": 1, "b": "2"}'),
            "Error: invalid arguments for 'add' at $.b: expected integer, got string",
        ),
        (
            ToolCall("c1", "add", '{"a": 1, "b": 2, "c": 3}'),
            "Error: invalid arguments for 'add' at $: unexpected property 'c'",
        ),
        (
            ToolCall("c1", "explode", '{"reason": "out of fuel"}'),
            "Error: tool 'explode' failed: RuntimeError: out of fuel",
        ),
    ],
)
async def test_tool_failures_are_told_to_the_model_and_the_run_goes_on(
    call: ToolCall, expected: str
) -> None:
    client = ScriptedChatClient([turn(call), "sorry"])
    response = await Agent(client, tools=[add, explode]).run("go")
    assert response.text == "sorry"
    result = client.requests[1].messages[-1]
    assert result.role == "tool"
    assert result.tool_call_id == "c1"
    assert result.content is not None
    assert result.content.startswith(expected)


async def test_one_failing_call_does_not_spoil_its_neighbours() -> None:
    calls = (
        ToolCall("1", "add", '{"a": 1, "b": 2}'),
        ToolCall("2", "explode", '{"reason": "no"}'),
        ToolCall("3", "nope"),
    )
    client = ScriptedChatClient([turn(*calls), "ok"])
    response = await Agent(client, tools=[add, explode]).run("go")
    contents = [m.content or "" for m in response.messages if m.role == "tool"]
    assert contents[0] == "3"
    assert contents[1].startswith("Error: tool 'explode' failed")
    assert contents[2].startswith("Error: there is no tool named 'nope'")


async def test_results_that_are_not_text_are_sent_as_json() -> None:
    @tool
    def profile(user: str) -> dict[str, object]:
        """A user's profile."""
        return {"user": user, "tags": ["a", "é"], "age": None}

    client = ScriptedChatClient([turn(ToolCall("1", "profile", '{"user": "ann"}')), "ok"])
    response = await Agent(client, tools=[profile]).run("go")
    content = response.messages[1].content
    assert content is not None
    assert json.loads(content) == {"user": "ann", "tags": ["a", "é"], "age": None}
    assert "é" in content


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_max_tool_iterations_counts_model_calls(limit: int) -> None:
    ran: list[int] = []

    @tool
    def step() -> str:
        """One step."""
        ran.append(1)
        return "stepped"

    client = ScriptedChatClient([turn(ToolCall(str(i), "step")) for i in range(limit + 5)])
    agent = Agent(client, tools=[step])
    with pytest.raises(ToolLoopError, match=rf"after {limit} model calls") as caught:
        await agent.run("go", options=AgentRunOptions(max_tool_iterations=limit))
    assert len(client.requests) == limit
    assert len(ran) == limit - 1  # the last turn's calls are not run
    assert caught.value.max_tool_iterations == limit
    assert caught.value.pending == ("step",)


async def test_the_last_allowed_call_may_answer() -> None:
    client = ScriptedChatClient([turn(ToolCall("1", "add", '{"a": 1, "b": 1}')), "two"])
    response = await Agent(client, tools=[add]).run(
        "go", options=AgentRunOptions(max_tool_iterations=2)
    )
    assert response.text == "two"
    assert len(client.requests) == 2


async def test_with_one_call_allowed_an_answer_without_tools_is_fine() -> None:
    client = ScriptedChatClient(["straight answer"])
    response = await Agent(client, tools=[add]).run(
        "go", options=AgentRunOptions(max_tool_iterations=1)
    )
    assert response.text == "straight answer"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
async def test_max_tool_iterations_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="max_tool_iterations must be a positive int"):
        AgentRunOptions(max_tool_iterations=bad)  # type: ignore[arg-type]


async def test_the_default_is_ten_model_calls() -> None:
    client = ScriptedChatClient([turn(ToolCall(str(i), "add", "{}")) for i in range(11)])
    with pytest.raises(ToolLoopError):
        await Agent(client, tools=[add]).run("go")
    assert len(client.requests) == 10


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.permutations(range(n))))
async def test_results_come_back_in_call_order_whatever_order_tools_finish(
    finish_order: list[int],
) -> None:
    done = [anyio.Event() for _ in finish_order]

    @tool
    async def step(i: int) -> str:
        """Finishes in its place of finish_order."""
        place = finish_order.index(i)
        if place:
            await done[place - 1].wait()
        done[place].set()
        return f"result {i}"

    calls = [ToolCall(f"c{i}", "step", json.dumps({"i": i})) for i in range(len(finish_order))]
    client = ScriptedChatClient([turn(*calls), "done"])
    with anyio.fail_after(5):
        response = await Agent(client, tools=[step]).run("go")
    results = [m for m in response.messages if m.role == "tool"]
    assert [m.tool_call_id for m in results] == [c.id for c in calls]
    assert [m.content for m in results] == [f"result {i}" for i in range(len(calls))]


class Fatal(BaseException):
    """A BaseException that is not an Exception (like KeyboardInterrupt)."""


async def test_a_base_exception_in_one_of_concurrent_tools_propagates_unwrapped() -> None:
    fatal = Fatal("stop")
    cancelled: list[str] = []

    @tool
    async def fatal_tool() -> str:
        """Raises a BaseException."""
        await anyio.lowlevel.checkpoint()
        raise fatal

    @tool
    async def slow_tool() -> str:
        """Waits until cancelled."""
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.append("slow_tool")
            raise
        return "unreachable"  # pragma: no cover

    calls = (ToolCall("1", "slow_tool"), ToolCall("2", "fatal_tool"))
    client = ScriptedChatClient([turn(*calls), "never"])
    agent = Agent(client, tools=[fatal_tool, slow_tool])
    with anyio.fail_after(5), pytest.raises(Fatal) as caught:  # fail_after: a deadlock guard
        await agent.run("go")
    # Never wrapped in an exception group; the other call was cancelled, not left running.
    assert caught.value is fatal
    assert cancelled == ["slow_tool"]


async def test_cancelling_the_run_while_tools_run_cancels_them_and_propagates_unwrapped() -> None:
    from raf import ContextProvider, FunctionTool

    started: list[str] = []
    cancelled: list[str] = []
    both = anyio.Event()
    posts: list[BaseException | None] = []

    def waiter(name: str) -> FunctionTool:
        async def wait() -> str:
            started.append(name)
            if len(started) == 2:
                both.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(name)
                raise
            return "unreachable"  # pragma: no cover

        wait.__name__ = name
        wait.__doc__ = f"Waits ({name})."
        return tool(wait)

    class Post(ContextProvider):
        async def on_invoked(self, *args: object) -> None:
            error = args[-1]
            assert error is None or isinstance(error, BaseException)
            posts.append(error)

    calls = (ToolCall("1", "first"), ToolCall("2", "second"))
    agent = Agent(
        ScriptedChatClient([turn(*calls), "never"]),
        tools=[waiter("first"), waiter("second")],
        stack=[Post()],
    )
    raised: list[BaseException] = []

    async def run() -> None:
        try:
            await agent.run("go")
        except BaseException as exc:
            raised.append(exc)
            raise

    with anyio.fail_after(5):  # a deadlock guard
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await both.wait()
            group.cancel_scope.cancel()
    (error,) = raised
    assert isinstance(error, anyio.get_cancelled_exc_class())
    assert sorted(cancelled) == ["first", "second"]
    assert posts == [error]
