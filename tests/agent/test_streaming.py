"""Streamed runs: the callback form, the iterator form, early close, errors and cancellation."""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ChatRequest,
    ContextProvider,
    ContextResult,
    EchoChatClient,
    Invocation,
    ProviderError,
    ScriptedChatClient,
    StreamClosedError,
    ToolCall,
    Update,
    Usage,
    tool,
)

pytestmark = pytest.mark.anyio

CALL = ToolCall("c1", "add", '{"a": 1, "b": 2}')


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def tool_script() -> list[Any]:
    """A tool loop in chunks: text and a call, then the answer in two deltas."""
    return [
        ["Let me ", "add.", Update.of_tool_call(CALL), Update.of_usage(Usage(5, 2))],
        ["It is ", "3.", Update.of_usage(Usage(9, 2))],
    ]


class Recorder(ContextProvider):
    """Records each post stage: what it got, and whether it could await (not cancelled)."""

    def __init__(self, name: str, log: list[Any], *, fail_post: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail_post = fail_post

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        self.log.append(("pre", self.name))
        return ContextResult()

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        await anyio.lowlevel.checkpoint()  # an await that works: not under cancellation
        self.log.append(("post", self.name, response, error))
        if self.fail_post:
            raise OSError(f"{self.name} cannot write")


class HangingModel:
    """Streams its chunks, then waits (a model still thinking); records that it was closed."""

    def __init__(self, chunks: Sequence[str]) -> None:
        self.chunks = chunks
        self.closed = False
        self.cancelled = False
        self.waiting = anyio.Event()

    async def complete(self, messages: Any, options: Any) -> AgentResponse:
        raise AssertionError("a streamed run calls stream()")

    async def stream(self, messages: Any, options: Any) -> AsyncIterator[Update]:
        try:
            for chunk in self.chunks:
                yield Update.of_text(chunk)
            self.waiting.set()
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        finally:
            self.closed = True


async def read_until(stream: Any, event: anyio.Event) -> list[Update]:
    """Iterate ``stream`` until ``event`` is set (a consumer's "stop" button), then return."""
    seen: list[Update] = []
    async with anyio.create_task_group() as group:

        async def stop() -> None:
            await event.wait()
            group.cancel_scope.cancel()

        group.start_soon(stop)
        async for update in stream:
            seen.append(update)
    return seen


def texts(updates: Sequence[Update]) -> list[str]:
    return [u.text for u in updates if u.kind == "text"]


async def consume(
    agent: Agent, message: str, *, stop_after: int | None = None, fail: BaseException | None = None
) -> list[Update]:
    """Iterate a streamed run; leave after ``stop_after`` updates, raising ``fail`` if given."""
    seen: list[Update] = []
    async with agent.stream(message) as stream:
        async for update in stream:
            seen.append(update)
            if len(seen) == stop_after:
                if fail is not None:
                    raise fail
                break
    return seen


# -- the callback form ---------------------------------------------------------------------


async def test_the_callback_form_returns_what_an_unstreamed_run_returns() -> None:
    agent = Agent(ScriptedChatClient(tool_script() + tool_script()), tools=[add])
    seen: list[Update] = []

    async def on_update(update: Update) -> None:
        seen.append(update)

    streamed = await agent.run("add 1 and 2", on_update=on_update)
    assert streamed == await agent.run("add 1 and 2")
    assert [u.kind for u in seen] == [
        "text",
        "text",
        "tool_call",
        "usage",
        "tool_result",
        "text",
        "text",
        "usage",
    ]
    assert seen[4].message == ChatMessage.tool("c1", "3", name="add")
    assert AgentResponse.from_updates(seen) == streamed
    assert streamed.usage == Usage(14, 4)
    assert agent.chat_client.requests[0].streamed  # type: ignore[attr-defined]


async def test_every_update_is_awaited_in_the_callers_task() -> None:
    where = contextvars.ContextVar("where", default="unset")
    tasks: set[int] = set()

    async def on_update(update: Update) -> None:
        tasks.add(anyio.get_current_task().id)
        where.set("set by the callback")

    await Agent(EchoChatClient()).run("one two three", on_update=on_update)
    assert tasks == {anyio.get_current_task().id}
    assert where.get() == "set by the callback"  # same task, same context: nothing copied


async def test_a_client_without_stream_still_streams_its_answer() -> None:
    answer = AgentResponse((ChatMessage.assistant("whole answer"),), Usage(1, 2))

    class OnlyComplete:
        async def complete(self, messages: Any, options: Any) -> AgentResponse:
            return answer

    seen: list[Update] = []

    async def on_update(update: Update) -> None:
        seen.append(update)

    response = await Agent(OnlyComplete()).run("hi", on_update=on_update)
    assert response is answer
    assert seen == [Update.of_text("whole answer"), Update.of_usage(Usage(1, 2))]


async def test_middleware_of_both_stacks_can_wrap_on_update() -> None:
    log: list[str] = []

    async def run_middleware(invocation: Invocation, call_next: Any) -> AgentResponse:
        assert invocation.on_update is not None
        send = invocation.on_update

        async def on_update(update: Update) -> None:
            log.append(f"run:{update.kind}")
            await send(update)

        return await call_next(attrs.evolve(invocation, on_update=on_update))  # type: ignore[no-any-return]

    async def chat_middleware(request: ChatRequest, call_next: Any) -> AgentResponse:
        assert request.on_update is not None
        send = request.on_update

        async def on_update(update: Update) -> None:
            log.append(f"chat:{update.kind}")
            await send(update.__class__.of_text(update.text.upper()) if update.text else update)

        return await call_next(attrs.evolve(request, on_update=on_update))  # type: ignore[no-any-return]

    agent = Agent(
        ScriptedChatClient(tool_script()),
        tools=[add],
        stack=[Recorder("p", []), run_middleware, Recorder("q", [])],
        chat_stack=[chat_middleware],
    )
    seen: list[Update] = []

    async def on_update(update: Update) -> None:
        seen.append(update)

    response = await agent.run("add", on_update=on_update)
    # The chat middleware sees each model call's updates, the run middleware everything.
    assert log[:3] == ["chat:text", "run:text", "chat:text"]
    assert [e for e in log if e.startswith("chat:")] == [
        "chat:text",
        "chat:text",
        "chat:tool_call",
        "chat:usage",
        "chat:text",
        "chat:text",
        "chat:usage",
    ]
    assert [e.split(":")[1] for e in log if e.startswith("run:")] == [u.kind for u in seen]
    assert texts(seen) == ["LET ME ", "ADD.", "IT IS ", "3."]
    # The response is what the model said: a middleware that changes updates changes
    # what the consumer sees, not the answer.
    assert response.text == "It is 3."


async def test_an_error_mid_stream_reaches_post_stages_and_the_caller_unchanged() -> None:
    dropped = ConnectionError("dropped mid-stream")
    log: list[Any] = []
    agent = Agent(ScriptedChatClient([["Hel", dropped]]), stack=[Recorder("p", log)])
    seen: list[Update] = []

    async def on_update(update: Update) -> None:
        seen.append(update)

    with pytest.raises(ConnectionError) as raised:
        await agent.run("hi", on_update=on_update)
    assert raised.value is dropped
    assert texts(seen) == ["Hel"]
    assert log[-1] == ("post", "p", None, dropped)


async def test_a_callback_that_raises_ends_the_run_and_closes_the_models_stream() -> None:
    model = HangingModel(["one ", "two "])
    log: list[Any] = []

    class Enough(Exception):
        pass

    async def on_update(update: Update) -> None:
        raise Enough

    with pytest.raises(Enough):
        await Agent(model, stack=[Recorder("p", log)]).run("hi", on_update=on_update)
    assert model.closed
    assert not model.cancelled
    assert isinstance(log[-1][3], Enough)


async def test_a_cancelled_streamed_run_closes_the_models_stream() -> None:
    model = HangingModel(["one "])
    log: list[Any] = []
    seen: list[Update] = []

    async def on_update(update: Update) -> None:
        seen.append(update)

    with anyio.move_on_after(0.05) as scope:
        await Agent(model, stack=[Recorder("p", log)]).run("hi", on_update=on_update)
    assert scope.cancelled_caught
    assert model.closed
    assert model.cancelled
    assert isinstance(log[-1][3], anyio.get_cancelled_exc_class())


async def test_a_stream_that_yields_no_update_is_a_type_error() -> None:
    class Bad:
        async def complete(self, messages: Any, options: Any) -> AgentResponse:
            return AgentResponse()

        async def stream(self, messages: Any, options: Any) -> AsyncIterator[Any]:
            yield "text"

    async def on_update(update: Update) -> None:
        pass

    with pytest.raises(TypeError, match=r"Bad.stream\(\) yielded 'text', not a raf.Update"):
        await Agent(Bad()).run("hi", on_update=on_update)


async def test_a_stream_that_is_no_async_iterator_says_how_to_write_it() -> None:
    class Bad:
        async def complete(self, messages: Any, options: Any) -> AgentResponse:
            return AgentResponse()

        async def stream(self, messages: Any, options: Any) -> list[Update]:
            return []

    async def on_update(update: Update) -> None:
        pass

    with pytest.raises(TypeError, match=r"Bad.stream\(\) must return an async iterator"):
        await Agent(Bad()).run("hi", on_update=on_update)


async def test_on_update_must_be_callable() -> None:
    with pytest.raises(TypeError, match="on_update must be an async function"):
        await Agent(EchoChatClient()).run("hi", on_update="print")  # type: ignore[arg-type]


# -- the iterator form ---------------------------------------------------------------------


async def test_the_iterator_form_gives_each_update_then_the_response() -> None:
    agent = Agent(ScriptedChatClient(tool_script() + tool_script()), tools=[add])
    async with agent.stream("add 1 and 2") as stream:
        seen = [update async for update in stream]
    assert stream.response == await agent.run("add 1 and 2")
    assert AgentResponse.from_updates(seen) == stream.response
    assert texts(seen) == ["Let me ", "add.", "It is ", "3."]


async def test_the_run_waits_for_the_consumer() -> None:
    log: list[tuple[str, int]] = []

    class Counting:
        async def complete(self, messages: Any, options: Any) -> AgentResponse:
            raise AssertionError

        async def stream(self, messages: Any, options: Any) -> AsyncIterator[Update]:
            for number in range(20):
                log.append(("made", number))
                yield Update.of_text(f"{number} ")

    async with Agent(Counting()).stream("count") as stream:
        async for update in stream:
            log.append(("took", int(update.text)))
            await anyio.sleep(0.001)  # a slow consumer
    # The run makes the next update only once the consumer asks for it.
    assert log == [(event, n) for n in range(20) for event in ("made", "took")]
    assert stream.response is not None
    assert stream.response.text.split() == [str(n) for n in range(20)]


async def test_an_early_close_gives_post_stages_the_partial_not_under_cancellation() -> None:
    log: list[Any] = []
    model = HangingModel(["one ", "two ", "three "])
    agent = Agent(model, stack=[Recorder("outer", log), Recorder("inner", log)])
    async with agent.stream("hi") as stream:
        async for update in stream:
            if update.text == "two ":
                break
        log.append(("left the loop",))
    log.append(("after the block",))
    assert stream.response is None
    assert model.closed
    assert [entry[:2] for entry in log] == [
        ("pre", "outer"),
        ("pre", "inner"),
        ("left the loop",),
        ("post", "inner"),
        ("post", "outer"),
        ("after the block",),
    ]
    errors = [entry[3] for entry in log if entry[0] == "post"]
    assert isinstance(errors[0], StreamClosedError)
    assert errors[0] is errors[1]
    assert errors[0].partial == AgentResponse((ChatMessage.assistant("one two "),))
    assert all(entry[2] is None for entry in log if entry[0] == "post")


async def test_an_early_close_cancels_the_model_waiting_for_its_next_chunk() -> None:
    log: list[Any] = []
    model = HangingModel(["only "])
    with anyio.fail_after(5):
        async with Agent(model, stack=[Recorder("p", log)]).stream("hi") as stream:
            # The consumer asks for the next update, the run waits for the model: stop.
            seen = await read_until(stream, model.waiting)
    assert texts(seen) == ["only "]
    assert model.cancelled
    assert model.closed
    error = log[-1][3]
    assert isinstance(error, StreamClosedError)
    assert error.partial.text == "only "


async def test_an_early_close_cancels_running_tools() -> None:
    started: list[str] = []
    cancelled: list[str] = []
    both_running = anyio.Event()

    @tool
    async def slow(name: str) -> str:
        """Wait for ever."""
        started.append(name)
        if len(started) == 2:
            both_running.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.append(name)
        return name  # pragma: no cover

    calls = [ToolCall("a", "slow", '{"name": "a"}'), ToolCall("b", "slow", '{"name": "b"}')]
    log: list[Any] = []
    agent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(*calls)]),
        tools=[slow],
        stack=[Recorder("p", log)],
    )
    with anyio.fail_after(5):
        async with agent.stream("go") as stream:
            seen = await read_until(stream, both_running)
    assert [u.tool_call for u in seen] == calls
    assert sorted(cancelled) == ["a", "b"]
    error = log[-1][3]
    assert isinstance(error, StreamClosedError)
    assert error.partial.messages == (ChatMessage.assistant(None, tool_calls=calls),)


async def test_an_exception_in_the_block_is_an_early_close_and_comes_out_unchanged() -> None:
    log: list[Any] = []
    mistake = KeyError("consumer bug")
    agent = Agent(EchoChatClient(), stack=[Recorder("p", log)])
    with pytest.raises(KeyError) as raised:
        await consume(agent, "a b c", stop_after=1, fail=mistake)
    assert raised.value is mistake
    assert isinstance(log[-1][3], StreamClosedError)
    assert log[-1][3].partial.text == "a "


async def test_leaving_without_reading_closes_the_run_before_the_model() -> None:
    log: list[Any] = []
    client = ScriptedChatClient(["never asked"])
    async with Agent(client, stack=[Recorder("p", log)]).stream("hi"):
        pass
    assert client.requests == []
    assert [entry[:2] for entry in log] == [("pre", "p"), ("post", "p")]
    assert log[-1][3].partial == AgentResponse()


async def test_post_failures_of_an_early_close_are_raised_from_the_block() -> None:
    log: list[Any] = []
    agent = Agent(
        HangingModel(["x "]),
        stack=[Recorder("outer", log, fail_post=True), Recorder("inner", log, fail_post=True)],
    )
    with pytest.raises(ProviderError) as raised:
        await consume(agent, "hi", stop_after=1)
    assert (raised.value.provider, raised.value.stage) == ("inner", "on_invoked")
    assert isinstance(raised.value.__cause__, OSError)
    assert any("outer.on_invoked" in note for note in raised.value.__notes__)


async def test_the_consumers_own_exception_wins_and_carries_the_post_failures() -> None:
    log: list[Any] = []
    agent = Agent(HangingModel(["x "]), stack=[Recorder("p", log, fail_post=True)])
    with pytest.raises(KeyError) as raised:
        await consume(agent, "hi", stop_after=1, fail=KeyError("mine"))
    assert any("p.on_invoked" in note for note in raised.value.__notes__)


async def test_a_post_failure_of_a_completed_run_is_raised_from_the_iteration() -> None:
    log: list[Any] = []
    agent = Agent(EchoChatClient(), stack=[Recorder("p", log, fail_post=True)])
    with pytest.raises(ProviderError, match=r"p.on_invoked failed"):
        await consume(agent, "hi")
    assert log[-1][2] == AgentResponse((ChatMessage.assistant("hi"),), Usage(1, 1))


class ModelFatal(BaseException):
    """A BaseException from the model, that is not a cancellation."""


@pytest.mark.parametrize("failure", [ConnectionError("dropped"), ModelFatal("stop")])
async def test_an_error_mid_stream_reaches_the_consumer_unchanged(failure: BaseException) -> None:
    log: list[Any] = []
    agent = Agent(ScriptedChatClient([["Hel", failure]]), stack=[Recorder("p", log)])
    with pytest.raises(type(failure)) as raised:
        await consume(agent, "hi")
    assert raised.value is failure  # never an exception group
    assert log[-1][3] is failure
    assert log[-1][2] is None


async def test_the_consumer_may_catch_the_runs_error_in_the_block() -> None:
    agent = Agent(ScriptedChatClient([["Hel", ConnectionError("dropped")]]))
    async with agent.stream("hi") as stream:
        with pytest.raises(ConnectionError):
            async for _ in stream:
                pass
    assert stream.response is None


async def test_a_cancelled_consumer_follows_the_cancellation_rules() -> None:
    log: list[Any] = []
    model = HangingModel(["one "])
    agent = Agent(model, stack=[Recorder("outer", log), Recorder("inner", log)])
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        async with agent.stream("hi") as stream:
            async for _ in stream:
                scope.cancel()
                await anyio.sleep(1)
    assert scope.cancelled_caught  # the cancellation propagated, unwrapped
    assert model.closed
    errors = [entry[3] for entry in log if entry[0] == "post"]
    assert [entry[1] for entry in log if entry[0] == "post"] == ["inner", "outer"]
    # Shielded: the post stages' own awaits worked (Recorder awaits before logging).
    assert all(isinstance(error, anyio.get_cancelled_exc_class()) for error in errors)


async def test_a_cancelled_consumers_hung_post_stage_is_bounded() -> None:
    class Hung(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            await anyio.sleep_forever()

    agent = Agent(HangingModel(["one "]), stack=[Hung()], post_timeout=0.05)
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        async with agent.stream("hi") as stream:
            async for _ in stream:
                scope.cancel()
                await anyio.sleep(1)
    assert scope.cancelled_caught


async def test_a_stream_is_entered_once_and_iterated_inside_its_block() -> None:
    stream = Agent(EchoChatClient()).stream("hi")
    with pytest.raises(RuntimeError, match="inside its block"):
        await stream.__anext__()
    async with stream:
        pass
    with pytest.raises(RuntimeError, match="entered only once"):
        async with stream:
            pass


async def test_stream_checks_its_arguments_when_called() -> None:
    agent = Agent(EchoChatClient())
    with pytest.raises(TypeError, match="run\\(messages\\) takes a str"):
        agent.stream(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="options must be AgentRunOptions"):
        agent.stream("hi", options={})  # type: ignore[arg-type]


async def test_a_callback_run_inside_a_tool_of_a_streamed_run_is_its_own() -> None:
    inner = Agent(EchoChatClient())
    inner_seen: list[Update] = []

    @tool
    async def ask(question: str) -> str:
        """Ask the inner agent."""

        async def on_update(update: Update) -> None:
            inner_seen.append(update)

        return (await inner.run(question, on_update=on_update)).text

    outer = Agent(
        ScriptedChatClient(
            [ScriptedChatClient.tool_turn(ToolCall("q", "ask", '{"question": "deep"}')), "done"]
        ),
        tools=[ask],
    )
    async with outer.stream("go") as stream:
        seen = [update async for update in stream]
    assert texts(inner_seen) == ["deep"]
    assert [u.message.content for u in seen if u.message is not None] == ["deep"]
    assert stream.response is not None
    assert stream.response.text == "done"


async def test_chat_options_reach_the_stream() -> None:
    client = ScriptedChatClient(["ok"])
    agent = Agent(client, tools=[add])
    async with agent.stream("hi") as stream:
        [_ async for _ in stream]
    options: ChatOptions = client.requests[0].options
    assert [t.name for t in options.tools] == ["add"]
    assert client.requests[0].streamed


async def test_providers_that_add_context_keep_the_run_streamed() -> None:
    class Adds(ContextProvider):
        def __init__(self, result: ContextResult) -> None:
            self.result = result

        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            return self.result

    stack = [
        Adds(ContextResult(instructions="Be brief.")),  # merge's fast path
        Adds(ContextResult(messages=[ChatMessage.user("earlier")], tools=[add])),
        Adds(ContextResult(replace_messages=True)),
    ]
    seen: list[Update] = []

    async def on_update(update: Update) -> None:
        seen.append(update)

    await Agent(EchoChatClient(), stack=stack).run("a b", on_update=on_update)
    assert texts(seen) == ["a ", "b"]


async def test_updates_sent_concurrently_are_handed_over_one_by_one() -> None:
    async def announce(invocation: Invocation, call_next: Any) -> AgentResponse:
        send = invocation.on_update
        assert send is not None
        async with anyio.create_task_group() as group:
            for word in ("one ", "two ", "three "):
                group.start_soon(send, Update.of_text(word))
        return await call_next(invocation)  # type: ignore[no-any-return]

    agent = Agent(EchoChatClient(), stack=[announce])
    async with agent.stream("four") as stream:
        seen = texts([update async for update in stream])
    assert sorted(seen[:3]) == ["one ", "three ", "two "]
    assert seen[3:] == ["four"]


async def test_a_run_failing_unseen_before_a_cancellation_is_a_note_on_it() -> None:
    class Broken(ContextProvider):
        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            raise OSError("index unavailable")

    agent = Agent(EchoChatClient(), stack=[Broken()])
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        try:
            async with agent.stream("hi"):
                await anyio.sleep(0.05)  # the run fails meanwhile, before we read
                scope.cancel()
                await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as cancelled:
            notes = getattr(cancelled, "__notes__", [])
            raise
    assert scope.cancelled_caught
    assert any("ProviderError" in note and "index unavailable" in note for note in notes)


async def test_leaving_after_the_last_update_is_still_an_early_close() -> None:
    log: list[Any] = []
    agent = Agent(EchoChatClient(), stack=[Recorder("p", log)])
    async with agent.stream("a b") as stream:
        async for update in stream:
            if update.kind == "usage":  # the last one: the run waits for us to ask again
                break
    assert stream.response is None
    error = log[-1][3]
    assert isinstance(error, StreamClosedError)
    assert error.partial == AgentResponse((ChatMessage.assistant("a b"),), Usage(2, 2))


# --- The iterator form reads the model's stream in the consumer's task -------------------


class WaitingModel:
    """Streams ``first``, waits for ``go``, streams ``then``; records how its wait ended."""

    def __init__(self, first: str, then: str) -> None:
        self.first, self.then = first, then
        self.waiting = anyio.Event()
        self.go = anyio.Event()
        self.cancelled = False
        self.closed = False

    async def complete(self, messages: Any, options: Any) -> AgentResponse:
        raise AssertionError("a streamed run calls stream()")

    async def stream(self, messages: Any, options: Any) -> AsyncIterator[Update]:
        try:
            yield Update.of_text(self.first)
            self.waiting.set()
            try:
                await self.go.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled = True
                raise
            yield Update.of_text(self.then)
        finally:
            self.closed = True


async def test_the_models_stream_sees_the_runs_context_variables() -> None:
    tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="none")

    async def tagging(request: ChatRequest, call_next: Any) -> AgentResponse:
        tag.set("set by the chat stack")
        return await call_next(request)  # type: ignore[no-any-return]

    class Tagged:
        async def complete(self, messages: Any, options: Any) -> AgentResponse:
            raise AssertionError

        async def stream(self, messages: Any, options: Any) -> AsyncIterator[Update]:
            for _ in range(2):
                yield Update.of_text(tag.get() + " ")

    tag.set("the consumer's")
    async with Agent(Tagged(), chat_stack=[tagging]).stream("hi") as stream:
        seen = texts([update async for update in stream])
        assert tag.get() == "the consumer's"  # and the run's own stays the run's
    assert seen == ["set by the chat stack "] * 2


async def test_a_chat_middlewares_deadline_stops_a_model_that_waits() -> None:
    async def deadline(request: ChatRequest, call_next: Any) -> AgentResponse:
        with anyio.fail_after(0.05):
            return await call_next(request)  # type: ignore[no-any-return]

    log: list[Any] = []
    model = HangingModel(["only "])
    agent = Agent(model, stack=[Recorder("p", log)], chat_stack=[deadline])
    seen: list[Update] = []

    async def read_all() -> None:
        async with agent.stream("hi") as stream:
            async for update in stream:
                seen.append(update)

    with pytest.raises(TimeoutError) as raised:
        await read_all()
    assert texts(seen) == ["only "]
    assert model.cancelled
    assert model.closed
    assert log[-1][3] is raised.value  # the post stage saw what the consumer got


@pytest.mark.parametrize("outer_deadline", [False, True])
async def test_a_cancelled_read_loses_nothing(outer_deadline: bool) -> None:
    # Was: a cancelled read took the model's stream with it, and reading again raised
    # StreamClosedError. Now the run stays where it was; only leaving the block ends it.
    model = WaitingModel("first ", "then ")
    agent = Agent(model)
    with anyio.fail_after(5) if outer_deadline else anyio.CancelScope():
        async with agent.stream("hi") as stream:
            assert (await stream.__anext__()).text == "first "
            with anyio.move_on_after(0.02) as waited:
                await stream.__anext__()  # the model waits for ``go``
            assert waited.cancelled_caught
            assert not model.cancelled
            model.go.set()
            rest = [update async for update in stream]
    assert texts(rest) == ["then "]
    assert stream.response is not None
    assert stream.response.text == "first then "
    assert model.closed


async def test_a_read_cancelled_while_the_update_waits_gets_it_next_time() -> None:
    # The update is at the hand-over already: a read cancelled before it runs (its scope
    # cancelled at once) leaves it there for the next read.
    agent = Agent(EchoChatClient())
    async with agent.stream("a b") as stream:
        first = await stream.__anext__()
        await anyio.sleep(0.01)  # the run hands the next update over meanwhile
        with anyio.CancelScope() as scope:
            scope.cancel()
            await stream.__anext__()
        rest = [update async for update in stream]
    assert [first.text, *texts(rest)] == ["a ", "b"]
    assert AgentResponse.from_updates([first, *rest]) == stream.response


class TickingModel:
    """A model that sends ``count`` words, one every ``tick`` seconds."""

    def __init__(self, count: int, tick: float) -> None:
        self.words = [f"w{i} " for i in range(count)]
        self.tick = tick

    async def complete(self, messages: Any, options: Any) -> AgentResponse:
        raise AssertionError("streamed only")

    async def stream(self, messages: Any, options: Any) -> AsyncIterator[Update]:
        for word in self.words:
            await anyio.sleep(self.tick)
            yield Update.of_text(word)


async def test_reads_cancelled_at_any_moment_lose_no_update() -> None:
    # Each read races its own deadline against the next update's hand-over, at many
    # offsets around it: whichever wins, every update is read once, in order.
    model = TickingModel(60, 0.002)
    got: list[str] = []
    with anyio.fail_after(20):
        async with Agent(model).stream("hi") as stream:
            for attempt in range(100_000):
                with anyio.move_on_after(0.0005 * (attempt % 7)):
                    try:
                        got.append((await stream.__anext__()).text)
                    except StopAsyncIteration:
                        break
    assert got == model.words
    assert stream.response is not None


@pytest.mark.parametrize("outer_deadline", [False, True])
async def test_leaving_after_a_cancelled_read_is_an_early_close(outer_deadline: bool) -> None:
    # Was test_reading_again_after_a_cancelled_read_raises_the_closed_stream: the early
    # close now comes from leaving the block, not from reading again.
    log: list[Any] = []
    model = HangingModel(["only "])
    agent = Agent(model, stack=[Recorder("p", log)])
    with anyio.fail_after(5) if outer_deadline else anyio.CancelScope():
        async with agent.stream("hi") as stream:
            assert (await stream.__anext__()).text == "only "
            with anyio.move_on_after(0.02) as waited:
                await stream.__anext__()
            assert waited.cancelled_caught
            assert not model.closed  # the run goes on: the model still thinks
    assert model.cancelled
    assert model.closed
    error = log[-1][3]
    assert isinstance(error, StreamClosedError)
    assert error.partial.text == "only "
    assert stream.response is None


async def test_a_stream_is_read_by_one_task_at_a_time() -> None:
    model = HangingModel(["one "])
    with anyio.fail_after(5):
        async with Agent(model).stream("hi") as stream:
            await stream.__anext__()
            async with anyio.create_task_group() as group:
                group.start_soon(stream.__anext__)
                await model.waiting.wait()
                with pytest.raises(RuntimeError, match="one task at a time"):
                    await stream.__anext__()
                group.cancel_scope.cancel()


@pytest.mark.parametrize("outer_deadline", [False, True])
async def test_a_cancellation_from_inside_the_run_acts_at_once(outer_deadline: bool) -> None:
    """A middleware cancels its own scope while the consumer's read waits for the model."""
    scopes: list[anyio.CancelScope] = []

    async def stoppable(request: ChatRequest, call_next: Any) -> AgentResponse:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            return await call_next(request)  # type: ignore[no-any-return]
        return AgentResponse((ChatMessage.assistant("stopped"),))

    model = WaitingModel("first ", "then ")
    agent = Agent(model, chat_stack=[stoppable])

    async def stop_then_go() -> None:
        await model.waiting.wait()
        scopes[0].cancel()
        await anyio.sleep(0.02)
        model.go.set()

    seen: list[Update] = []
    with anyio.fail_after(5) if outer_deadline else anyio.CancelScope():
        async with anyio.create_task_group() as group:
            group.start_soon(stop_then_go)
            async with agent.stream("hi") as stream:
                seen = [update async for update in stream]
    assert stream.response is not None
    assert stream.response.text == "stopped"
    assert model.closed
    # Was: without an outer deadline the cancellation landed only with the model's next
    # chunk. The run reads its own model now: with a deadline or not, it acts at once.
    assert model.cancelled
    assert texts(seen) == ["first "]


async def test_two_model_streams_at_once_both_reach_the_consumer() -> None:
    async def twice(request: ChatRequest, call_next: Any) -> AgentResponse:
        """Calls the model twice at once and keeps the first answer (a hedged request)."""
        answers: list[AgentResponse] = []

        async def call() -> None:
            answers.append(await call_next(request))

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            group.start_soon(call)
        return answers[0]

    agent = Agent(EchoChatClient(), chat_stack=[twice])
    with anyio.fail_after(5):
        async with agent.stream("a b") as stream:
            seen = texts([update async for update in stream])
    assert sorted(seen) == ["a ", "a ", "b", "b"]
    assert stream.response is not None
    assert stream.response.text == "a b"


async def test_a_post_failure_after_a_cancelled_read_is_raised_from_the_block() -> None:
    # Was: reading again raised StreamClosedError with the failure as a note. A cancelled
    # read ends nothing now: leaving the block is the early close, which raises it.
    log: list[Any] = []
    model = HangingModel(["only "])
    agent = Agent(model, stack=[Recorder("p", log, fail_post=True)])

    async def read_then_leave() -> None:
        async with agent.stream("hi") as stream:
            await stream.__anext__()
            with anyio.move_on_after(0.02):
                await stream.__anext__()

    with pytest.raises(ProviderError) as raised:
        await read_then_leave()
    assert (raised.value.provider, raised.value.stage) == ("p", "on_invoked")
    assert isinstance(raised.value.__cause__, OSError)
    assert "p cannot write" in str(raised.value)
    assert isinstance(log[-1][3], StreamClosedError)


async def test_a_consumers_deadline_during_a_read_is_a_cancellation() -> None:
    log: list[Any] = []
    model = HangingModel(["only "])
    agent = Agent(model, stack=[Recorder("p", log)])
    seen: list[Update] = []
    with anyio.move_on_after(0.05) as scope:
        async with agent.stream("hi") as stream:
            async for update in stream:  # the second read waits for the model
                seen.append(update)
    assert scope.cancelled_caught
    assert texts(seen) == ["only "]
    assert model.cancelled
    assert model.closed
    assert isinstance(log[-1][3], anyio.get_cancelled_exc_class())
    assert stream.response is None


async def test_a_middleware_may_send_more_or_fewer_updates_than_the_model() -> None:
    async def split_and_drop(request: ChatRequest, call_next: Any) -> AgentResponse:
        send = request.on_update
        assert send is not None

        async def on_update(update: Update) -> None:
            if update.kind == "usage":
                return  # dropped
            for letter in update.text:
                await send(Update.of_text(letter))

        return await call_next(attrs.evolve(request, on_update=on_update))  # type: ignore[no-any-return]

    agent = Agent(EchoChatClient(), chat_stack=[split_and_drop])
    async with agent.stream("ab cd") as stream:
        seen = [update async for update in stream]
    assert [update.text for update in seen] == ["a", "b", " ", "c", "d"]
    assert stream.response is not None
    assert stream.response.text == "ab cd"  # what the model said, as unstreamed


async def test_a_read_cancelled_while_a_middleware_waits_is_an_early_close() -> None:
    async def slow_second(request: ChatRequest, call_next: Any) -> AgentResponse:
        send = request.on_update
        assert send is not None
        count = 0

        async def on_update(update: Update) -> None:
            nonlocal count
            count += 1
            if count == 2:
                await anyio.sleep(5)  # the read waits here, not in the model
            await send(update)

        return await call_next(attrs.evolve(request, on_update=on_update))  # type: ignore[no-any-return]

    log: list[Any] = []
    model = HangingModel(["one ", "two ", "three "])
    agent = Agent(model, stack=[Recorder("p", log)], chat_stack=[slow_second])
    async with agent.stream("hi") as stream:
        first = await stream.__anext__()
        with anyio.move_on_after(0.05) as waited:
            await stream.__anext__()
    assert waited.cancelled_caught
    assert first.text == "one "
    assert model.closed
    assert not model.cancelled  # it was waiting at its yield, not in an await: closed
    error = log[-1][3]
    assert isinstance(error, StreamClosedError)
    assert error.partial.text == "one "


async def test_a_deadline_inside_the_run_acts_while_the_consumer_is_idle() -> None:
    fired = anyio.Event()

    async def deadline(request: ChatRequest, call_next: Any) -> AgentResponse:
        try:
            with anyio.fail_after(0.05):
                return await call_next(request)  # type: ignore[no-any-return]
        finally:
            fired.set()

    posted = anyio.Event()

    class Posted(Recorder):
        async def on_invoked(self, *args: Any) -> None:
            await super().on_invoked(*args)
            posted.set()

    log: list[Any] = []
    model = HangingModel(["only "])
    agent = Agent(model, stack=[Posted("p", log)], chat_stack=[deadline])
    with anyio.fail_after(5):
        async with agent.stream("hi") as stream:
            assert (await stream.__anext__()).text == "only "
            # The consumer does not read: the run is paused at the hand-over, and its
            # deadline still passes there, then its post stages run.
            await fired.wait()
            await posted.wait()
            with pytest.raises(TimeoutError) as raised:
                await stream.__anext__()
    assert model.closed
    assert log[-1][3] is raised.value


class HangsOnClose(ContextProvider):
    """A post stage that never returns on an early close (the red-team finding)."""

    async def on_invoked(
        self, agent: Any, session: Any, messages: Any, response: Any, error: Any
    ) -> None:
        if isinstance(error, StreamClosedError):
            await anyio.sleep_forever()


async def test_early_close_post_stages_are_bounded_by_post_timeout() -> None:
    log: list[Any] = []
    agent = Agent(
        HangingModel(["one ", "two "]),
        stack=[Recorder("outer", log), HangsOnClose()],
        post_timeout=0.1,
    )
    # The bound shows in the error (its cause a TimeoutError naming post_timeout); the
    # fail_after only keeps a regression from hanging the suite.
    with anyio.fail_after(30), pytest.raises(ProviderError) as raised:
        await consume(agent, "hi", stop_after=1)
    assert (raised.value.provider, raised.value.stage) == ("HangsOnClose", "on_invoked")
    assert isinstance(raised.value.__cause__, TimeoutError)
    assert "post_timeout=0.1" in str(raised.value)
    # The others still ran, with the error, not under cancellation (Recorder awaits).
    assert log[-1][:2] == ("post", "outer")
    assert isinstance(log[-1][3], StreamClosedError)


async def test_a_hung_early_close_post_stage_is_a_note_on_the_consumers_exception() -> None:
    agent = Agent(HangingModel(["one "]), stack=[HangsOnClose()], post_timeout=0.05)
    with anyio.fail_after(5), pytest.raises(KeyError) as raised:
        await consume(agent, "hi", stop_after=1, fail=KeyError("mine"))
    assert any("HangsOnClose.on_invoked" in note for note in raised.value.__notes__)


async def test_a_streamed_run_inside_a_tool_of_an_early_closed_stream_is_cancelled() -> None:
    # The nested run is not the outer stream's: it sees a cancellation, not its close.
    inner_log: list[Any] = []
    inner = Agent(HangingModel(["deep "]), stack=[Recorder("inner", inner_log)])
    asked = anyio.Event()

    @tool
    async def ask(question: str) -> str:
        """Ask the inner agent."""

        async def on_update(update: Update) -> None:
            asked.set()

        return (await inner.run(question, on_update=on_update)).text

    log: list[Any] = []
    outer = Agent(
        ScriptedChatClient(
            [ScriptedChatClient.tool_turn(ToolCall("q", "ask", '{"question": "x"}'))]
        ),
        tools=[ask],
        stack=[Recorder("outer", log)],
    )
    with anyio.fail_after(5):
        async with outer.stream("go") as stream:
            await read_until(stream, asked)
    assert isinstance(log[-1][3], StreamClosedError)
    assert isinstance(inner_log[-1][3], anyio.get_cancelled_exc_class())


class CancelsItsCallerThenFails(ContextProvider):
    """A post stage during which the caller's own deadline fires, and which then fails."""

    def __init__(self) -> None:
        self.scope: anyio.CancelScope | None = None

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Any,
        response: Any,
        error: BaseException | None,
    ) -> None:
        assert self.scope is not None
        self.scope.cancel()
        raise OSError("the post stage broke")


async def test_a_cancellation_during_an_early_close_propagates_with_the_failure_noted() -> None:
    # Found by the red team: the early close's post stages ran, the caller's deadline
    # fired meanwhile, and the failure was dropped (asyncio) or replaced the
    # cancellation (trio).
    provider = CancelsItsCallerThenFails()
    agent = Agent(EchoChatClient(), stack=[provider])
    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:
        provider.scope = scope
        try:
            async with agent.stream("hello big world") as stream:
                async for _ in stream:
                    break
        except BaseException as exc:
            caught.append(exc)
            raise
    assert scope.cancelled_caught
    assert len(caught) == 1
    assert isinstance(caught[0], anyio.get_cancelled_exc_class())
    assert "the post stage broke" in " ".join(getattr(caught[0], "__notes__", []))
