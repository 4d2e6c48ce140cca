"""raf.observe.ContextLedger: each model call's prompt by layer and region, the prefix it
shares with the session's previous call, the layer that broke it, and the cached tokens
reported."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from raf import (
    Agent,
    ChatMessage,
    ClearToolResults,
    CompressionProvider,
    ContextProvider,
    ContextResult,
    HistoryProvider,
    InMemorySession,
    OpenAIChatClient,
    ScriptedChatClient,
    ToolCall,
    tool,
)
from raf._values.tokens import approximate_prompt_tokens
from raf.observe import ContextLedger, LedgerPart
from tests._harness.openai_server import OpenAIServer, completion

pytestmark = pytest.mark.anyio


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped " + "and on its way " * 20


class Rules(ContextProvider):
    """Stable instructions, one tool."""

    async def on_invoking(self, agent, session, messages, options):  # type: ignore[no-untyped-def]
        return ContextResult(instructions="Refunds within 30 days.", tools=[lookup])


class Clock(ContextProvider):
    """Instructions that change every turn: stable unless told volatile."""

    def __init__(self, *, volatile: bool) -> None:
        self.volatile = volatile
        self.turn = 0

    async def on_invoking(self, agent, session, messages, options):  # type: ignore[no-untyped-def]
        self.turn += 1
        return ContextResult(instructions=f"It is {self.turn} o'clock.", volatile=self.volatile)


def regions(parts: Sequence[LedgerPart]) -> list[tuple[str, str]]:
    return [(part.layer, part.region) for part in parts]


def script(turns: int) -> ScriptedChatClient:
    """Each turn: a tool call, then an answer."""
    steps: list[object] = []
    for turn in range(turns):
        steps.append(ScriptedChatClient.tool_turn(ToolCall(f"c{turn}", "lookup", '{"order":"1"}')))
        steps.append(f"answer {turn}")
    return ScriptedChatClient(steps)  # type: ignore[arg-type]


async def test_the_parts_are_in_prompt_order_and_add_up_to_the_prompt() -> None:
    ledger = ContextLedger()
    agent = Agent(
        script(2),
        instructions="Be brief.",
        stack=[HistoryProvider(), Rules(), Clock(volatile=True)],
        observers=[ledger],
    )
    session = InMemorySession()
    await agent.run("where is my order?", session=session)
    await agent.run("and the other one?", session=session)
    assert len(ledger.calls) == 4
    first, loop, second, _ = ledger.calls
    assert regions(first.parts) == [
        ("Rules", "tools"),
        ("agent", "system"),
        ("Rules", "system"),
        ("Clock", "tail"),
        ("request", "request"),
    ]
    assert regions(loop.parts)[-1] == ("tool loop", "loop")
    assert ("HistoryProvider", "history") in regions(second.parts)
    for entry in ledger.calls:
        assert entry.input_tokens == sum(part.tokens for part in entry.parts)
        assert all(part.tokens > 0 for part in entry.parts)
        assert entry.counted_by == "approximate"
        assert entry.session_id == session.id
        assert entry.broken_by is None  # the clock is in the tail, which may change


async def test_the_count_is_the_whole_prompts() -> None:
    client = script(1)
    ledger = ContextLedger()
    agent = Agent(client, instructions="Be brief.", stack=[Rules()], observers=[ledger])
    await agent.run("where is my order?")
    for call, entry in zip(client.requests, ledger.calls, strict=True):
        assert entry.input_tokens == approximate_prompt_tokens(call.messages, call.options.tools)


async def test_the_tool_loops_next_call_shares_the_whole_first_prompt() -> None:
    ledger = ContextLedger()
    agent = Agent(script(1), instructions="Be brief.", stack=[Rules()], observers=[ledger])
    await agent.run("where is my order?")
    first, second = ledger.calls
    assert first.shared_prefix_tokens == 0
    assert second.shared_prefix_tokens == first.input_tokens
    assert second.broken_by is None


async def test_broken_by_names_the_stable_provider_that_changed() -> None:
    ledger = ContextLedger()
    agent = Agent(
        ScriptedChatClient(["one", "two"]),
        instructions="Be brief.",
        stack=[HistoryProvider(), Clock(volatile=False)],
        observers=[ledger],
    )
    session = InMemorySession()
    await agent.run("hi", session=session)
    await agent.run("again", session=session)
    first, second = ledger.calls
    assert first.broken_by is None  # nothing before it
    assert second.broken_by is not None
    assert (second.broken_by.layer, second.broken_by.region) == ("Clock", "system")
    # The agent's own instructions come before the clock's: the cache still had them.
    assert 0 < second.shared_prefix_tokens < first.input_tokens
    assert "Clock (system)" in ledger.report()


async def test_a_window_that_moves_breaks_the_cache_at_the_history() -> None:
    ledger = ContextLedger()
    agent = Agent(
        ScriptedChatClient([f"answer {n}" for n in range(12)]),
        stack=[HistoryProvider(max_messages=12, step=6)],
        observers=[ledger],
    )
    session = InMemorySession()
    for turn in range(12):
        await agent.run(f"question {turn}", session=session)
    broken = [entry.broken_by for entry in ledger.calls]
    assert {(part.layer, part.region) for part in broken if part is not None} == {
        ("HistoryProvider", "history")
    }
    # Stepped: a turn adds two messages, so the start moves every third turn once full.
    assert [part is not None for part in broken].count(True) == 2


async def test_each_session_is_compared_with_its_own_previous_call() -> None:
    ledger = ContextLedger()
    agent = Agent(
        ScriptedChatClient(["a", "b", "c"]), stack=[HistoryProvider()], observers=[ledger]
    )
    one, two = InMemorySession(), InMemorySession()
    await agent.run("hi", session=one)
    await agent.run("hello", session=two)
    await agent.run("again", session=one)
    assert [entry.session_id for entry in ledger.calls] == [one.id, two.id, one.id]
    assert ledger.calls[1].shared_prefix_tokens == 0  # another session's prompt
    assert ledger.calls[2].shared_prefix_tokens > 0


async def test_a_failed_call_is_recorded_too() -> None:
    ledger = ContextLedger()
    agent = Agent(ScriptedChatClient([RuntimeError("down")]), observers=[ledger])
    with pytest.raises(RuntimeError):
        await agent.run("hi")
    (entry,) = ledger.calls
    assert entry.reported_cached_tokens is None
    assert regions(entry.parts) == [("request", "request")]


async def test_a_counter_given_counts_every_part() -> None:
    def by_messages(messages: Sequence[ChatMessage], tools: Sequence[object]) -> int:
        return 10 * len(messages) + len(tools)

    ledger = ContextLedger(count_tokens=by_messages)
    agent = Agent(ScriptedChatClient(["ok"]), instructions="Be brief.", observers=[ledger])
    await agent.run("hi")
    (entry,) = ledger.calls
    assert entry.counted_by == "by_messages"
    assert [part.tokens for part in entry.parts] == [10, 10]
    with pytest.raises(TypeError, match="count_tokens"):
        ContextLedger(count_tokens=3)  # type: ignore[arg-type]


async def test_the_report_is_a_table_with_a_row_per_call() -> None:
    ledger = ContextLedger()
    agent = Agent(ScriptedChatClient(["a", "b"]), stack=[HistoryProvider()], observers=[ledger])
    session = InMemorySession()
    await agent.run("hi", session=session)
    await agent.run("again", session=session)
    lines = ledger.report().splitlines()
    assert lines[0].split() == [
        "call", "session", "input", "HistoryProvider", "request",
        "shared", "cached", "broken", "by",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:4]] == ["1", "2", "all"]
    assert "counted by approximate" in lines[-1]


# Through the real OpenAI client, against a loopback server that reports cached tokens ---------


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = OpenAIServer()
    yield server
    server.close()


async def test_through_the_openai_client_the_cached_tokens_it_reported(
    server: OpenAIServer,
) -> None:
    server.answer(completion("one", usage=(40, 2), cached=0))
    server.answer(completion("two", usage=(60, 2), cached=32))
    ledger = ContextLedger()
    async with OpenAIChatClient(
        "gpt-4o-mini", base_url=server.base_url, api_key="sk-test", max_retries=0
    ) as client:
        agent = Agent(
            client, instructions="Be brief.", stack=[HistoryProvider()], observers=[ledger]
        )
        session = InMemorySession()
        await agent.run("hi", session=session)
        await agent.run("again", session=session)
        counts = [
            client.count_tokens(
                [ChatMessage(**m) for m in request.body["messages"]]  # what went out
            )
            for request in server.requests
        ]
    first, second = ledger.calls
    assert [first.reported_cached_tokens, second.reported_cached_tokens] == [0, 32]
    expected = "o200k_base" if client.token_encoding == "o200k_base" else "approximate"
    assert first.counted_by == second.counted_by == expected
    assert [first.input_tokens, second.input_tokens] == counts
    assert second.broken_by is None
    assert second.shared_prefix_tokens > 0
    assert regions(second.parts) == [
        ("agent", "system"),
        ("HistoryProvider", "history"),
        ("request", "request"),
    ]


# On the OpenTelemetry chat span --------------------------------------------------------------


async def test_the_chat_span_carries_the_calls_figures() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import raf.otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ledger = ContextLedger()
    agent = Agent(
        ScriptedChatClient(["one", "two"]),
        instructions="Be brief.",
        stack=[HistoryProvider(), Clock(volatile=False)],
    )
    traced = raf.otel.instrument(agent, tracer_provider=provider, ledger=ledger)
    session = InMemorySession()
    await traced.run("hi", session=session)
    await traced.run("again", session=session)
    provider.shutdown()
    chats = [span for span in exporter.get_finished_spans() if span.name.startswith("chat")]
    assert len(chats) == len(ledger.calls) == 2
    first, second = (dict(span.attributes or {}) for span in chats)
    assert first["raf.context.input_tokens"] == ledger.calls[0].input_tokens
    assert "raf.context.broken_by" not in first
    assert second["raf.context.broken_by"] == "Clock"
    assert second["raf.context.broken_region"] == "system"
    assert second["raf.context.shared_prefix_tokens"] == ledger.calls[1].shared_prefix_tokens
    assert second["raf.context.parts"][0] == f"agent/system={ledger.calls[1].parts[0].tokens}"


async def test_each_repair_of_the_transcript_is_a_part_of_its_own() -> None:
    # A history a crash broke: a call without its result, a result without its call.
    ledger = ContextLedger()
    session = InMemorySession()
    await session.add_messages(
        [
            ChatMessage.user("where is my order?"),
            ChatMessage.assistant(tool_calls=[ToolCall("lost", "lookup", '{"order":"1"}')]),
            ChatMessage.tool("ghost", "a result whose call is gone"),
            ChatMessage.user("hello?"),
        ]
    )
    model = ScriptedChatClient(["Sorry."])
    agent = Agent(model, stack=[HistoryProvider()], observers=[ledger])
    await agent.run("still there?", session=session)
    (entry,) = ledger.calls
    assert regions(entry.parts) == [
        ("HistoryProvider", "history"),
        ("repair", "history"),  # the result made for the call that had none
        ("repair", "history"),  # the result left out, where it was
        ("HistoryProvider", "history"),
        ("request", "request"),
    ]
    made, left_out = entry.parts[1], entry.parts[2]
    assert made.tokens > 0
    assert left_out.tokens == 0
    sent = model.requests[0].messages
    assert entry.input_tokens == approximate_prompt_tokens(sent, [])
    assert entry.tokens_of("repair") == made.tokens
    assert "repair" in ledger.report()
async def test_cleared_tool_results_are_named_and_each_batch_is_reported() -> None:
    @tool
    def search(query: str) -> str:
        """Search."""
        return "page " * 2000

    script: list[object] = []
    for n in range(3):
        call = ToolCall(f"c{n}", "search", '{"query": "q"}')
        script += [ScriptedChatClient.tool_turn(call), f"answer {n}"]
    ledger = ContextLedger()
    strategy = ClearToolResults(keep_last=1, clear_at_least=0)
    agent = Agent(
        ScriptedChatClient(script),
        tools=[search],
        stack=[HistoryProvider(inject=False), CompressionProvider(strategy)],
        observers=[ledger],
    )
    session = InMemorySession("s")
    for n in range(3):
        await agent.run(f"q{n}", session=session)
    assert [entry.cleared for entry in ledger.calls] == [
        (), (), (), (), ("search c0",), ("search c0",)
    ]
    report = ledger.report()
    assert report.splitlines()[0].split()[-4:] == ["cached", "cleared", "broken", "by"]
    assert report.splitlines()[-1] == "call 5 cleared 1 tool results: search c0"
