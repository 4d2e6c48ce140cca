"""The ledger in money: each call's bill, each layer's share of it (cached tokens at the cached
price, cache writes at the write price), and a fallback's call at its own model's price."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

import pytest

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    FallbackMiddleware,
    Prices,
    ScriptedChatClient,
    Usage,
)
from raf.errors import RateLimitError
from raf.observe import ContextLedger

pytestmark = pytest.mark.anyio

PRICES = Prices(
    overrides={
        "house": {"input": 10, "cached_input": 1, "cache_write": 20, "output": 100},
        "backup": {"input": 1000, "output": 1000},
    }
)


class Rules(ContextProvider):
    async def on_invoking(self, agent, session, messages, options):  # type: ignore[no-untyped-def]
        return ContextResult(instructions="Refunds within 30 days. " * 40)


def answering(usage: Usage, model: str | None = "house") -> object:
    def answer(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        return AgentResponse((ChatMessage.assistant("ok"),), usage, model=model)

    return answer


async def test_each_layer_pays_its_share_and_the_cached_prefix_at_the_cached_price() -> None:
    ledger = ContextLedger(prices=PRICES)
    usage = Usage(1000, 50, cached_input_tokens=600, cache_write_tokens=100)
    agent = Agent(
        ScriptedChatClient([answering(usage)]),
        instructions="Be brief.",
        stack=[Rules()],
        observers=[ledger],
    )
    await agent.run("What is the refund window for a damaged parcel?")
    entry = ledger.calls[0]
    assert entry.model == "house"
    assert entry.cost == PRICES.cost(usage, "house")
    output = Decimal(50 * 100) / 1_000_000
    shares = [part.cost for part in entry.parts]
    assert all(share is not None and share > 0 for share in shares)
    assert sum(share or 0 for share in shares) + output == entry.cost
    # The prompt's beginning is what the vendor read from its cache: the agent's
    # instructions are billed at the cached price alone, the request at the input price.
    first, last = entry.parts[0], entry.parts[-1]
    assert (first.layer, last.layer) == ("agent", "request")
    billed = [round(p.tokens * 1000 / entry.input_tokens) for p in (first, last)]
    assert first.cost == Decimal(billed[0]) * 1 / 1_000_000
    assert last.cost == Decimal(billed[1]) * 10 / 1_000_000


async def test_a_model_of_no_known_price_costs_none_and_the_report_says_no_money() -> None:
    ledger = ContextLedger(prices=PRICES)
    agent = Agent(ScriptedChatClient([answering(Usage(10, 2), model="nobody-knows")]),
                  observers=[ledger])  # fmt: skip
    await agent.run("hi")
    entry = ledger.calls[0]
    assert entry.cost is None
    assert all(part.cost is None for part in entry.parts)
    assert "cost" not in ledger.report()


async def test_a_call_that_reports_no_usage_costs_none() -> None:
    ledger = ContextLedger(prices=PRICES)
    agent = Agent(ScriptedChatClient(["ok"]), observers=[ledger])
    await agent.run("hi", options=None)
    assert ledger.calls[0].cost is None


async def test_the_report_shows_each_call_and_each_layer_in_money() -> None:
    ledger = ContextLedger(prices=PRICES)
    usage = Usage(1000, 50, cached_input_tokens=600)
    agent = Agent(
        ScriptedChatClient([answering(usage), answering(usage)]),
        instructions="Be brief.",
        stack=[Rules()],
        observers=[ledger],
    )
    await agent.run("one")
    await agent.run("two")
    lines = ledger.report().splitlines()
    assert lines[0].split()[-1] == "cost"
    each = PRICES.cost(usage, "house")
    assert each is not None
    assert lines[1].split()[-1] == f"${each:.6f}"
    assert lines[3].split()[-1] == f"${2 * each:.6f}"
    by_layer = lines[lines.index(next(x for x in lines if x.startswith("cost by layer"))) :]
    assert by_layer[0] == "cost by layer (2 priced calls; house):"
    assert [line.split()[0] for line in by_layer[1:]] == ["agent", "Rules", "request", "output"]
    assert by_layer[-1].split()[-1] == f"${Decimal(2 * 50 * 100) / 1_000_000:.6f}"


async def test_a_fallbacks_call_is_priced_at_its_own_models_price() -> None:
    ledger = ContextLedger(prices=PRICES)
    backup = ScriptedChatClient([answering(Usage(100, 10), model=None)])
    backup.model = "backup"  # type: ignore[attr-defined]
    primary = ScriptedChatClient([RateLimitError("slow down", status_code=429)])
    primary.model = "house"  # type: ignore[attr-defined]
    agent = Agent(primary, chat_stack=[FallbackMiddleware(backup)], observers=[ledger])
    await agent.run("hi")
    entry = ledger.calls[0]
    assert entry.model == "backup"
    assert entry.cost == Decimal(110 * 1000) / 1_000_000


def test_the_ledger_takes_prices_only() -> None:
    with pytest.raises(TypeError, match=r"prices must be a raf\.Prices"):
        ContextLedger(prices={"house": {"input": 1, "output": 1}})  # type: ignore[arg-type]
