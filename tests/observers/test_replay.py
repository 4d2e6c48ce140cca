"""raf.replay: a recorded conversation through a stack again, the model and the tools answered
from the recording; what each call sent, what a prefix cache serves, and where it diverged."""

from __future__ import annotations

from decimal import Decimal

import pytest

import raf
from raf import (
    Agent,
    ChatMessage,
    HistoryProvider,
    InMemorySession,
    InputGuardrail,
    ScriptedChatClient,
    ToolCall,
    Verdict,
    tool,
)
from raf.observe import ContextLedger, ReplayReport

pytestmark = pytest.mark.anyio

RAN: list[str] = []


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    RAN.append(order)
    return f"order {order}: shipped " + "and on its way " * 20


@tool(approval=True)
def refund(order: str) -> str:
    """Refund an order (a person approves it)."""
    RAN.append(f"refund {order}")
    return f"refunded {order}"


def _script(turns: int) -> ScriptedChatClient:
    """Every turn: a lookup, then an answer."""
    steps: list[object] = []
    for turn in range(turns):
        call = ToolCall(f"call-{turn}", "lookup", f'{{"order": "{turn}"}}')
        steps += [ScriptedChatClient.tool_turn(call), f"Order {turn} has shipped."]
    return ScriptedChatClient(steps)  # type: ignore[arg-type]


def _agent(client: object, **changes: object) -> Agent:
    stack = changes.pop("stack", [HistoryProvider()])
    return Agent(client, instructions="You help with orders.", tools=[lookup], stack=stack)  # type: ignore[arg-type]


async def _recorded(turns: int = 4) -> tuple[tuple[ChatMessage, ...], ContextLedger]:
    """A conversation as a real run stores it, and the ledger of that run."""
    ledger = ContextLedger()
    agent = _agent(_script(turns)).replace(observers=[ledger])
    session = InMemorySession("talk")
    for turn in range(turns):
        await agent.run(f"Where is order {turn}?", session=session)
    return await session.get_messages(), ledger


async def test_the_same_stack_replays_what_the_run_sent() -> None:
    messages, original = await _recorded()
    RAN.clear()
    report = await raf.replay(_agent(ScriptedChatClient()), messages)
    assert isinstance(report, ReplayReport)
    assert not report.diverged, report.divergences
    assert report.turns == 4
    assert report.recorded_calls == 8
    assert [call.turn for call in report.calls] == [1, 1, 2, 2, 3, 3, 4, 4]
    # The ledger of the replay is the ledger of the run: the same prompts, call by call.
    assert [c.input_tokens for c in report.calls] == [e.input_tokens for e in original.calls]
    assert [c.cached_tokens for c in report.calls] == [
        e.shared_prefix_tokens for e in original.calls
    ]
    assert RAN == []  # no tool ran: the recorded results answered
    # A scripted model has no price: no cost, rather than a made-up one.
    assert all(call.cost is None for call in report.calls)
    assert report.cost is None


async def test_each_call_s_prompt_is_priced_the_cached_part_at_the_cached_price() -> None:
    messages, _ = await _recorded()
    client = ScriptedChatClient()
    client.model = "house-model"  # type: ignore[attr-defined]
    prices = raf.Prices(overrides={"house-model": {"input": 2, "cached_input": 0.5, "output": 8}})
    report = await raf.replay(_agent(client), messages, prices=prices)
    for call in report.calls:
        fresh = call.input_tokens - call.cached_tokens
        assert call.cost == (Decimal(fresh) * 2 + Decimal(call.cached_tokens) * Decimal("0.5")) / (
            10**6
        )
    assert report.cost == sum((call.cost or Decimal(0) for call in report.calls), Decimal(0))
    assert "$0.000112" in report.table()
    with pytest.raises(TypeError, match=r"must be a raf\.Prices"):
        await raf.replay(_agent(client), messages, prices={"house-model": {}})  # type: ignore[arg-type]


async def test_a_window_keeps_less_context_and_bills_what_it_breaks() -> None:
    messages, _ = await _recorded(6)
    whole = await raf.replay(_agent(ScriptedChatClient()), messages)
    windowed = await raf.replay(
        _agent(ScriptedChatClient(), stack=[HistoryProvider(max_messages=6, step=3)]), messages
    )
    assert len(windowed.calls) == len(whole.calls)
    assert not windowed.diverged
    assert windowed.context_tokens < whole.context_tokens
    assert windowed.calls[-1].context_tokens < whole.calls[-1].context_tokens
    assert any(call.broken_by == "HistoryProvider (history)" for call in windowed.calls)
    assert all(call.broken_by is None for call in whole.calls)
    for report in (whole, windowed):
        assert report.billed_units == pytest.approx(
            report.input_tokens - report.cached_tokens + 0.1 * report.cached_tokens
        )
        assert 0 < report.cached_share < 1


async def test_a_call_that_waits_for_approval_is_approved_and_answered_from_the_recording() -> None:
    call = ToolCall("r1", "refund", '{"order": "7"}')
    messages = (
        ChatMessage.user("refund order 7"),
        ChatMessage.assistant(None, tool_calls=(call,)),
        ChatMessage.tool("r1", "refunded 7 (as recorded)", name="refund"),
        ChatMessage.assistant("Done."),
    )
    RAN.clear()
    agent = Agent(ScriptedChatClient(), tools=[refund], history=True)
    report = await raf.replay(agent, messages)
    assert not report.diverged, report.divergences
    assert len(report.calls) == 2
    assert RAN == []


async def test_where_the_stack_leaves_the_recording_is_reported_not_raised() -> None:
    waiting = ChatMessage.assistant(None, tool_calls=(ToolCall("lost", "lookup", "{}"),))
    messages = (
        ChatMessage.user("hello"),  # a turn whose answer was never stored
        ChatMessage.user("look it up"),
        waiting,  # and a call whose result was never stored
        ChatMessage.user("say secret"),
        ChatMessage.assistant("no"),
        ChatMessage.user("bye"),
        ChatMessage.assistant("Bye."),
    )

    async def no_secret(text: str, context: object) -> Verdict:
        return Verdict.block("no") if "secret" in text else Verdict.allow()

    blocked = InputGuardrail(no_secret, name="guard")
    agent = _agent(ScriptedChatClient(), stack=[HistoryProvider(), blocked])
    report = await raf.replay(agent, messages)
    said = [str(d) for d in report.divergences]
    assert said[0].startswith("turn 1, call 1: the stack asked for a model call the recording")
    assert "turn 2: no recorded result for call 'lost' (lookup)" in said
    assert any(s.startswith("turn 2, call 2: the stack asked for a model call") for s in said)
    assert any(s.startswith("turn 3: the run raised GuardrailError") for s in said)
    assert "turn 3: the stack ended the turn after 0 model call(s); the recording holds 1" in said
    assert [call.turn for call in report.calls] == [1, 2, 2, 4]  # the replay went on
    assert "diverged at turn 3" in report.table()


async def test_a_recorded_result_the_stack_never_asks_for_is_reported() -> None:
    messages, _ = await _recorded(2)
    # The same conversation through a stack without the lookup tool: the model is told
    # the tool does not exist, and the recorded result goes unused.
    report = await raf.replay(Agent(ScriptedChatClient(), history=True), messages)
    said = [str(d) for d in report.divergences]
    assert said == [
        "turn 1: the recorded result of call 'call-0' (lookup) was not asked for: the stack "
        "has no such tool, or did not run it",
        "turn 2: the recorded result of call 'call-1' (lookup) was not asked for: the stack "
        "has no such tool, or did not run it",
    ]
    assert len(report.calls) == 4


async def test_the_table_puts_two_stacks_side_by_side() -> None:
    messages, _ = await _recorded(3)
    whole = await raf.replay(_agent(ScriptedChatClient()), messages)
    short = await raf.replay(
        _agent(ScriptedChatClient(), stack=[HistoryProvider(max_messages=2, step=1)]), messages
    )
    from raf._observers.replay_report import side_by_side

    table = side_by_side([("whole", whole), ("short", short)])
    lines = table.splitlines()
    assert "whole: input" in lines[0]
    assert "short: input" in lines[0]
    assert len(lines) == 1 + len(whole.calls) + 1 + 1
    assert lines[-2].lstrip().startswith("all")
    assert "tokens counted by approximate" in lines[-1]


async def test_replay_checks_its_arguments() -> None:
    with pytest.raises(TypeError, match=r"agent must be a raf\.Agent"):
        await raf.replay("agent", [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"messages\[0\] must be a ChatMessage"):
        await raf.replay(_agent(ScriptedChatClient()), ["hi"])  # type: ignore[list-item]
    empty = await raf.replay(_agent(ScriptedChatClient()), [])
    assert (empty.calls, empty.turns, empty.billed_units, empty.cached_share) == ((), 0, 0, 0.0)


async def test_a_call_id_used_again_in_a_later_turn_gets_its_own_turns_result() -> None:
    # Some servers number calls per answer ("call_0" every turn): each turn's own result.
    def turn(order: str) -> tuple[ChatMessage, ...]:
        call = ToolCall("call_0", "lookup", f'{{"order": "{order}"}}')
        return (
            ChatMessage.user(f"where is {order}?"),
            ChatMessage.assistant(None, tool_calls=(call,)),
            ChatMessage.tool("call_0", f"order {order}: recorded", name="lookup"),
            ChatMessage.assistant(f"{order} shipped"),
        )

    given: list[str | None] = []

    async def seen(request: object, call_next: object) -> ChatMessage:
        result: ChatMessage = await call_next(request)  # type: ignore[operator]
        given.append(result.content)
        return result

    agent = Agent(ScriptedChatClient(), tools=[lookup], tool_stack=[seen], history=True)
    report = await raf.replay(agent, (*turn("1"), *turn("2")))
    assert given == ["order 1: recorded", "order 2: recorded"]
    assert not report.diverged, report.divergences


async def test_a_recorded_read_of_a_cut_result_is_answered_from_the_recording() -> None:
    # The run's ToolOutputLimit cut a result, and the model read it back: the replay's model
    # gets the recorded read (the full result is not in the recording), no divergence.
    full = "\n".join(f"row {n}" for n in range(400))
    limit = raf.ToolOutputLimit(1000)
    read = ToolCall("r1", "read_tool_result", '{"call_id": "c1", "pattern": "^row 399$"}')
    messages = (
        ChatMessage.user("dump it"),
        ChatMessage.assistant(None, tool_calls=(ToolCall("c1", "lookup", '{"order": "1"}'),)),
        ChatMessage.tool("c1", limit.cut(full, "c1"), name="lookup"),
        ChatMessage.assistant(None, tool_calls=(read,)),
        ChatMessage.tool("r1", "[1 line matches]\nline 400: row 399", name="read_tool_result"),
        ChatMessage.assistant("The last row is 399."),
    )
    given: list[str | None] = []

    async def seen(request: object, call_next: object) -> ChatMessage:
        result: ChatMessage = await call_next(request)  # type: ignore[operator]
        given.append(result.content)
        return result

    agent = Agent(ScriptedChatClient(), tools=[lookup], tool_stack=[seen, limit], history=True)
    report = await raf.replay(agent, messages)
    assert not report.diverged, report.divergences
    assert given[-1] == "[1 line matches]\nline 400: row 399"
