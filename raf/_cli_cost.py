"""``raf chat``'s line of what each turn cost: an observer that prices every model call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from decimal import Decimal

from raf._observers.ledger import usd
from raf._onion.observe import Observer
from raf._values.context import ChatRequest
from raf._values.messages import AgentResponse, Usage
from raf._values.prices import Prices, model_of

__all__: list[str] = []


class TurnCost(Observer):
    """Sums the usage and the cost of the model calls since :meth:`line` last read them.

    Each call is priced for the model that answered it (a fallback's at its
    own price); a call of a model of no known price leaves the cost unknown.
    """

    def __init__(self, prices: Prices | None = None) -> None:
        self.prices = Prices() if prices is None else prices
        self._usage = Usage()
        self._cost: Decimal | None = Decimal(0)
        self._calls = 0

    async def model_call(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Adds the call's usage and cost, once it answered."""
        response = await call_next(request)
        self._calls += 1
        usage = response.usage or Usage()
        self._usage += usage
        cost = self.prices.cost(usage, model_of(request, response))
        self._cost = None if cost is None or self._cost is None else self._cost + cost
        return response

    def line(self) -> str | None:
        """What the turn cost (``None`` when no call of it was priced), then start over."""
        usage, cost, calls = self._usage, self._cost, self._calls
        self._usage, self._cost, self._calls = Usage(), Decimal(0), 0
        if cost is None or not calls or usage.total_tokens == 0:
            return None
        plural = "" if calls == 1 else "s"
        return (
            f"({calls} model call{plural}: {usage.input_tokens} in, {usage.output_tokens} out, "
            f"{usd(cost)})"
        )
