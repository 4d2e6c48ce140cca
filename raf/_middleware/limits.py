"""UsageLimits: limits on one run's model calls, checked before each call is sent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from decimal import Decimal
from typing import Any, Final

import attrs

from raf._values.context import ChatRequest
from raf._values.messages import AgentResponse, ChatMessage, Usage
from raf._values.prices import Prices, amount, model_of
from raf._values.protocols import Tool
from raf._values.tokens import approximate_prompt_tokens
from raf.errors import ConfigError, UsageLimitExceeded

__all__ = ["UsageLimits"]

_MILLION: Final = Decimal(1_000_000)
#: Where a run keeps what it spent, in ``Run.state``, per UsageLimits (see ``_spent``).
_STATE: Final = "raf.usage_limits"


@attrs.define(slots=True)
class _Spent:
    """What one run has spent so far under one :class:`UsageLimits`."""

    requests: int = 0
    usage: Usage = attrs.field(factory=Usage)
    cost: Decimal | None = Decimal(0)  # None once a call could not be priced
    unpriced: str | None = None  # the model of that call


class UsageLimits:
    """Chat middleware: limits on one run's model calls; the call that would pass one is not sent.

    ``Agent(client, chat_stack=[UsageLimits(max_requests=5, max_cost="0.10")])``.
    Each limit is optional:

    - ``max_requests``: model calls in the run;
    - ``max_input_tokens``, ``max_output_tokens``, ``max_total_tokens``: the
      run's tokens, all its calls together;
    - ``max_request_input_tokens``: the input of any single call;
    - ``max_cost``: USD (a number or a decimal string), priced with ``prices``
      (a :class:`raf.Prices`; default genai-prices' data) for the model that
      answered each call.

    Before each call its input is counted (with the agent's client's
    ``count_tokens`` when it has one, else roughly) and the call is refused
    with :class:`raf.errors.UsageLimitExceeded` when it would pass a limit:
    more requests than allowed, more input than allowed, or, for
    ``max_cost``, what was spent plus this call's input at the uncached input
    price (what the call costs at least). Output is known only once it has
    come: a call whose answer passes ``max_output_tokens``, ``max_total_tokens``
    or ``max_cost`` ends normally, and the next call of the run is refused.
    The error ends the run like any other: every post stage runs and sees it.

    The limits are per run (``Agent.run``, ``Agent.stream``: the tool loop's
    calls and the structured-output retries together). Put it *before*
    :class:`raf.FallbackMiddleware` in ``chat_stack`` so that a fallback's
    call is priced at its own model's price, and *after*
    :class:`raf.RetryMiddleware` to count every attempt as a request (before
    it, a retried call is one). ``max_cost`` needs a price for the model:
    a model of no known price is a :class:`raf.errors.ConfigError` at its
    first call. A limit that is not a number >= 0 is an error here.

    >>> from raf import Agent, EchoChatClient
    >>> agent = Agent(EchoChatClient(), chat_stack=[UsageLimits(max_requests=3)])
    """

    __slots__ = (
        "max_cost",
        "max_input_tokens",
        "max_output_tokens",
        "max_request_input_tokens",
        "max_requests",
        "max_total_tokens",
        "prices",
    )

    def __init__(
        self,
        *,
        max_requests: int | None = None,
        max_input_tokens: int | None = None,
        max_output_tokens: int | None = None,
        max_total_tokens: int | None = None,
        max_cost: Decimal | float | str | None = None,
        max_request_input_tokens: int | None = None,
        prices: Prices | None = None,
    ) -> None:
        self.max_requests = _count("max_requests", max_requests)
        self.max_input_tokens = _count("max_input_tokens", max_input_tokens)
        self.max_output_tokens = _count("max_output_tokens", max_output_tokens)
        self.max_total_tokens = _count("max_total_tokens", max_total_tokens)
        self.max_request_input_tokens = _count("max_request_input_tokens", max_request_input_tokens)
        self.max_cost = None if max_cost is None else amount("UsageLimits: max_cost", max_cost)
        if prices is not None and not isinstance(prices, Prices):
            raise TypeError(f"UsageLimits: prices must be a raf.Prices, got {prices!r}")
        self.prices = Prices() if prices is None else prices

    async def __call__(
        self, request: Any, call_next: Callable[[Any], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Check the call against the limits, send it, then add what it spent."""
        if not isinstance(request, ChatRequest):
            raise TypeError(
                "UsageLimits belongs in Agent(chat_stack=[...]): it limits model calls, and "
                f"got a {type(request).__name__}"
            )
        spent = self._spent(request)
        self._check(request, spent)
        spent.requests += 1
        response = await call_next(request)
        usage = response.usage or Usage()
        spent.usage += usage
        if spent.cost is not None:
            model = model_of(request, response)
            cost = self.prices.cost(usage, model)
            spent.cost = None if cost is None else spent.cost + cost
            spent.unpriced = model if cost is None else None
        return response

    def _spent(self, request: ChatRequest) -> _Spent:
        """What this run has spent under these limits (a call outside a run: nothing yet)."""
        if request.invocation is None:
            return _Spent()
        # One entry per UsageLimits object: two of them in a stack keep their own counts.
        kept: dict[int, _Spent] = request.invocation.run.state.setdefault(_STATE, {})
        return kept.setdefault(id(self), _Spent())

    def _check(self, request: ChatRequest, spent: _Spent) -> None:
        def refuse(limit: str, detail: str) -> UsageLimitExceeded:
            return UsageLimitExceeded(
                limit, detail, spent=spent.usage, cost=spent.cost, requests=spent.requests
            )

        if self.max_requests is not None and spent.requests + 1 > self.max_requests:
            raise refuse(
                "max_requests",
                f"the run has made {spent.requests} model calls of {self.max_requests}",
            )
        used = spent.usage
        if self.max_output_tokens is not None and used.output_tokens >= self.max_output_tokens:
            raise refuse(
                "max_output_tokens",
                f"the run's answers took {used.output_tokens} tokens of {self.max_output_tokens}",
            )
        if not self._counts_input():
            return
        counted = count_input(request)
        if self.max_request_input_tokens is not None and counted > self.max_request_input_tokens:
            raise refuse(
                "max_request_input_tokens",
                f"the call's input is {counted} tokens, over {self.max_request_input_tokens}",
            )
        limit = self.max_input_tokens
        if limit is not None and used.input_tokens + counted > limit:
            raise refuse(
                "max_input_tokens",
                f"the run has spent {used.input_tokens} input tokens of {limit} "
                f"and the call's input is {counted}",
            )
        limit = self.max_total_tokens
        if limit is not None and used.total_tokens + counted > limit:
            raise refuse(
                "max_total_tokens",
                f"the run has spent {used.total_tokens} tokens of {limit} "
                f"and the call's input is {counted}",
            )
        if self.max_cost is not None:
            model = model_of(request, None)
            rates = self.prices.rates(model, counted)
            if spent.cost is None:  # a model that answered (a server's own name for it)
                raise ConfigError(
                    f"UsageLimits: max_cost needs the price of model {spent.unpriced!r}, which "
                    "answered a call of the run; give it with raf.Prices(overrides={model: "
                    '{"input": ..., "output": ...}})'
                )
            if rates is None:
                raise ConfigError(
                    f"UsageLimits: max_cost needs the price of model {model!r}; give it with "
                    'raf.Prices(overrides={model: {"input": ..., "output": ...}})'
                )
            least = counted * rates.input / _MILLION
            if spent.cost + least > self.max_cost:
                raise refuse(
                    "max_cost",
                    f"the run has spent ${spent.cost} of ${self.max_cost} and the call's "
                    f"input alone costs ${least}",
                )

    def _counts_input(self) -> bool:
        return (
            self.max_request_input_tokens is not None
            or self.max_input_tokens is not None
            or self.max_total_tokens is not None
            or self.max_cost is not None
        )

    def __repr__(self) -> str:
        limits = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in self.__slots__
            if name != "prices" and getattr(self, name) is not None
        )
        return f"UsageLimits({limits})"


def count_input(request: ChatRequest) -> int:
    """The call's input tokens, counted before it is sent: with the agent's client's
    ``count_tokens`` when it has one, else roughly."""
    agent = getattr(request.invocation, "agent", None)
    counter: Callable[[Sequence[ChatMessage], Sequence[Tool]], int] | None = getattr(
        getattr(agent, "chat_client", None), "count_tokens", None
    )
    if not callable(counter):
        counter = approximate_prompt_tokens
    return counter(request.messages, request.options.tools)


def _count(name: str, value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ValueError(f"UsageLimits: {name} must be an int >= 0 or None, got {value!r}")
    return value
