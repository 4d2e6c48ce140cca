"""CompressionProvider and its strategies: laws with hypothesis, runs with a scripted model."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    ChatClientError,
    ChatMessage,
    CompressionProvider,
    HistoryProvider,
    InMemorySession,
    ProviderError,
    ScriptedChatClient,
    ToolCall,
    tool,
)
from raf.compression import (
    SummaryStrategy,
    TokenBudgetStrategy,
    TruncationStrategy,
    approximate_tokens,
    check_tool_pairing,
    message_units,
)
from raf.errors import CompressionError

pytestmark = pytest.mark.anyio

# ---------------------------------------------------------------- histories


@st.composite
def tool_group(draw: st.DrawFn, prefix: str) -> list[ChatMessage]:
    count = draw(st.integers(1, 3))
    calls = [ToolCall(f"{prefix}-{i}", "lookup", '{"q": "x"}') for i in range(count)]
    text = draw(st.sampled_from([None, "let me check"]))
    results = [ChatMessage.tool(call.id, f"result {call.id}") for call in calls]
    order = draw(st.permutations(results))
    return [ChatMessage.assistant(text, tool_calls=calls), *order]


@st.composite
def well_formed_history(draw: st.DrawFn) -> list[ChatMessage]:
    history: list[ChatMessage] = []
    for index in range(draw(st.integers(0, 12))):
        piece = draw(st.sampled_from(["user", "assistant", "group", "system"]))
        if piece == "group":
            history.extend(draw(tool_group(f"g{index}")))
        elif piece == "user":
            history.append(ChatMessage.user("u" * draw(st.integers(0, 60))))
        elif piece == "assistant":
            history.append(ChatMessage.assistant("a" * draw(st.integers(0, 60))))
        else:
            history.append(ChatMessage.system("note"))
    return history


@st.composite
def any_history(draw: st.DrawFn) -> list[ChatMessage]:
    """Well formed, or with orphan results and incomplete groups thrown in."""
    history = draw(well_formed_history())
    for index in range(draw(st.integers(0, 3))):
        position = draw(st.integers(0, len(history)))
        damage = draw(st.sampled_from(["orphan", "incomplete"]))
        if damage == "orphan":
            broken = [ChatMessage.tool(f"orphan{index}", "stray")]
        else:
            group = draw(tool_group(f"bad{index}"))
            broken = group[:-1]  # one result missing
        history[position:position] = broken
    return history


def run(coro_fn: object, *args: object) -> object:
    return anyio.run(coro_fn, *args)  # type: ignore[arg-type]


def flat(units: Sequence[Sequence[ChatMessage]]) -> list[ChatMessage]:
    return [m for unit in units for m in unit]


# ---------------------------------------------------------------- laws


@settings(max_examples=80, deadline=None)
@given(well_formed_history())
def test_units_of_a_well_formed_history_are_the_history(history: list[ChatMessage]) -> None:
    assert check_tool_pairing(history) is None
    assert flat(message_units(history)) == history


@settings(max_examples=80, deadline=None)
@given(any_history())
def test_units_are_always_well_formed(history: list[ChatMessage]) -> None:
    assert check_tool_pairing(flat(message_units(history))) is None


def stepped_cut(history: Sequence[ChatMessage], costs: Sequence[int], bound: int, step: int) -> int:
    """Where a window starts, worked out the slow way: the first multiple of ``step`` (in
    the units ``costs`` counts) whose suffix fits, then past the tool results there."""
    offset = 0
    while sum(costs) - offset > bound:
        offset += step
    cut = 0
    while sum(costs[:cut]) < offset:
        cut += 1
    while cut < len(history) and history[cut].role == "tool":
        cut += 1
    return cut


@settings(max_examples=80, deadline=None)
@given(any_history(), st.integers(1, 12), st.data())
def test_truncation_never_splits_and_cuts_in_steps(
    history: list[ChatMessage], keep_last: int, data: st.DataObject
) -> None:
    step = data.draw(st.integers(1, keep_last))
    result = list(run(TruncationStrategy(keep_last, step=step).compress, history))  # type: ignore[call-overload]
    assert check_tool_pairing(result) is None
    assert len(result) <= keep_last
    cut = stepped_cut(history, [1] * len(history), keep_last, step)
    assert result == flat(message_units(history[cut:]))


@settings(max_examples=80, deadline=None)
@given(any_history(), st.integers(1, 200), st.data())
def test_token_budget_never_splits_and_cuts_in_steps(
    history: list[ChatMessage], max_tokens: int, data: st.DataObject
) -> None:
    step = data.draw(st.none() | st.integers(1, max_tokens))
    strategy = TokenBudgetStrategy(max_tokens, step=step)
    result = list(run(strategy.compress, history))  # type: ignore[call-overload]
    assert check_tool_pairing(result) is None
    assert sum(approximate_tokens(m) for m in result) <= max_tokens
    costs = [approximate_tokens(m) for m in history]
    cut = stepped_cut(history, costs, max_tokens, strategy.step)
    assert result == flat(message_units(history[cut:]))


@settings(max_examples=50, deadline=None)
@given(any_history(), st.integers(1, 8), st.booleans())
def test_summary_is_well_formed_and_keeps_the_newest(
    history: list[ChatMessage], keep_last: int, fails: bool
) -> None:
    def answer(messages: Sequence[ChatMessage], options: object) -> str:
        if fails:
            raise ChatClientError("summary model down")
        return "they talked"

    client = ScriptedChatClient([answer] * 3)
    result = list(run(SummaryStrategy(client, keep_last).compress, history))  # type: ignore[call-overload]
    truncated = list(run(TruncationStrategy(keep_last).compress, history))  # type: ignore[call-overload]
    assert check_tool_pairing(result) is None
    summarised = len(flat(message_units(history))) > len(truncated)
    if summarised and not fails:
        assert result[0] == ChatMessage.system("Summary of the earlier conversation: they talked")
        assert result[1:] == truncated
    else:
        assert result == truncated


def test_pairing_check_names_the_problem() -> None:
    call = ChatMessage.assistant(tool_calls=[ToolCall("1", "f"), ToolCall("2", "f")])
    assert check_tool_pairing([call, ChatMessage.tool("1", "x")]) == (
        "the history ends before the results of tool calls ['2']"
    )
    assert "messages[2] comes before" in str(
        check_tool_pairing([call, ChatMessage.tool("1", "x"), ChatMessage.user("hi")])
    )


def test_strategy_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        TruncationStrategy(0)
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBudgetStrategy(-1)
    with pytest.raises(ValueError, match="on_failure"):
        SummaryStrategy(ScriptedChatClient(), 3, on_failure="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="compress"):
        CompressionProvider(object())  # type: ignore[arg-type]


# ---------------------------------------------------------------- real runs


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


async def test_compression_with_history_sends_the_newest_and_stores_everything() -> None:
    client = ScriptedChatClient(
        [
            "a1",
            ScriptedChatClient.tool_turn(ToolCall("c1", "lookup", '{"q": "x"}')),
            "a2",
            "a3",
        ]
    )
    agent = Agent(
        client,
        tools=[lookup],
        stack=[HistoryProvider(), CompressionProvider(TruncationStrategy(3, step=1))],
    )
    session = InMemorySession()
    await agent.run("q1", session=session)
    await agent.run("q2", session=session)
    await agent.run("q3", session=session)
    # history before run 3: q1 a1 q2 [call c1, result c1] a2: the newest three
    # messages are the tool group and a2; q2 would make four.
    seen = client.requests[3].messages
    assert [m.role for m in seen] == ["assistant", "tool", "assistant", "user"]
    assert [m.content for m in seen[2:]] == ["a2", "q3"]
    assert len(await session.get_messages()) == 8


async def test_tool_group_kept_whole_in_a_run() -> None:
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(ToolCall("c1", "lookup", '{"q": "x"}')), "a1", "a2"]
    )
    agent = Agent(
        client,
        tools=[lookup],
        stack=[HistoryProvider(inject=False), CompressionProvider(TruncationStrategy(3, step=1))],
    )
    session = InMemorySession()
    await agent.run("q1", session=session)
    await agent.run("q2", session=session)
    roles = [m.role for m in client.requests[2].messages]
    assert roles == ["assistant", "tool", "assistant", "user"]


async def test_summary_runs_the_model_once_and_extends_its_summary() -> None:
    summaries = ScriptedChatClient(["S1", "S2"])
    main = ScriptedChatClient(["a1", "a2", "a3", "a4"])
    agent = Agent(
        main,
        stack=[
            HistoryProvider(inject=False),
            CompressionProvider(SummaryStrategy(summaries, keep_last=2)),
        ],
    )
    session = InMemorySession()
    for text in ("q1", "q2", "q3", "q4"):
        await agent.run(text, session=session)
    # run 3 saw: summary of q1 a1, then q2 a2
    third = main.requests[2].messages
    assert third[0].content == "Summary of the earlier conversation: S1"
    assert [m.content for m in third[1:]] == ["q2", "a2", "q3"]
    # run 4 extended S1 with q2 a2 instead of re-reading everything
    second_call = summaries.requests[1].messages[1].content or ""
    assert second_call.startswith("Summary so far: S1")
    assert "user: q1" not in second_call
    assert "user: q2" in second_call
    assert main.requests[3].messages[0].content == "Summary of the earlier conversation: S2"


async def test_summary_failure_falls_back_to_truncation() -> None:
    summaries = ScriptedChatClient([ChatClientError("down")])
    strategy = SummaryStrategy(summaries, keep_last=1)
    history = [ChatMessage.user("old"), ChatMessage.assistant("older answer")]
    result = await strategy.compress(history)
    assert list(result) == [ChatMessage.assistant("older answer")]


async def test_summary_with_no_text_is_a_failure() -> None:
    strategy = SummaryStrategy(ScriptedChatClient(["   "]), keep_last=1, on_failure="raise")
    with pytest.raises(CompressionError, match="no text"):
        await strategy.compress([ChatMessage.user("a"), ChatMessage.user("b")])


async def test_summary_failure_can_fail_the_run_before_the_model_and_store_nothing() -> None:
    summaries = ScriptedChatClient([ChatClientError("down")])
    main = ScriptedChatClient(["a1"])
    agent = Agent(
        main,
        stack=[
            HistoryProvider(inject=False),
            CompressionProvider(SummaryStrategy(summaries, keep_last=1, on_failure="raise")),
        ],
    )
    session = InMemorySession()
    await session.add_messages([ChatMessage.user("q0"), ChatMessage.assistant("a0")])
    with pytest.raises(ProviderError) as caught:
        await agent.run("q1", session=session)
    assert caught.value.provider == "CompressionProvider"
    assert isinstance(caught.value.__cause__, CompressionError)
    assert main.requests == []
    assert len(await session.get_messages()) == 2


async def test_a_strategy_that_splits_a_group_is_refused() -> None:
    class Splitter:
        async def compress(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
            return messages[-1:]

    history = [
        ChatMessage.assistant(tool_calls=[ToolCall("1", "lookup")]),
        ChatMessage.tool("1", "x"),
    ]
    session = InMemorySession()
    await session.add_messages(history)
    agent = Agent(ScriptedChatClient(["never"]), stack=[CompressionProvider(Splitter())])
    with pytest.raises(ProviderError, match="broken history") as caught:
        await agent.run("hi", session=session)
    assert isinstance(caught.value.__cause__, CompressionError)


async def test_a_custom_strategy_plugs_in() -> None:
    class OnlyUsers:
        async def compress(self, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
            return [m for m in messages if m.role == "user"]

    session = InMemorySession()
    await session.add_messages([ChatMessage.user("u1"), ChatMessage.assistant("a1")])
    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=[CompressionProvider(OnlyUsers(), name="users")]).run(
        "u2", session=session
    )
    assert [m.content for m in client.requests[0].messages] == ["u1", "u2"]


@settings(max_examples=120, deadline=None)
@given(any_history())
def test_a_budget_the_history_fits_keeps_every_unit(history: list[ChatMessage]) -> None:
    """Read from the end, the strategies find the units message_units finds from the start."""
    everything = flat(message_units(history))
    kept = list(run(TruncationStrategy(max(1, len(history))).compress, history))  # type: ignore[call-overload]
    assert kept == everything
    tokens = max(1, sum(approximate_tokens(m) for m in history))
    kept = list(run(TokenBudgetStrategy(tokens).compress, history))  # type: ignore[call-overload]
    assert kept == everything
