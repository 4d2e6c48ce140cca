"""raf.SpendLimits and raf.Budget: a call holds its least cost until it settles, a budget with
no room refuses the call before the model sees it, and bad budgets are refused when built."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    Budget,
    BudgetExceeded,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    FallbackMiddleware,
    InMemorySession,
    Invocation,
    Prices,
    ScriptedChatClient,
    SpendLimits,
    SqliteSessionStore,
    Usage,
)
from raf.errors import ConfigError, RateLimitError

pytestmark = pytest.mark.anyio

# house: a token of input is $0.001, of output $0.01; backup ten times that.
PRICES = Prices(
    overrides={
        "house": {"input": 1000, "output": 10000},
        "backup": {"input": 10000, "output": 100000},
    }
)


def answer(usage: Usage) -> Any:
    def step(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        return AgentResponse((ChatMessage.assistant("ok"),), usage)

    return step


def client(*steps: Any, model: str = "house", counted: int = 10) -> ScriptedChatClient:
    scripted = ScriptedChatClient(list(steps))
    scripted.model = model  # type: ignore[attr-defined]
    scripted.count_tokens = lambda messages, tools=(): counted  # type: ignore[attr-defined]
    return scripted


class Seen(ContextProvider):
    def __init__(self) -> None:
        self.errors: list[BaseException | None] = []

    async def on_invoked(self, agent, session, request_messages, response, error):  # type: ignore[no-untyped-def]
        self.errors.append(error)


async def test_a_budget_refuses_the_call_it_has_no_room_for_and_the_model_is_not_called() -> None:
    # Each call: 10 tokens in ($0.01), 1 out ($0.01): $0.02. The third call's hold ($0.01 of
    # input) fits beside $0.04 spent; it settles at $0.06, and the fourth's hold does not fit.
    budget = Budget("0.05", "day")
    limits = SpendLimits([budget], prices=PRICES)
    model = client(*(answer(Usage(10, 1)) for _ in range(4)))
    seen = Seen()
    agent = Agent(model, stack=[seen], chat_stack=[limits])
    session = InMemorySession("alice")
    await agent.run("one", session=session)
    await agent.run("two", session=session)
    await agent.run("three", session=session)
    with pytest.raises(BudgetExceeded) as caught:
        await agent.run("four", session=session)
    assert len(model.requests) == 3
    error = caught.value
    assert error.budget is budget
    assert error.spent == Decimal("0.06")
    assert error.scope == "alice"
    now = datetime.now(UTC)
    assert error.resets_at == budget.window(now)[1]
    assert 0 < error.retry_after <= 86400
    assert seen.errors[-1] is error
    assert "budget $0.05 per day of alice is spent" in str(error)


async def test_the_hold_is_the_input_and_max_tokens_of_output() -> None:
    # Input 10 tokens = $0.01; max_tokens 4 = $0.04: a hold of $0.05 fits $0.05 exactly.
    limits = SpendLimits([Budget("0.05", "day")], prices=PRICES)
    model = client(answer(Usage(10, 1)))
    agent = Agent(model, chat_stack=[limits])
    await agent.run("hi", options=AgentRunOptions(max_tokens=4))
    limits = SpendLimits([Budget("0.0499", "day")], prices=PRICES)
    model = client(answer(Usage(10, 1)))
    with pytest.raises(BudgetExceeded):
        await Agent(model, chat_stack=[limits]).run("hi", options=AgentRunOptions(max_tokens=4))
    assert model.requests == []


async def test_each_session_has_its_own_budget() -> None:
    limits = SpendLimits([Budget("0.02", "hour")], prices=PRICES)
    agent = Agent(client(*(answer(Usage(10, 1)) for _ in range(3))), chat_stack=[limits])
    await agent.run("hi", session=InMemorySession("a"))
    await agent.run("hi", session=InMemorySession("b"))
    with pytest.raises(BudgetExceeded):
        await agent.run("hi", session=InMemorySession("a"))


async def test_an_agents_budget_and_a_functions_scope() -> None:
    def tenant(invocation: Invocation | None) -> str:
        assert invocation is not None
        return invocation.session.id.split("/")[0]

    limits = SpendLimits(
        [Budget("1", "month", "agent"), Budget("0.02", "minute", tenant)], prices=PRICES
    )
    agent = Agent(
        client(*(answer(Usage(10, 1)) for _ in range(3))), name="support", chat_stack=[limits]
    )
    await agent.run("hi", session=InMemorySession("acme/1"))
    with pytest.raises(BudgetExceeded) as caught:
        await agent.run("hi", session=InMemorySession("acme/2"))
    assert caught.value.scope == "acme"
    await agent.run("hi", session=InMemorySession("globex/1"))


async def test_a_function_scope_is_counted_under_its_name_the_same_in_every_process() -> None:
    # The counts' keys hold the scope's name: a named function's qualified name, or name=.
    def tenant(invocation: Invocation | None) -> str:
        return "acme"

    assert Budget(1, "day", tenant).label().endswith("<locals>.tenant")
    assert Budget(1, "day", functools.partial(tenant), name="tenant").label() == "tenant"
    # Two lambdas are two budgets (named), not one counted twice.
    by_user = Budget(5, "day", lambda invocation: "alice", name="user")
    by_org = Budget(50, "day", lambda invocation: "acme", name="org")
    assert len(SpendLimits([by_user, by_org], prices=PRICES).budgets) == 2


@pytest.mark.parametrize(
    "scope",
    [
        lambda invocation: "acme",  # every lambda is '<lambda>': unrelated budgets would merge
        functools.partial(str),  # its repr holds an address: another in every process
        type("Tenant", (), {"__call__": lambda self, invocation: "acme"})(),
    ],
)
def test_a_function_scope_without_a_lasting_name_needs_one(scope: Any) -> None:
    with pytest.raises(ValueError, match="give it one: Budget"):
        Budget(1, "day", scope)


async def test_a_failed_call_gives_its_hold_back() -> None:
    limits = SpendLimits([Budget("0.02", "day")], prices=PRICES)
    model = client(
        RateLimitError("slow down", status_code=429), answer(Usage(10, 1)), answer(Usage(10, 1))
    )
    agent = Agent(model, chat_stack=[limits])
    session = InMemorySession("s")
    with pytest.raises(RateLimitError):
        await agent.run("hi", session=session)
    await agent.run("hi", session=session)  # the failed call held nothing once it failed
    with pytest.raises(BudgetExceeded):
        await agent.run("hi", session=session)


async def test_a_cancelled_call_keeps_its_hold() -> None:
    # A call cancelled in flight was sent: the vendor bills it (its input, what it wrote).
    # Its hold stands, else a caller who hangs up every call would spend without a limit.
    limits = SpendLimits([Budget("0.01", "day", "agent")], prices=PRICES)
    started = anyio.Event()

    async def slow(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError

    agent = Agent(client(slow, answer(Usage(10, 0))), chat_stack=[limits])
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run, "hi")
        await started.wait()
        group.cancel_scope.cancel()
    with pytest.raises(BudgetExceeded):  # $0.01: all of it, held by the cancelled call
        await agent.run("hi")


async def test_a_stream_left_early_keeps_its_calls_hold() -> None:
    limits = SpendLimits([Budget("0.01", "day", "agent")], prices=PRICES)
    started = anyio.Event()

    async def slow(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError

    agent = Agent(client(slow, answer(Usage(10, 0))), chat_stack=[limits])
    async with agent.stream("hi"):
        await started.wait()  # the call is in flight; the reader leaves
    with pytest.raises(BudgetExceeded):
        await agent.run("hi")


async def test_calls_in_flight_hold_their_cost_so_the_budget_is_never_passed() -> None:
    # Ten concurrent calls of $0.01 each ($0.01 in, no output) race for a budget of $0.03.
    limits = SpendLimits([Budget("0.03", "day", "agent")], prices=PRICES)
    go = anyio.Event()

    async def slow(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        await go.wait()
        return AgentResponse((ChatMessage.assistant("ok"),), Usage(10, 0))

    model = client(*(slow for _ in range(10)))
    agent = Agent(model, chat_stack=[limits])
    outcomes: list[str] = []

    async def one() -> None:
        try:
            await agent.run("hi")
            outcomes.append("sent")
        except BudgetExceeded:
            outcomes.append("refused")
            if outcomes.count("refused") == 7:
                go.set()

    async with anyio.create_task_group() as group:
        for _ in range(10):
            group.start_soon(one)
    assert sorted(outcomes) == ["refused"] * 7 + ["sent"] * 3
    assert len(model.requests) == 3


async def test_a_fallbacks_call_is_priced_at_its_own_models_price() -> None:
    limits = SpendLimits([Budget("0.2", "day")], prices=PRICES)
    backup = client(answer(Usage(10, 0)), answer(Usage(10, 0)), model="backup")
    primary = client(
        RateLimitError("slow down", status_code=429),
        RateLimitError("slow down", status_code=429),
        RateLimitError("slow down", status_code=429),
    )
    agent = Agent(primary, chat_stack=[limits, FallbackMiddleware(backup)])
    await agent.run("hi", session=InMemorySession("s"))  # backup: $0.10, not house's $0.01
    await agent.run("hi", session=InMemorySession("s"))  # $0.20 spent: at the budget
    with pytest.raises(BudgetExceeded) as caught:
        await agent.run("hi", session=InMemorySession("s"))
    assert caught.value.spent == Decimal("0.2")


async def test_a_model_of_no_known_price_is_a_clear_error() -> None:
    limits = SpendLimits([Budget(1, "day")], prices=PRICES)
    agent = Agent(client(answer(Usage(1, 1)), model="nobody-knows"), chat_stack=[limits])
    with pytest.raises(ConfigError, match="the budgets need the price of model 'nobody-knows'"):
        await agent.run("hi")


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: Budget(-1, "day"), ValueError, "Budget: usd must be finite and >= 0"),
        (lambda: Budget("five", "day"), ValueError, "Budget: usd must be a number of USD"),
        (lambda: Budget(5, "week"), ValueError, "Budget: per must be one of ['minute',"),
        (lambda: Budget(5, "day", "user"), ValueError, "Budget: scope must be one of"),
        (lambda: SpendLimits([]), TypeError, "budgets must be one or more raf.Budget"),
        (lambda: SpendLimits([5]), TypeError, "budgets must be one or more raf.Budget"),
        (
            lambda: SpendLimits([Budget(1, "day"), Budget(2, "day")]),
            ValueError,
            "count the same spending",
        ),
        (lambda: SpendLimits(Budget(1, "day"), store=42), TypeError, "store must be None"),
        (lambda: SpendLimits(Budget(1, "day"), prices={}), TypeError, "must be a raf.Prices"),
    ],
)
def test_bad_budgets_are_refused_when_built(
    build: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as caught:
        build()
    assert message in str(caught.value)


@given(st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)))
def test_windows_follow_each_other_and_hold_their_moment(moment: datetime) -> None:
    now = moment.replace(tzinfo=UTC)
    for per in ("minute", "hour", "day", "month"):
        budget = Budget(1, per)  # type: ignore[arg-type]
        start, end = budget.window(now)
        assert start <= now < end
        assert budget.window(end)[0] == end
        assert budget.window(end - timedelta(microseconds=1)) == (start, end)


async def test_an_answered_call_is_returned_when_its_store_cannot_settle(tmp_path: Any) -> None:
    # The call was answered, and the vendor bills it: a store that fails to settle it (here a
    # trigger in the real SQLite file refuses every update) must not lose the paid answer.
    path = tmp_path / "spend.db"

    def refuse_updates(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TRIGGER refuse BEFORE UPDATE ON raf_spend "
                "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
            )
        return AgentResponse((ChatMessage.assistant("paid for"),), Usage(10, 5))

    async with SqliteSessionStore(path) as store:
        limits = SpendLimits([Budget("1", "day")], store=store, prices=PRICES)
        agent = Agent(client(refuse_updates), chat_stack=[limits])
        with capture_logs() as events:
            response = await agent.run("hi", session=InMemorySession("s"))
    assert response.text == "paid for"
    [failed] = [event for event in events if event["event"] == "spend.settle_failed"]
    assert failed["log_level"] == "error"
    assert (failed["held"], failed["cost"]) == ("0.01", "0.06")
    assert "disk full" in failed["error"]
    # The hold ($0.01 of input) stands as the call's cost, and the log says what was not settled.
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT spent FROM raf_spend").fetchall() == [(10_000_000,)]
