"""raf.otel: the span trees of real runs, read back with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import anyio
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, StatusCode

import raf.otel
from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatMessage,
    ContextProvider,
    ContextResult,
    EchoChatClient,
    InMemorySession,
    OpenAIChatClient,
    OpenAIResponsesClient,
    ProviderError,
    RetryMiddleware,
    ScriptedChatClient,
    ToolCall,
    ToolRequest,
    Update,
    Usage,
    parallel,
    tool,
)
from raf.errors import RateLimitError

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn
OPTIONS = AgentRunOptions(model="m1")


class Open(SpanProcessor):
    """Counts the spans started and not yet ended: none may be left open."""

    def __init__(self) -> None:
        self.open: set[int] = set()

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        self.open.add(span.context.span_id)

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.open.discard(span.context.span_id)


class Tracing:
    """A local tracer provider (never the global one), its exporter and its open spans."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.open = Open()
        self.provider = TracerProvider()
        self.provider.add_span_processor(self.open)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans if span.name == name]


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    tracing = Tracing()
    yield tracing
    tracing.provider.shutdown()


Tree = tuple[str, tuple[Any, ...]]


def tree(spans: Sequence[ReadableSpan], root: ReadableSpan | None = None) -> list[Tree]:
    """The spans as (name, children) nested by parent, siblings in start order."""
    parent_id = None if root is None else root.context.span_id  # type: ignore[union-attr]
    children = [
        span
        for span in spans
        if (span.parent.span_id if span.parent is not None else None) == parent_id
    ]
    children.sort(key=lambda span: (span.start_time or 0, span.name))
    return [(span.name, tuple(tree(spans, span))) for span in children]


def leaves(*names: str) -> tuple[Tree, ...]:
    return tuple((name, ()) for name in names)


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def subset(span: ReadableSpan, expected: Mapping[str, Any]) -> None:
    got = attributes(span)
    assert {key: got.get(key) for key in expected} == dict(expected), span.name


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Notes(ContextProvider):
    """Pre and post stage."""

    kind = "notes"

    def __init__(self, name: str = "notes") -> None:
        self.name = name
        self.seen: list[BaseException | None] = []

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        return ContextResult(instructions="Take notes.\nBe brief.")

    async def on_invoked(
        self, agent: Any, session: Any, request: Any, response: Any, error: Any
    ) -> None:
        self.seen.append(error)


class Clock(ContextProvider):
    """Pre stage only."""

    kind = "clock"

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        return ContextResult(instructions="It is noon.")


class Calculator(ContextProvider):
    """Offers a tool; has a post stage."""

    kind = "tools"

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        return ContextResult(tools=[add])

    async def on_invoked(self, *args: Any) -> None:
        pass


# The whole tree --------------------------------------------------------------------------------


async def test_the_tree_of_a_run_with_three_providers_a_tool_call_and_a_retried_model_call(
    tracing: Tracing,
) -> None:
    rate_limited = RateLimitError("slow down", status_code=429)
    client = ScriptedChatClient(
        [
            rate_limited,
            AgentResponse((turn(ToolCall("c1", "add", '{"a": 2, "b": 3}')),), Usage(10, 2)),
            AgentResponse((ChatMessage.assistant("5"),), Usage(20, 1)),
        ]
    )
    agent = Agent(
        client,
        name="helper",
        stack=[Notes(), Clock(), Calculator()],
        chat_stack=[RetryMiddleware(attempts=2, wait_initial=0, wait_max=0)],
    )
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    session = InMemorySession("conversation-7")

    response = await traced.run("2 + 3?", session=session, options=OPTIONS)

    assert response.text == "5"
    assert tree(tracing.spans) == [
        (
            "invoke_agent helper",
            (
                *leaves("on_invoking notes", "on_invoking Clock", "on_invoking Calculator"),
                *leaves("chat m1", "execute_tool add", "chat m1"),
                *leaves("on_invoked Calculator", "on_invoked notes"),
            ),
        )
    ]
    assert not tracing.open.open
    (run,) = tracing.named("invoke_agent helper")
    subset(
        run,
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "helper",
            "gen_ai.conversation.id": "conversation-7",
            "gen_ai.provider.name": "scripted",
            "gen_ai.request.model": "m1",
            "gen_ai.usage.input_tokens": 30,
            "gen_ai.usage.output_tokens": 3,
        },
    )
    assert run.status.status_code is StatusCode.UNSET
    assert run.kind is trace.SpanKind.INTERNAL
    first, second = tracing.named("chat m1")
    subset(
        first,
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "scripted",
            "gen_ai.request.model": "m1",
            "gen_ai.usage.input_tokens": 10,
            "gen_ai.usage.output_tokens": 2,
            "raf.chat.attempts": 2,
        },
    )
    assert first.kind is trace.SpanKind.CLIENT
    # The retried attempt is an exception event; the call as a whole succeeded.
    assert [event.name for event in first.events] == ["exception"]
    assert attributes_of(first.events[0]).items() >= {
        ("exception.type", "raf.errors.RateLimitError"),
        ("exception.message", "slow down"),
        ("raf.chat.attempt", 1),
    }
    assert first.status.status_code is StatusCode.UNSET
    subset(second, {"gen_ai.usage.input_tokens": 20, "raf.chat.attempts": None})
    assert second.events == ()
    (tool_span,) = tracing.named("execute_tool add")
    subset(
        tool_span,
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "add",
            "gen_ai.tool.call.id": "c1",
            "gen_ai.tool.type": "function",
            "gen_ai.tool.description": "Add two integers.",
        },
    )
    (notes_pre,) = tracing.named("on_invoking notes")
    subset(
        notes_pre,
        {
            "raf.provider.name": "notes",
            "raf.provider.kind": "notes",
            "raf.provider.stage": "on_invoking",
            "raf._context.instructions": 2,
        },
    )
    (calculator_pre,) = tracing.named("on_invoking Calculator")
    assert attributes(calculator_pre)["raf._context.tools"] == ("add",)
    (notes_post,) = tracing.named("on_invoked notes")
    subset(notes_post, {"raf.provider.stage": "on_invoked", "raf.run.error.type": None})
    # No content unless asked for.
    for span in tracing.spans:
        assert not any(
            key.startswith(("gen_ai.input", "gen_ai.output")) for key in attributes(span)
        )


def attributes_of(event: Any) -> dict[str, Any]:
    return dict(event.attributes or {})


async def test_spans_nest_under_the_span_current_when_the_run_starts(tracing: Tracing) -> None:
    traced = raf.otel.instrument(Agent(EchoChatClient()), tracer_provider=tracing.provider)
    tracer = tracing.provider.get_tracer("test")
    with tracer.start_as_current_span("request"):
        await traced.run("hi")
    assert tree(tracing.spans) == [("request", (("invoke_agent", leaves("chat")),))]
    assert len({span.context.trace_id for span in tracing.spans}) == 1  # type: ignore[union-attr]


async def test_a_parallel_groups_members_nest_under_invoke_agent(tracing: Tracing) -> None:
    agent = Agent(
        EchoChatClient(), stack=[parallel(Notes("a"), Clock(), Notes("b")), Notes("after")]
    )
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    await traced.run("hi")
    ((name, children),) = tree(tracing.spans)
    assert name == "invoke_agent"
    names = [child[0] for child in children]
    # The members' pre stages run concurrently (any order), before the next provider's.
    assert sorted(names[:3]) == ["on_invoking Clock", "on_invoking a", "on_invoking b"]
    assert names[3:] == [
        "on_invoking after",
        "chat",
        "on_invoked after",
        "on_invoked b",
        "on_invoked a",
    ]
    assert all(grandchildren == () for _, grandchildren in children)


# Errors --------------------------------------------------------------------------------------


async def test_a_failing_pre_stage_marks_its_span_and_the_run(tracing: Tracing) -> None:
    class Broken(ContextProvider):
        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            raise ValueError("no index")

    notes = Notes()
    agent = Agent(EchoChatClient(), stack=[notes, Broken()])
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    with pytest.raises(ProviderError):
        await traced.run("hi")
    assert tree(tracing.spans) == [
        ("invoke_agent", leaves("on_invoking notes", "on_invoking Broken", "on_invoked notes"))
    ]
    (broken,) = tracing.named("on_invoking Broken")
    assert broken.status.status_code is StatusCode.ERROR
    assert attributes(broken)["error.type"] == "ValueError"
    assert [event.name for event in broken.events] == ["exception"]
    (run,) = tracing.named("invoke_agent")
    assert run.status.status_code is StatusCode.ERROR
    assert attributes(run)["error.type"] == "raf.ProviderError"
    (post,) = tracing.named("on_invoked notes")
    assert attributes(post)["raf.run.error.type"] == "raf.ProviderError"
    assert post.status.status_code is StatusCode.UNSET


async def test_a_post_stage_failure_is_visible_on_the_providers_span(tracing: Tracing) -> None:
    class Saver(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            raise OSError("disk full")

    agent = Agent(EchoChatClient(), stack=[Notes(), Saver()])
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    with pytest.raises(ProviderError, match="disk full"):
        await traced.run("hi")
    (saver,) = tracing.named("on_invoked Saver")
    assert saver.status.status_code is StatusCode.ERROR
    assert saver.status.description == "OSError: disk full"
    assert [event.name for event in saver.events] == ["exception"]
    # The provider outside it saw a success; the run as a whole raised.
    (notes,) = tracing.named("on_invoked notes")
    assert notes.status.status_code is StatusCode.UNSET
    (run,) = tracing.named("invoke_agent")
    assert run.status.status_code is StatusCode.ERROR


async def test_a_failing_tool_marks_its_span_and_the_model_is_told(tracing: Tracing) -> None:
    @tool
    def explode() -> str:
        """Fails."""
        raise RuntimeError("boom")

    async def refuse_add(request: ToolRequest, call_next: Any) -> ChatMessage:
        if request.tool.name == "add":
            return request.reply("refused")
        result: ChatMessage = await call_next(request)
        return result

    calls = (ToolCall("1", "explode"), ToolCall("2", "add", '{"a": 1, "b": 1}'))
    client = ScriptedChatClient([turn(*calls), "ok"])
    agent = Agent(client, tools=[explode, add], tool_stack=[refuse_add])
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    response = await traced.run("go")
    assert response.text == "ok"
    (failed,) = tracing.named("execute_tool explode")
    assert failed.status.status_code is StatusCode.ERROR
    assert attributes(failed)["error.type"] == "RuntimeError"
    (refused,) = tracing.named("execute_tool add")
    assert refused.status.status_code is StatusCode.UNSET
    assert tracing.named("invoke_agent")[0].status.status_code is StatusCode.UNSET


async def test_the_tree_of_a_cancelled_run_every_span_ended(tracing: Tracing) -> None:
    entered = anyio.Event()

    @tool
    async def hang() -> str:
        """Never returns."""
        entered.set()
        await anyio.sleep_forever()
        return "never"

    notes = Notes()
    client = ScriptedChatClient([turn(ToolCall("1", "hang")), "never"])
    agent = Agent(client, name="helper", tools=[hang], stack=[notes, Clock()])
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(traced.run, "go")
            await entered.wait()
            group.cancel_scope.cancel()

    assert not tracing.open.open
    assert tree(tracing.spans) == [
        (
            "invoke_agent helper",
            (
                *leaves("on_invoking notes", "on_invoking Clock", "chat", "execute_tool hang"),
                *leaves("on_invoked notes"),
            ),
        )
    ]
    cancelled = anyio.get_cancelled_exc_class()
    for name in ("invoke_agent helper", "execute_tool hang"):
        (span,) = tracing.named(name)
        assert span.status.status_code is StatusCode.ERROR, name
        assert attributes(span)["error.type"].endswith(cancelled.__qualname__), name
    (post,) = tracing.named("on_invoked notes")
    assert attributes(post)["raf.run.error.type"].endswith(cancelled.__qualname__)
    assert post.status.status_code is StatusCode.UNSET  # the post stage itself went well
    assert isinstance(notes.seen[0], cancelled)


# Streamed runs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["callback", "iterator"])
async def test_a_streamed_run_has_the_same_tree_and_a_time_to_first_chunk(
    tracing: Tracing, form: str
) -> None:
    client = ScriptedChatClient(
        [
            [Update.of_tool_call(ToolCall("c1", "add", '{"a": 1, "b": 2}'))],
            ["the sum ", "is 3", Update.of_usage(Usage(7, 3))],
        ]
    )
    agent = Agent(client, name="streamer", tools=[add], stack=[Notes()])
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    tracer = tracing.provider.get_tracer("test")
    with tracer.start_as_current_span("request"):
        if form == "callback":
            updates: list[Update] = []

            async def collect(update: Update) -> None:
                updates.append(update)

            response = await traced.run("1 + 2?", options=OPTIONS, on_update=collect)
        else:
            async with traced.stream("1 + 2?", options=OPTIONS) as stream:
                updates = [update async for update in stream]
            assert stream.response is not None
            response = stream.response
    assert response.text == "the sum is 3"
    assert tree(tracing.spans) == [
        (
            "request",
            (
                (
                    "invoke_agent streamer",
                    (
                        *leaves("on_invoking notes", "chat m1", "execute_tool add", "chat m1"),
                        *leaves("on_invoked notes"),
                    ),
                ),
            ),
        )
    ]
    assert not tracing.open.open
    for chat in tracing.named("chat m1"):
        first_chunk = attributes(chat)["gen_ai.response.time_to_first_chunk"]
        assert 0 <= first_chunk <= (chat.end_time - chat.start_time) / 1e9  # type: ignore[operator]
    subset(tracing.named("chat m1")[1], {"gen_ai.usage.input_tokens": 7})


async def test_an_early_close_of_a_stream_ends_every_span(tracing: Tracing) -> None:
    client = ScriptedChatClient([["one ", "two ", "three"]])
    traced = raf.otel.instrument(Agent(client, stack=[Notes()]), tracer_provider=tracing.provider)
    async with traced.stream("count") as stream:
        async for _update in stream:
            break
    assert not tracing.open.open
    assert tree(tracing.spans) == [
        ("invoke_agent", leaves("on_invoking notes", "chat", "on_invoked notes"))
    ]
    (post,) = tracing.named("on_invoked notes")
    assert attributes(post)["raf.run.error.type"] == "raf.StreamClosedError"
    (chat,) = tracing.named("chat")
    # #26.16: a reader pressing Stop is not an error (it inflated error rates).
    assert chat.status.status_code is StatusCode.UNSET
    assert attributes(chat)["raf.stream.closed"] is True
    assert "gen_ai.response.time_to_first_chunk" in attributes(chat)


# Content ---------------------------------------------------------------------------------------


async def test_content_is_recorded_only_when_asked(
    tracing: Tracing, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run_agent() -> Agent:
        client = ScriptedChatClient([turn(ToolCall("c1", "add", '{"a": 2, "b": 3}')), "5"])
        return Agent(client, instructions="Be exact.", tools=[add])

    monkeypatch.delenv(raf.otel.CAPTURE_CONTENT_ENV, raising=False)
    await raf.otel.instrument(run_agent(), tracer_provider=tracing.provider).run("2+3?")
    for span in tracing.spans:
        assert not any(
            key.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.system"))
            or key in ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result")
            for key in attributes(span)
        ), span.name
    tracing.exporter.clear()

    await raf.otel.instrument(
        run_agent(), tracer_provider=tracing.provider, capture_content=True
    ).run("2+3?")
    first = tracing.named("chat")[0]
    assert attributes(first)["gen_ai.system_instructions"] == (
        '[{"type": "text", "content": "Be exact."}]'
    )
    assert attributes(first)["gen_ai.input.messages"] == (
        '[{"role": "user", "parts": [{"type": "text", "content": "2+3?"}]}]'
    )
    assert '"name": "add"' in attributes(first)["gen_ai.tool.definitions"]
    assert '"type": "tool_call"' in attributes(first)["gen_ai.output.messages"]
    (tool_span,) = tracing.named("execute_tool add")
    subset(
        tool_span,
        {"gen_ai.tool.call.arguments": '{"a": 2, "b": 3}', "gen_ai.tool.call.result": "5"},
    )
    (run,) = tracing.named("invoke_agent")
    assert '"content": "5"' in attributes(run)["gen_ai.output.messages"]
    tracing.exporter.clear()

    monkeypatch.setenv(raf.otel.CAPTURE_CONTENT_ENV, "True")
    await raf.otel.instrument(run_agent(), tracer_provider=tracing.provider).run("2+3?")
    assert "gen_ai.input.messages" in attributes(tracing.named("chat")[0])


# The traced copy ---------------------------------------------------------------------------------


async def test_the_copy_keeps_the_agent_and_the_original_is_untouched(tracing: Tracing) -> None:
    clock, notes = Clock(), Notes()
    agent = Agent(
        EchoChatClient(),
        name="a",
        instructions="Be kind.",
        tools=[add],
        stack=[clock, parallel(notes)],
        post_timeout=3.0,
        history=True,
    )
    traced = raf.otel.instrument(agent, tracer_provider=tracing.provider)
    assert traced is not agent
    assert (traced.name, traced.instructions, traced.tools, traced.post_timeout) == (
        "a",
        "Be kind.",
        (add,),
        3.0,
    )
    assert traced.chat_client is agent.chat_client
    assert len(agent.chat_stack) == 0
    assert len(agent.tool_stack) == 0
    # The history provider, the clock (no post stage) and the group: the same, no proxies.
    assert traced.stack == agent.stack
    history, traced_clock, group = traced.stack
    assert history.name == agent.stack[0].name
    assert traced_clock.name == "Clock"
    assert traced_clock.kind == "clock"
    assert group.members[0] is notes
    session = InMemorySession()
    assert (await traced.run("hi", session=session)).text == "hi"
    # The clock has no post stage, so no span for one; the group member's post stage is traced.
    assert tracing.named("on_invoking Clock")
    assert tracing.named("on_invoked Clock") == []
    assert len(tracing.named("on_invoked notes")) == 1
    assert len(await session.get_messages()) == 2  # the history provider still works
    with pytest.raises(ValueError, match="already instrumented"):
        raf.otel.instrument(traced)
    with pytest.raises(TypeError, match=r"takes a raf\.Agent"):
        raf.otel.instrument("agent")  # type: ignore[arg-type]


async def test_gen_ai_provider_name() -> None:
    async with (
        OpenAIChatClient("gpt-x", base_url="http://127.0.0.1:9/v1", api_key="k") as chat,
        OpenAIResponsesClient("gpt-x", base_url="http://127.0.0.1:9/v1", api_key="k") as other,
    ):
        assert raf.otel.gen_ai_provider_name(chat) == "openai"
        assert raf.otel.gen_ai_provider_name(other) == "openai"
    assert raf.otel.gen_ai_provider_name(EchoChatClient()) == "echo"
    assert raf.otel.gen_ai_provider_name(ScriptedChatClient()) == "scripted"

    class Mine:
        gen_ai_provider_name = "aws.bedrock"

    class Gemini:
        provider_name = "gcp.gemini"

    assert raf.otel.gen_ai_provider_name(Mine()) == "aws.bedrock"
    assert raf.otel.gen_ai_provider_name(Gemini()) == "gcp.gemini"
    assert chat.provider_name == other.provider_name == "openai"


async def test_the_openai_clients_model_names_the_chat_span(tracing: Tracing) -> None:
    client = OpenAIChatClient("gpt-x", base_url="http://127.0.0.1:9/v1", api_key="k")

    async def answer(request: Any, call_next: Any) -> AgentResponse:
        return AgentResponse((ChatMessage.assistant("hi"),))  # no server: answered here

    traced = raf.otel.instrument(
        Agent(client, chat_stack=[answer]), tracer_provider=tracing.provider
    )
    await traced.run("hi")
    await client.aclose()
    (chat,) = tracing.named("chat gpt-x")
    subset(chat, {"gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-x"})


async def test_a_no_op_tracer_provider_changes_nothing() -> None:
    calls = (ToolCall("1", "add", '{"a": 1, "b": 1}'),)
    agent = Agent(
        ScriptedChatClient([turn(*calls), "2"]),
        tools=[add],
        stack=[Notes(), Clock()],
        chat_stack=[RetryMiddleware(attempts=2)],
    )
    traced = raf.otel.instrument(agent, tracer_provider=NoOpTracerProvider())
    response = await traced.run("go")
    assert response.text == "2"
    assert [m.content for m in response.messages if m.role == "tool"] == ["2"]


async def test_a_run_that_is_not_sampled_starts_no_inner_spans(tracing: Tracing) -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    dropped = TracerProvider(sampler=ALWAYS_OFF)
    dropped.add_span_processor(SimpleSpanProcessor(tracing.exporter))
    inner = raf.otel.instrument(
        Agent(EchoChatClient(), name="inner", stack=[Notes("inner notes")]),
        tracer_provider=dropped,
    )

    @tool
    async def ask_inner(question: str) -> str:
        """Ask another agent."""
        return (await inner.run(question)).text

    client = ScriptedChatClient([turn(ToolCall("1", "ask_inner", '{"question": "q"}')), "ok"])
    outer = Agent(client, name="outer", tools=[ask_inner], stack=[Notes()])
    traced = raf.otel.instrument(outer, tracer_provider=tracing.provider)
    assert (await traced.run("go")).text == "ok"
    # The inner run was not sampled: none of its spans; the outer run's, all of them.
    assert tree(tracing.spans) == [
        (
            "invoke_agent outer",
            leaves(
                "on_invoking notes", "chat", "execute_tool ask_inner", "chat", "on_invoked notes"
            ),
        )
    ]


async def test_a_cancelled_stream_ends_every_span(tracing: Tracing) -> None:
    started = anyio.Event()

    class Hanging(ScriptedChatClient):
        async def stream(self, messages: Any, options: Any) -> Any:
            yield Update.of_text("first ")
            started.set()
            await anyio.sleep_forever()

    notes = Notes()
    traced = raf.otel.instrument(Agent(Hanging(), stack=[notes]), tracer_provider=tracing.provider)

    async def consume() -> None:
        async with traced.stream("go") as stream:
            async for _update in stream:
                pass

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(consume)
            await started.wait()
            group.cancel_scope.cancel()
    assert not tracing.open.open
    assert tree(tracing.spans) == [
        ("invoke_agent", leaves("on_invoking notes", "chat", "on_invoked notes"))
    ]
    cancelled = anyio.get_cancelled_exc_class()
    assert isinstance(notes.seen[0], cancelled)
    (run,) = tracing.named("invoke_agent")
    assert attributes(run)["error.type"].endswith(cancelled.__qualname__)
