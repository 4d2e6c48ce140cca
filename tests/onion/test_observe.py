"""Observers: the hooks a run offers around itself, its provider stages, model and tool calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import raf.otel
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatRequest,
    ContextProvider,
    ContextResult,
    Invocation,
    ProviderError,
    RetryMiddleware,
    ScriptedChatClient,
    ToolCall,
    ToolRequest,
    parallel,
    tool,
)
from raf.errors import RateLimitError
from raf.observe import Observer, ProviderStage, StageEvent, TraceObserver

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn


class Journal(Observer):
    """Writes ``name:what>`` on the way in and ``name:what<`` (or ``!Error``) on the way out."""

    def __init__(self, journal: list[str], name: str = "") -> None:
        self.journal = journal
        self.prefix = f"{name}:" if name else ""
        self.stages: list[ProviderStage] = []

    async def _around(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        self.journal.append(f"{self.prefix}{what}>")
        try:
            result = await call()
        except BaseException as error:
            self.journal.append(f"{self.prefix}{what}!{type(error).__name__}")
            raise
        self.journal.append(f"{self.prefix}{what}<")
        return result

    async def run(self, invocation: Invocation, call_next: Any) -> AgentResponse:
        result: AgentResponse = await self._around("run", lambda: call_next(invocation))
        return result

    async def provider_stage(self, stage: ProviderStage, call_next: Any) -> Any:
        self.stages.append(stage)
        return await self._around(f"{stage.name}.{stage.stage}", call_next)

    async def model_call(self, request: ChatRequest, call_next: Any) -> AgentResponse:
        result: AgentResponse = await self._around("model", lambda: call_next(request))
        return result

    async def model_attempt(self, request: ChatRequest, call_next: Any) -> AgentResponse:
        result: AgentResponse = await self._around("attempt", lambda: call_next(request))
        return result

    async def tool_call(self, request: ToolRequest, call_next: Any) -> ChatMessage:
        result: ChatMessage = await self._around(
            f"tool {request.tool.name}", lambda: call_next(request)
        )
        return result


class SeesAll(Journal):
    """A journal that sees the post stages inherited from ContextProvider too."""

    inherited_post_stages = True


class Named(ContextProvider):
    """A pre stage; a post stage of its own only with ``post=True``."""

    kind = "test"

    def __init__(self, name: str, *, fail: bool = False, post: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.post = post
        self.seen: list[BaseException | None] = []

    async def on_invoking(self, *args: Any) -> ContextResult:
        if self.fail:
            raise RuntimeError("boom")
        return ContextResult(instructions=self.name)


class WithPost(Named):
    async def on_invoked(self, *args: Any) -> None:
        self.seen.append(args[4])


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_the_hooks_wrap_the_run_its_stages_and_its_calls_in_order() -> None:
    journal: list[str] = []
    client = ScriptedChatClient(
        [RateLimitError("slow", status_code=429), turn(ToolCall("1", "add", '{"a": 1}')), "3"]
    )
    agent = Agent(
        client,
        tools=[add],
        stack=[WithPost("a"), parallel(Named("b"))],
        chat_stack=[RetryMiddleware(attempts=2, wait_initial=0, wait_max=0)],
        observers=[Journal(journal)],
    )
    assert (await agent.run("go")).text == "3"
    assert journal == [
        "run>",
        "a.on_invoking>",
        "a.on_invoking<",
        "b.on_invoking>",
        "b.on_invoking<",
        "model>",
        "attempt>",
        "attempt!RateLimitError",
        "attempt>",
        "attempt<",
        "model<",
        "tool add>",
        "tool add!ToolArgumentsError",  # b is missing: the model is told, the run goes on
        "model>",
        "attempt>",
        "attempt<",
        "model<",
        "a.on_invoked>",  # b's post stage is ContextProvider's, which does nothing: skipped
        "a.on_invoked<",
        "run<",
    ]


async def test_two_observers_nest_the_first_outermost() -> None:
    journal: list[str] = []
    agent = Agent(
        ScriptedChatClient(["ok"]),
        stack=[WithPost("a")],
        observers=[Journal(journal, "1"), Journal(journal, "2")],
    )
    await agent.run("hi")
    assert journal == [
        "1:run>",
        "2:run>",
        "1:a.on_invoking>",
        "2:a.on_invoking>",
        "2:a.on_invoking<",
        "1:a.on_invoking<",
        "1:model>",
        "2:model>",
        "1:attempt>",
        "2:attempt>",
        "2:attempt<",
        "1:attempt<",
        "2:model<",
        "1:model<",
        "1:a.on_invoked>",
        "2:a.on_invoked>",
        "2:a.on_invoked<",
        "1:a.on_invoked<",
        "2:run<",
        "1:run<",
    ]


async def test_a_stage_hook_sees_the_provider_and_the_runs_error() -> None:
    journal: list[str] = []
    everything: list[str] = []
    observer = Journal(journal)

    class Bare:  # no on_invoked at all: no post stage, observed or not
        name = "bare"

        async def on_invoking(self, *args: Any) -> ContextResult:
            return ContextResult()

    outer, inherited = WithPost("outer"), Named("inherited")
    agent = Agent(
        ScriptedChatClient([]),
        stack=[outer, inherited, Bare(), Named("x", fail=True)],
        observers=[observer, SeesAll(everything)],
    )
    with pytest.raises(ProviderError) as info:
        await agent.run("hi")
    assert journal == [
        "run>",
        "outer.on_invoking>",
        "outer.on_invoking<",
        "inherited.on_invoking>",
        "inherited.on_invoking<",
        "bare.on_invoking>",
        "bare.on_invoking<",
        "x.on_invoking>",
        "x.on_invoking!RuntimeError",  # the hook sees the stage's own error
        "outer.on_invoked>",
        "outer.on_invoked<",
        "run!ProviderError",
    ]
    # The inherited post stage, which does nothing, only for the observer that asks for it.
    inherited_post = ["inherited.on_invoked>", "inherited.on_invoked<"]
    assert everything == [*journal[:-3], *inherited_post, *journal[-3:]]
    stages = {(stage.name, stage.stage): stage for stage in observer.stages}
    post = stages["outer", "on_invoked"]
    assert (post.kind, post.error, post.provider) == ("test", info.value, outer)
    assert stages["bare", "on_invoking"].kind == "unknown"
    assert outer.seen == [info.value]


async def test_hooks_see_a_cancellation_and_every_post_stage_still_runs() -> None:
    journal: list[str] = []
    entered = anyio.Event()

    @tool
    async def hang() -> str:
        """Never returns."""
        entered.set()
        await anyio.sleep_forever()
        return "never"

    provider = WithPost("p")
    client = ScriptedChatClient([turn(ToolCall("1", "hang")), "never"])
    agent = Agent(client, tools=[hang], stack=[provider], observers=[Journal(journal)])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run, "go")
            await entered.wait()
            group.cancel_scope.cancel()
    cancelled = type(provider.seen[0]).__name__
    assert isinstance(provider.seen[0], anyio.get_cancelled_exc_class())
    assert journal == [
        "run>",
        "p.on_invoking>",
        "p.on_invoking<",
        "model>",
        "attempt>",
        "attempt<",
        "model<",
        "tool hang>",
        f"tool hang!{cancelled}",
        "p.on_invoked>",
        "p.on_invoked<",
        f"run!{cancelled}",
    ]


@pytest.mark.parametrize("form", ["callback", "iterator"])
async def test_a_streamed_call_passes_its_updates_through_the_model_hooks(form: str) -> None:
    seen: list[str] = []

    class Updates(Observer):
        async def model_attempt(self, request: ChatRequest, call_next: Any) -> AgentResponse:
            assert request.on_update is not None
            send = request.on_update

            async def on_update(update: Any) -> None:
                seen.append(update.text)
                await send(update)

            response: AgentResponse = await call_next(
                ChatRequest(request.messages, request.options, on_update)
            )
            return response

    agent = Agent(ScriptedChatClient([["one ", "two"]]), observers=[Updates()])
    got: list[str] = []
    if form == "callback":

        async def collect(update: Any) -> None:
            got.append(update.text)

        await agent.run("hi", on_update=collect)
    else:
        async with agent.stream("hi") as stream:
            got = [update.text async for update in stream]
    assert seen == got == ["one ", "two"]


async def test_an_observer_need_not_inherit_and_need_not_have_every_hook() -> None:
    names: list[str] = []

    class Tools:
        async def tool_call(self, request: ToolRequest, call_next: Any) -> ChatMessage:
            names.append(request.tool.name)
            message: ChatMessage = await call_next(request)
            return message

    client = ScriptedChatClient([turn(ToolCall("1", "add", '{"a": 1, "b": 2}')), "3"])
    agent = Agent(client, tools=[add], observers=[Tools(), Observer()])
    assert (await agent.run("go")).text == "3"
    assert names == ["add"]
    assert len(agent.observers) == 2
    assert (agent.stack, agent.chat_stack, agent.tool_stack) == ((), (), ())


def test_observers_are_checked_when_the_agent_is_built() -> None:
    client = ScriptedChatClient([])
    with pytest.raises(TypeError, match=r"observers\[0\] is the class Journal"):
        Agent(client, observers=[Journal])
    with pytest.raises(TypeError, match=r"observers\[1\] has none of the hooks"):
        Agent(client, observers=[Observer(), object()])
    with pytest.raises(TypeError, match="observers must be a list"):
        Agent(client, observers="trace")  # type: ignore[arg-type]


async def test_an_agent_with_tracing_and_otel_observers_reports_to_both() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    events: list[StageEvent] = []
    client = ScriptedChatClient([turn(ToolCall("1", "add", '{"a": 2, "b": 3}')), "5"])
    agent = Agent(
        client,
        name="both",
        tools=[add],
        stack=[WithPost("notes"), Named("clock")],
        observers=[TraceObserver(events.append)],
    )
    traced = raf.otel.instrument(agent, tracer_provider=provider)
    assert [type(o).__name__ for o in traced.observers] == ["SpanObserver", "TraceObserver"]
    assert (await traced.run("2 + 3?")).text == "5"
    assert [(e.provider, e.stage, e.outcome) for e in events] == [
        ("notes", "on_invoking", "ok"),
        ("clock", "on_invoking", "ok"),
        ("model", "complete", "ok"),
        ("add", "call", "ok"),
        ("model", "complete", "ok"),
        ("clock", "on_invoked", "ok"),  # the tracer reports the inherited post stage
        ("notes", "on_invoked", "ok"),
    ]
    spans = sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)
    run = spans[0]
    assert [span.name for span in spans] == [
        "invoke_agent both",
        "on_invoking notes",
        "on_invoking clock",
        "chat",
        "execute_tool add",
        "chat",
        "on_invoked notes",  # otel does not: no span for a post stage that does nothing
    ]
    assert all(span.parent is not None for span in spans[1:])
    assert {span.parent.span_id for span in spans[1:]} == {run.context.span_id}  # type: ignore[union-attr]
    provider.shutdown()
