"""The tool stack: middleware around each single tool call, through real Agent runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs
import pytest
from structlog.testing import capture_logs

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ContextProvider,
    Invocation,
    RetryMiddleware,
    ScriptedChatClient,
    Session,
    ToolCall,
    ToolRequest,
    Update,
    check_tool_arguments,
    tool,
)
from raf.errors import ToolArgumentsError

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn
CallNext = Callable[[ToolRequest], Awaitable[ChatMessage]]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def tool_messages(response: AgentResponse) -> list[str]:
    return [message.content or "" for message in response.messages if message.role == "tool"]


# The recipes of docs/tools.md ----------------------------------------------------------------


class Approval:
    """Asks ``ask(request)`` before running the tools named in ``ask_for``."""

    def __init__(
        self, ask: Callable[[ToolRequest], Awaitable[bool]], ask_for: Sequence[str]
    ) -> None:
        self.ask = ask
        self.ask_for = frozenset(ask_for)

    async def __call__(self, request: ToolRequest, call_next: CallNext) -> ChatMessage:
        if request.tool.name in self.ask_for and not await self.ask(request):
            return request.reply(f"The user refused to run {request.tool.name}.")
        return await call_next(request)


def timeout(seconds: float, per_tool: Mapping[str, float] | None = None) -> Any:
    """Each call bounded by its tool's limit; an overrun is told to the model."""
    limits = dict(per_tool or {})

    async def middleware(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        limit = limits.get(request.tool.name, seconds)
        with anyio.move_on_after(limit):
            return await call_next(request)
        return request.reply(f"Error: tool {request.tool.name!r} did not finish within {limit} s")

    return middleware


# The shape of the stack --------------------------------------------------------------------


async def test_middleware_wrap_each_call_outermost_first_and_see_the_request() -> None:
    journal: list[str] = []
    seen: list[ToolRequest] = []

    def recorder(label: str) -> Any:
        async def middleware(request: ToolRequest, call_next: CallNext) -> ChatMessage:
            journal.append(f"{label}.pre {request.call.id}")
            seen.append(request)
            message = await call_next(request)
            journal.append(f"{label}.post {message.content}")
            return message

        return middleware

    call = ToolCall("c1", "add", '{"a": 2, "b": 3}')
    client = ScriptedChatClient([turn(call), "5"])
    session_seen: list[Session] = []

    class Spy(ContextProvider):
        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            session_seen.append(session)
            return await super().on_invoking(agent, session, messages, options)

    agent = Agent(
        client, tools=[add], stack=[Spy()], tool_stack=[recorder("outer"), recorder("inner")]
    )
    response = await agent.run("2 + 3?")

    assert response.text == "5"
    assert journal == ["outer.pre c1", "inner.pre c1", "inner.post 5", "outer.post 5"]
    request = seen[0]
    assert request.call == call
    assert request.tool is add
    assert request.arguments == {"a": 2, "b": 3}
    assert isinstance(request.invocation, Invocation)
    assert request.invocation.session is session_seen[0]
    assert request.invocation.agent is agent
    assert agent.tool_stack == tuple(agent.tool_stack)
    assert len(agent.tool_stack) == 2


async def test_with_no_tool_stack_a_tool_call_is_as_before() -> None:
    client = ScriptedChatClient([turn(ToolCall("c1", "add", '{"a": 1, "b": 1}')), "2"])
    agent = Agent(client, tools=[add])
    assert agent.tool_stack == ()
    assert tool_messages(await agent.run("go")) == ["2"]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(ContextProvider(), id="a provider"),
        pytest.param(Approval, id="a class"),
        pytest.param(42, id="not callable"),
    ],
)
def test_the_tool_stack_takes_middleware_only(bad: object) -> None:
    with pytest.raises(TypeError, match=r"tool_stack\[1\] must be middleware"):
        Agent(ScriptedChatClient(), tool_stack=[timeout(1), bad])


def test_the_tool_stack_is_a_list() -> None:
    with pytest.raises(TypeError, match="tool_stack must be a list of middleware"):
        Agent(ScriptedChatClient(), tool_stack="timeout")  # type: ignore[arg-type]


async def test_aclose_closes_tool_middleware_too() -> None:
    closed: list[str] = []

    class Closable:
        async def __call__(self, request: ToolRequest, call_next: CallNext) -> ChatMessage:
            return await call_next(request)

        async def aclose(self) -> None:
            closed.append("tool middleware")

    async with Agent(ScriptedChatClient(), tool_stack=[Closable()]):
        pass
    assert closed == ["tool middleware"]


# The recipes --------------------------------------------------------------------------------


async def test_an_approval_middleware_refuses_a_call_the_model_is_told_the_run_goes_on() -> None:
    ran: list[str] = []

    @tool
    def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return "deleted"

    asked: list[ToolRequest] = []

    async def ask(request: ToolRequest) -> bool:
        asked.append(request)
        return request.arguments["path"] != "/etc/passwd"

    calls = (
        ToolCall("1", "delete_file", '{"path": "/etc/passwd"}'),
        ToolCall("2", "delete_file", '{"path": "tmp.txt"}'),
        ToolCall("3", "add", '{"a": 1, "b": 1}'),
    )
    client = ScriptedChatClient([turn(*calls), "I deleted tmp.txt only."])
    agent = Agent(
        client, tools=[delete_file, add], tool_stack=[Approval(ask, ask_for=["delete_file"])]
    )

    response = await agent.run("clean up")

    assert response.text == "I deleted tmp.txt only."
    assert ran == ["tmp.txt"]
    # add needs no approval; the calls of one turn run concurrently, in any order
    assert sorted(request.call.id for request in asked) == ["1", "2"]
    assert client.requests[1].messages[-3:] == (
        ChatMessage.tool("1", "The user refused to run delete_file.", name="delete_file"),
        ChatMessage.tool("2", "deleted", name="delete_file"),
        ChatMessage.tool("3", "2", name="add"),
    )


async def test_a_per_tool_timeout_tells_the_model_and_leaves_the_other_tools_alone() -> None:
    @tool
    async def slow() -> str:
        """Takes its time."""
        await anyio.sleep(60)
        return "late"

    @tool
    async def quick() -> str:
        """Answers at once."""
        return "now"

    calls = (ToolCall("1", "slow"), ToolCall("2", "quick"))
    client = ScriptedChatClient([turn(*calls), "slow was too slow"])
    agent = Agent(client, tools=[slow, quick], tool_stack=[timeout(30, per_tool={"slow": 0.05})])
    with anyio.fail_after(20):  # the 60 s tool does not hold the run
        response = await agent.run("go")

    assert response.text == "slow was too slow"
    assert tool_messages(response) == ["Error: tool 'slow' did not finish within 0.05 s", "now"]


async def test_a_retry_middleware_calls_a_flaky_tool_again() -> None:
    failures = [ConnectionError("reset"), ConnectionError("reset again")]
    attempts: list[int] = []

    @tool
    async def fetch(url: str) -> str:
        """Fetch a page."""
        attempts.append(len(attempts) + 1)
        if failures:
            raise failures.pop(0)
        return f"<html>{url}</html>"

    client = ScriptedChatClient([turn(ToolCall("1", "fetch", '{"url": "x"}')), "got it"])
    retry = RetryMiddleware(attempts=3, retry_on=(ConnectionError,), wait_initial=0, wait_max=0)
    with capture_logs() as events:
        response = await Agent(client, tools=[fetch], tool_stack=[retry]).run("go")

    assert attempts == [1, 2, 3]
    assert tool_messages(response) == ["<html>x</html>"]
    assert [e["retrying"] for e in events if e["event"] == "retry"] == ["tool", "tool"]


async def test_when_the_retries_run_out_the_model_is_told_the_last_error() -> None:
    @tool
    async def fetch(url: str) -> str:
        """Fetch a page."""
        raise ConnectionError(f"{url} is down")

    client = ScriptedChatClient([turn(ToolCall("1", "fetch", '{"url": "x"}')), "down"])
    retry = RetryMiddleware(attempts=2, retry_on=(ConnectionError,), wait_initial=0, wait_max=0)
    response = await Agent(client, tools=[fetch], tool_stack=[retry]).run("go")
    assert tool_messages(response) == ["Error: tool 'fetch' failed: ConnectionError: x is down"]


# Errors ------------------------------------------------------------------------------------


async def test_a_middleware_that_raises_is_told_to_the_model_like_a_failing_tool() -> None:
    async def broken(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        raise RuntimeError("audit log is full")

    client = ScriptedChatClient([turn(ToolCall("1", "add", '{"a": 1, "b": 1}')), "sorry"])
    response = await Agent(client, tools=[add], tool_stack=[broken]).run("go")
    assert response.text == "sorry"
    assert tool_messages(response) == ["Error: tool 'add' failed: RuntimeError: audit log is full"]


class Fatal(BaseException):
    """Not an Exception: ends the run unchanged."""


async def test_a_base_exception_from_a_middleware_ends_the_run_unchanged() -> None:
    fatal = Fatal("stop everything")
    seen: list[BaseException | None] = []

    async def stop(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        raise fatal

    class Watch(ContextProvider):
        async def on_invoked(
            self, agent: Any, session: Any, request: Any, response: Any, error: Any
        ) -> None:
            seen.append(error)

    calls = (ToolCall("1", "add", '{"a": 1, "b": 1}'), ToolCall("2", "add", '{"a": 2, "b": 2}'))
    client = ScriptedChatClient([turn(*calls), "never"])
    agent = Agent(client, tools=[add], stack=[Watch()], tool_stack=[stop])
    with pytest.raises(Fatal) as raised:
        await agent.run("go")
    assert raised.value is fatal  # not wrapped in an exception group
    assert seen == [fatal]
    assert len(client.requests) == 1


async def test_the_tools_own_exception_passes_through_the_middleware() -> None:
    seen: list[BaseException] = []

    @tool
    def fail() -> str:
        """Always fails."""
        raise ValueError("no")

    async def watch(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        try:
            return await call_next(request)
        except Exception as exc:
            seen.append(exc)
            raise

    client = ScriptedChatClient([turn(ToolCall("1", "fail")), "ok"])
    response = await Agent(client, tools=[fail], tool_stack=[watch]).run("go")
    assert [type(exc) for exc in seen] == [ValueError]
    assert tool_messages(response) == ["Error: tool 'fail' failed: ValueError: no"]


@pytest.mark.parametrize(
    ("answer", "what"),
    [
        pytest.param(None, "None", id="None"),
        pytest.param("5", "'5'", id="a str"),
        pytest.param(ChatMessage.tool("other", "5"), "other", id="another call's message"),
        pytest.param(ChatMessage.assistant("5"), "assistant", id="not a tool message"),
    ],
)
async def test_a_middleware_that_returns_no_tool_message_ends_the_run(
    answer: object, what: str
) -> None:
    async def wrong(request: ToolRequest, call_next: CallNext) -> Any:
        await call_next(request)
        return answer

    client = ScriptedChatClient([turn(ToolCall("c1", "add", '{"a": 1, "b": 1}')), "never"])
    with pytest.raises(TypeError, match=r"answered call 'c1' \(tool 'add'\)") as raised:
        await Agent(client, tools=[add], tool_stack=[wrong]).run("go")
    assert what in str(raised.value)
    assert "request.reply(text)" in str(raised.value)


@pytest.mark.parametrize(
    ("call", "told"),
    [
        pytest.param(ToolCall("1", "nope"), "Error: there is no tool named 'nope'", id="unknown"),
        pytest.param(
            ToolCall("1", "add", "{oops"),
            "Error: the arguments of 'add' are not valid JSON",
            id="not JSON",
        ),
        pytest.param(
            ToolCall("1", "add", "[1]"),
            "Error: the arguments of 'add' must be a JSON object",
            id="not an object",
        ),
    ],
)
async def test_calls_that_name_no_tool_or_carry_no_arguments_never_reach_the_stack(
    call: ToolCall, told: str
) -> None:
    reached: list[ToolRequest] = []

    async def spy(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        reached.append(request)
        return await call_next(request)

    client = ScriptedChatClient([turn(call), "ok"])
    response = await Agent(client, tools=[add], tool_stack=[spy]).run("go")
    assert reached == []
    assert tool_messages(response)[0].startswith(told)


async def test_arguments_that_do_not_fit_reach_the_stack_and_call_next_raises() -> None:
    seen: list[BaseException] = []

    async def watch(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        assert request.arguments == {"a": 1, "b": "two"}  # parsed, not yet checked
        try:
            return await call_next(request)
        except ToolArgumentsError as exc:
            seen.append(exc)
            raise

    client = ScriptedChatClient([turn(ToolCall("1", "add", '{"a": 1, "b": "two"}')), "ok"])
    response = await Agent(client, tools=[add], tool_stack=[watch]).run("go")
    assert len(seen) == 1
    assert tool_messages(response)[0].startswith("Error: invalid arguments for 'add': b:")


async def test_a_middleware_can_check_the_arguments_first() -> None:
    asked: list[str] = []

    async def checked_first(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        check_tool_arguments(request.tool, request.arguments)  # raises ToolArgumentsError
        asked.append(request.call.id)
        return await call_next(request)

    calls = (ToolCall("1", "add", '{"a": 1}'), ToolCall("2", "add", '{"a": 1, "b": 2}'))
    client = ScriptedChatClient([turn(*calls), "ok"])
    response = await Agent(client, tools=[add], tool_stack=[checked_first]).run("go")
    assert asked == ["2"]
    told, result = tool_messages(response)
    assert told == "Error: invalid arguments for 'add': 'b' is a required property"  # jsonschema's
    assert result == "3"


async def test_arguments_a_middleware_rewrites_are_what_the_tool_gets_and_are_checked() -> None:
    def rewrite(arguments: dict[str, Any]) -> Any:
        async def middleware(request: ToolRequest, call_next: CallNext) -> ChatMessage:
            return await call_next(attrs.evolve(request, arguments=arguments))

        return middleware

    call = ToolCall("1", "add", '{"a": 1, "b": 1}')
    fixed = await Agent(
        ScriptedChatClient([turn(call), "ok"]), tools=[add], tool_stack=[rewrite({"a": 5, "b": 5})]
    ).run("go")
    assert tool_messages(fixed) == ["10"]

    class Hand:
        """A hand-made tool: raf checks its arguments with jsonschema."""

        name = "hand"
        description = "A hand-made tool."
        parameters: Mapping[str, Any] = {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        }

        async def invoke(self, arguments: Mapping[str, Any]) -> Any:
            return arguments["n"] * 2

    call = ToolCall("1", "hand", '{"n": 2}')
    broken = await Agent(
        ScriptedChatClient([turn(call), "ok"]), tools=[Hand()], tool_stack=[rewrite({"n": "x"})]
    ).run("go")
    assert tool_messages(broken)[0].startswith("Error: invalid arguments for 'hand': n:")


# Concurrency and streaming ------------------------------------------------------------------


async def test_calls_of_one_turn_still_run_concurrently_through_the_stack() -> None:
    b_done = anyio.Event()

    @tool
    async def wait_for_b() -> str:
        """Finishes once B has run."""
        await b_done.wait()
        return "a"

    @tool
    async def set_b() -> str:
        """Releases A."""
        b_done.set()
        return "b"

    inside: list[str] = []

    async def spy(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        inside.append(request.call.id)
        return await call_next(request)

    calls = (ToolCall("1", "wait_for_b"), ToolCall("2", "set_b"))
    client = ScriptedChatClient([turn(*calls), "done"])
    with anyio.fail_after(5):  # one after the other, A would wait for B forever
        response = await Agent(client, tools=[wait_for_b, set_b], tool_stack=[spy]).run("go")
    assert sorted(inside) == ["1", "2"]
    assert tool_messages(response) == ["a", "b"]


async def test_cancelling_the_run_inside_a_middleware_propagates_unchanged() -> None:
    entered = anyio.Event()

    async def hang(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    client = ScriptedChatClient([turn(ToolCall("1", "add", '{"a": 1, "b": 1}')), "never"])
    agent = Agent(client, tools=[add], tool_stack=[hang])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run, "go")
            await entered.wait()
            group.cancel_scope.cancel()
    assert len(client.requests) == 1


@pytest.mark.parametrize("form", ["callback", "iterator"])
async def test_a_streamed_run_sends_what_the_stack_answered_as_tool_results(form: str) -> None:
    async def refuse(request: ToolRequest, call_next: CallNext) -> ChatMessage:
        return request.reply("refused")

    calls = (ToolCall("1", "add", '{"a": 1, "b": 1}'),)
    agent = Agent(ScriptedChatClient([turn(*calls), "fine"]), tools=[add], tool_stack=[refuse])
    updates: list[Update] = []
    if form == "callback":

        async def collect(update: Update) -> None:
            updates.append(update)

        response = await agent.run("go", on_update=collect)
    else:
        async with agent.stream("go") as stream:
            updates.extend([update async for update in stream])
        assert stream.response is not None
        response = stream.response
    results = [update.message for update in updates if update.kind == "tool_result"]
    assert results == [ChatMessage.tool("1", "refused", name="add")]
    assert response.text == "fine"
    assert AgentResponse.from_updates(updates) == response
