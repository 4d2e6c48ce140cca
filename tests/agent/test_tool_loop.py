"""The tool loop, through real Agent runs on a scripted model."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field
from structlog.testing import capture_logs

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatMessage,
    ContextProvider,
    ContextResult,
    ScriptedChatClient,
    ToolCall,
    Usage,
    tool,
)
from raf.errors import ToolLoopError

pytestmark = pytest.mark.anyio

#: How deep a tool call's arguments may nest (docs/tools.md: "nested deeper than 64 levels").
MAX_ARGUMENT_DEPTH = 64

turn = ScriptedChatClient.tool_turn


class Unit(enum.Enum):
    C = "celsius"


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
            "Error: invalid arguments for 'add': b: Field required",
        ),
        (
            ToolCall("c1", "add", '{"a": 1, "b": "two"}'),
            "Error: invalid arguments for 'add': b: Input should be a valid integer, unable to "
            "parse string as an integer",
        ),
        (
            ToolCall("c1", "add", '{"a": 1, "b": 2, "c": 3}'),
            "Error: invalid arguments for 'add': c: Extra inputs are not permitted",
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


# -- arguments: validated, coerced, and what the model is told -------------------------------


class Line(BaseModel):
    sku: str
    qty: Annotated[int, Field(ge=1)]


@tool
def place(lines: list[Line], tags: set[str], express: bool = False) -> str:
    """Place an order."""
    assert all(isinstance(line, Line) for line in lines)
    assert isinstance(tags, set)
    return f"{sum(line.qty for line in lines)} items, tags {sorted(tags)}, express {express}"


async def _told(call: ToolCall, *tools: Any, stack: Sequence[Any] = ()) -> str:
    """What the model is told for one call, in a run that goes on to its answer."""
    client = ScriptedChatClient([turn(call), "done"])
    response = await Agent(client, tools=tools, stack=stack).run("go")
    assert response.text == "done"
    result = client.requests[1].messages[-1]
    assert result.role == "tool"
    assert result.tool_call_id == call.id
    assert result.content is not None
    return result.content


async def test_arguments_reach_a_tool_in_its_declared_types() -> None:
    arguments = '{"lines": [{"sku": "a", "qty": "2"}, {"sku": "b", "qty": 3}], "tags": ["x", "x"]}'
    told = await _told(ToolCall("c1", "place", arguments), place)
    assert told == "5 items, tags ['x'], express False"


async def test_a_validation_error_is_told_with_its_path_and_the_run_goes_on() -> None:
    arguments = json.dumps(
        {
            "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}, {"sku": "c", "qty": 0}],
            "tags": [],
        }
    )
    told = await _told(ToolCall("c1", "place", arguments), place)
    assert told == (
        "Error: invalid arguments for 'place': "
        "lines[2].qty: Input should be greater than or equal to 1"
    )


@dataclasses.dataclass(frozen=True, eq=False)
class HandMade:
    """A tool whose schema comes from elsewhere (an MCP server, an API description)."""

    name: str
    parameters: Any
    description: str = "A hand-made tool."

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        return {"got": dict(arguments)}


class Offers(ContextProvider):
    """Offers its tools for the run, as MCP does."""

    def __init__(self, *tools: Any) -> None:
        self.tools = tools

    async def on_invoking(self, *args: Any) -> ContextResult:
        return ContextResult(tools=self.tools)


BOOLEAN_SUBSCHEMAS = HandMade(
    "pick", {"type": "object", "properties": {"x": True, "y": False}, "required": ["x"]}
)


@pytest.mark.parametrize("offered", ["agent", "provider"])
async def test_boolean_subschemas_of_a_hand_made_tool_are_checked_not_a_crash(
    offered: str,
) -> None:
    where: dict[str, Any] = {"stack": [Offers(BOOLEAN_SUBSCHEMAS)]} if offered == "provider" else {}
    tools = (BOOLEAN_SUBSCHEMAS,) if offered == "agent" else ()
    fine = await _told(ToolCall("c1", "pick", '{"x": [1, {"a": null}]}'), *tools, **where)
    assert json.loads(fine) == {"got": {"x": [1, {"a": None}]}}
    refused = await _told(ToolCall("c1", "pick", '{"y": 1}'), *tools, **where)
    assert refused.startswith("Error: invalid arguments for 'pick': ")
    assert "'x' is a required property" in refused
    assert "False schema does not allow 1" in refused


async def test_a_hand_made_tools_arguments_are_told_with_their_path() -> None:
    rows = HandMade(
        "rows",
        {
            "type": "object",
            "properties": {"rows": {"type": "array", "items": {"type": "integer"}}},
        },
    )
    told = await _told(ToolCall("c1", "rows", '{"rows": [1, 2, "3"]}'), rows)
    assert told == "Error: invalid arguments for 'rows': rows[2]: '3' is not of type 'integer'"


MALFORMED = [
    ({"enum": 5}, "at enum: 5 is not of type 'array'"),
    ({"type": "object", "properties": ["q"]}, "at properties: ['q'] is not of type 'object'"),
    ({"type": 5}, "at type: 5 is not valid under any of the given schemas"),
    ({"type": "object", "required": 5}, "at required: 5 is not of type 'array'"),
    (None, "expected a JSON object, got NoneType"),
]


@pytest.mark.parametrize("offered", ["agent", "provider"])
@pytest.mark.parametrize(("schema", "problem"), MALFORMED)
async def test_a_tool_with_a_malformed_schema_is_refused_when_called_and_the_run_goes_on(
    schema: dict[str, Any], problem: str, offered: str
) -> None:
    bad = HandMade("bad", schema)
    calls = (ToolCall("c1", "bad", '{"q": 1}'), ToolCall("c2", "add", '{"a": 1, "b": 2}'))
    client = ScriptedChatClient([turn(*calls), "done", turn(*calls), "done again"])
    if offered == "agent":
        agent = Agent(client, tools=[bad, add])
    else:
        agent = Agent(client, tools=[add], stack=[Offers(bad)])
    refused = "Error: tool 'bad' cannot be called: tool 'bad' has an invalid parameters schema: "
    # refused every time, the second time from the verdict kept for the tool
    for answer in ("done", "done again"):
        with capture_logs() as logs:
            response = await agent.run("go")
        assert response.text == answer
        results = [m.content for m in response.messages if m.role == "tool"]
        assert results == [refused + problem, "3"]
        assert logs == [
            {
                "event": "tool.schema_invalid",
                "log_level": "warning",
                "tool": "bad",
                "problem": problem,
            }
        ]


# -- deeply nested JSON -------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "arguments",
    [_nested(1000), '{"x": ' + _nested(1000) + "}", '{"x": ' + _nested(100_000) + "}"],
    ids=["array-1000", "object-1000", "object-100000"],
)
@pytest.mark.parametrize("which", ["function", "hand-made"])
async def test_arguments_nested_too_deeply_are_told_not_valid(arguments: str, which: str) -> None:
    @tool
    def take(x: Any = None) -> str:
        """Takes anything."""
        return "taken"

    deep_tree = HandMade(
        "take",
        {
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/tree"}},
            "$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
        },
    )
    told = await _told(
        ToolCall("c1", "take", arguments), take if which == "function" else deep_tree
    )
    assert told.startswith("Error: the arguments of 'take' ")
    assert "not valid" in told


async def test_arguments_nested_within_the_limit_are_fine() -> None:
    tree = HandMade(
        "tree",
        {
            "type": "object",
            "properties": {"x": {"$ref": "#/$defs/tree"}},
            "$defs": {"tree": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
        },
    )
    arguments = '{"x": ' + _nested(MAX_ARGUMENT_DEPTH - 1) + "}"
    told = await _told(ToolCall("c1", "tree", arguments), tree)
    assert told.startswith('{"got": {"x": [[[')
    one_more = '{"x": ' + _nested(MAX_ARGUMENT_DEPTH) + "}"
    told = await _told(ToolCall("c1", "tree", one_more), tree)
    assert told == "Error: the arguments of 'tree' are not valid: nested deeper than 64 levels"


async def test_a_result_nested_too_deeply_is_told_as_an_error_not_raised() -> None:
    @tool
    def deep() -> list[Any]:
        """Returns a structure nested 100,000 deep."""
        result: list[Any] = []
        for _ in range(100_000):
            result = [result]
        return result

    told = await _told(ToolCall("c1", "deep"), deep)
    assert told == (
        "Error: the result of tool 'deep' cannot be sent to the model: "
        "it is nested too deeply to be written as JSON"
    )


async def test_a_circular_result_is_told_as_an_error() -> None:
    @tool
    def loop() -> list[Any]:
        """Returns a list that holds itself."""
        result: list[Any] = []
        result.append(result)
        return result

    told = await _told(ToolCall("c1", "loop"), loop)
    assert told.startswith("Error: the result of tool 'loop' cannot be sent to the model: ")
    assert "Circular reference" in told


@dataclasses.dataclass
class Reading:
    when: datetime.date
    unit: Unit
    values: frozenset[int]


async def test_results_pydantic_knows_are_sent_as_json() -> None:
    @tool
    def read() -> list[Any]:
        """Returns values json cannot write by itself."""
        return [Reading(datetime.date(2026, 1, 2), Unit.C, frozenset({3})), Line(sku="a", qty=1)]

    told = await _told(ToolCall("c1", "read"), read)
    assert json.loads(told) == [
        {"when": "2026-01-02", "unit": "celsius", "values": [3]},
        {"sku": "a", "qty": 1},
    ]


async def test_an_arguments_error_from_another_tool_inside_is_a_failure_of_the_tool() -> None:
    @tool
    async def outer() -> Any:
        """Calls add wrongly."""
        return await add.invoke({"a": "one", "b": 1})

    told = await _told(ToolCall("c1", "outer"), outer)
    assert told.startswith(
        "Error: tool 'outer' failed: ToolArgumentsError: invalid arguments for 'add': a: "
    )


def _depth(value: Any) -> int:
    """The nesting depth of parsed JSON, the obvious recursive way."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=2), children, max_size=3)
    ),
    max_leaves=30,
)


@tool
def take_anything(x: Any = None) -> str:
    """Takes anything."""
    return "taken"


@settings(max_examples=100, deadline=None)
@given(json_values, st.integers(0, 8))
def test_the_depth_limit_agrees_with_the_recursive_definition(value: Any, limit: int) -> None:
    """Arguments ``{"x": [[...value...]]}`` padded so they pass iff ``value`` nests <= limit."""
    padded = value
    for _ in range(MAX_ARGUMENT_DEPTH - 1 - limit):
        padded = [padded]
    call = ToolCall("c1", "take_anything", json.dumps({"x": padded}))
    told = anyio.run(_told, call, take_anything)
    assert (told != "taken") == (_depth(value) > limit)
    if told != "taken":
        assert "nested deeper than 64 levels" in told


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class Opaque:
    def __str__(self) -> str:
        raise RuntimeError("no text either")


async def test_a_failure_whose_message_cannot_be_shown_is_still_told() -> None:
    @tool
    def odd() -> None:
        """Raises an exception that cannot be printed."""
        raise Unprintable()

    @tool
    def opaque() -> Any:
        """Returns something that can be neither written as JSON nor printed."""
        return [Opaque()]

    told = await _told(ToolCall("c1", "odd"), odd)
    assert told == "Error: tool 'odd' failed: Unprintable: (its message cannot be shown)"
    told = await _told(ToolCall("c1", "opaque"), opaque)
    assert told == (
        "Error: the result of tool 'opaque' cannot be sent to the model: "
        "RuntimeError: no text either"
    )


async def test_arguments_that_name_a_key_twice_are_refused_and_never_held_or_run() -> None:
    # What a person approves must be what runs: {"path": "notes.txt", "path": "/"} would show
    # one path and run the other, so it is told to the model as bad JSON, never approved.
    ran: list[str] = []

    @tool(approval=True)
    def delete(path: str) -> str:
        """Delete ``path``."""
        ran.append(path)
        return "deleted"

    call = ToolCall("c1", "delete", '{"path": "notes.txt", "path": "/"}')
    client = ScriptedChatClient([turn(call), "sorry"])
    response = await Agent(client, tools=[delete], history=True).run("clean up")
    assert response.pending == ()
    assert ran == []
    result = client.requests[1].messages[-1]
    assert (result.role, result.tool_call_id) == ("tool", "c1")
    assert result.content == (
        "Error: the arguments of 'delete' are not valid JSON (duplicate key 'path')"
    )
