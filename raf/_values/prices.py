"""Prices: what a model's tokens cost in USD, from genai-prices or the caller's own figures.

Vendors write prices per million tokens, in four kinds: input, cached input
(a prompt prefix served from the vendor's cache), cache write (a prefix the
vendor stored, which Anthropic bills above input) and output. raf prices a
model call from these four and the call's :class:`raf.Usage`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, Final

import attrs

from raf._values.context import ChatRequest
from raf._values.messages import AgentResponse, Usage

__all__ = ["Prices"]

#: The kinds of price a model has, as ``Prices(overrides=...)`` names them.
KINDS: Final = ("input", "cached_input", "cache_write", "output")
_MILLION: Final = Decimal(1_000_000)
#: The most any amount may be (a quadrillion dollars): past what money counts, and far within
#: what a Decimal computes with.
_MOST: Final = Decimal(10) ** 15
#: genai-prices' names of the same kinds (a kind it lacks costs what input costs).
_GENAI: Final = {
    "input": "input_mtok",
    "cached_input": "cache_read_mtok",
    "cache_write": "cache_write_mtok",
    "output": "output_mtok",
}


@attrs.frozen(slots=True)
class Rates:
    """One model's prices, USD per million tokens, at one size of prompt.

    >>> Rates(Decimal("0.15"), Decimal("0.075"), Decimal("0.15"), Decimal("0.6")).cost(
    ...     Usage(1000, 100, cached_input_tokens=800))
    Decimal('0.00015')
    """

    input: Decimal
    cached_input: Decimal
    cache_write: Decimal
    output: Decimal

    def cost(self, usage: Usage) -> Decimal:
        """What ``usage`` costs: its cached part at the cached price, its cache writes at the
        write price, the rest of the input at the input price, and the output."""
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - cached)
        plain = usage.input_tokens - cached - written
        return (
            plain * self.input
            + cached * self.cached_input
            + written * self.cache_write
            + usage.output_tokens * self.output
        ) / _MILLION


class Prices:
    """What each model's tokens cost: genai-prices' data, and ``overrides`` of your own.

    ``overrides`` maps a model name to its prices in USD per million tokens,
    as the vendors' price pages write them: ``{"input": ..., "output": ...}``
    and optionally ``"cached_input"`` and ``"cache_write"`` (each defaults to
    the input price). A model that ``overrides`` names is priced from it
    (a model genai-prices does not know, or a negotiated price); any other
    from `genai-prices <https://github.com/pydantic/genai-prices>`_, the
    maintained price data pydantic-ai uses (loaded on first use: it is a
    large table). A price that is not a number, or is negative, is a
    ``ValueError`` here, not at the first call.

    >>> prices = Prices(overrides={"house-model": {"input": 1, "output": "4"}})
    >>> prices.cost(Usage(1_000_000, 500_000), "house-model")
    Decimal('3')
    >>> prices.cost(Usage(10, 1), "no-such-model") is None
    True
    """

    __slots__ = ("_found", "_lock", "overrides")

    def __init__(self, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        if overrides is None:
            overrides = {}
        if not isinstance(overrides, Mapping):
            raise TypeError(
                f"Prices: overrides must be a mapping of model name to prices, got {overrides!r}"
            )
        #: The caller's prices by model, USD per million tokens.
        self.overrides: Mapping[str, Rates] = {
            _model_name(model): _rates(model, given) for model, given in overrides.items()
        }
        # genai-prices' answers by model (None: it does not know the model), kept here.
        self._found: dict[str, Any] = {}
        self._lock = threading.Lock()

    def rates(self, model: str | None, input_tokens: int = 0) -> Rates | None:
        """``model``'s prices for a prompt of ``input_tokens`` (some vendors charge more for
        all the tokens of a long prompt); ``None`` when no price is known for it."""
        if not model:
            return None
        own = self.overrides.get(model)
        if own is not None:
            return own
        return _genai_rates(self._genai_model(model), input_tokens)

    def cost(self, usage: Usage, model: str | None) -> Decimal | None:
        """What ``usage`` of ``model`` costs in USD; ``None`` for a model of no known price."""
        rates = self.rates(model, usage.input_tokens)
        return None if rates is None else rates.cost(usage)

    def _genai_model(self, model: str) -> Any:
        with self._lock:
            if model in self._found:
                return self._found[model]
        # Local: genai-prices' table takes half a second to load; an agent that never
        # prices a call must not pay for it at `import raf`.
        from genai_prices import data_snapshot

        try:
            _, info = data_snapshot.get_snapshot().find_provider_model(model, None, None, None)
            found: Any = info.get_prices(datetime.now(UTC))
        except LookupError:
            found = None
        with self._lock:
            self._found[model] = found
        return found

    def __repr__(self) -> str:
        return f"Prices(overrides={sorted(self.overrides)!r})"


def _model_name(model: object) -> str:
    if not isinstance(model, str) or not model:
        raise TypeError(f"Prices: a model name must be a non-empty str, got {model!r}")
    return model


def _rates(model: str, given: object) -> Rates:
    """The override of ``model``, each price checked: a finite number >= 0."""
    if not isinstance(given, Mapping):
        raise TypeError(
            f"Prices: the prices of {model!r} must be a mapping such as "
            f'{{"input": 0.15, "output": 0.6}} (USD per million tokens), got {given!r}'
        )
    unknown = sorted(set(map(str, given)) - set(KINDS))
    if unknown:
        raise ValueError(
            f"Prices: {model!r} names unknown prices {unknown}; the kinds are {list(KINDS)}"
        )
    for needed in ("input", "output"):
        if needed not in given:
            raise ValueError(f"Prices: {model!r} needs an {needed!r} price (USD per million)")
    values = {kind: _price(model, kind, given[kind]) for kind in KINDS if kind in given}
    return Rates(
        values["input"],
        values.get("cached_input", values["input"]),
        values.get("cache_write", values["input"]),
        values["output"],
    )


def _price(model: str, kind: str, value: object) -> Decimal:
    return amount(f"Prices: {model!r} {kind!r}", value, "USD per million tokens")


def amount(what: str, value: object, unit: str = "USD") -> Decimal:
    """``value`` (an int, a float, a decimal string, a ``Decimal``) as a ``Decimal`` that is
    finite and >= 0; else a ``ValueError`` that starts with ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise ValueError(f"{what} must be a number of {unit}, got {value!r}")
    try:
        # A float goes through its shortest repr: 0.15 is Decimal("0.15"), not 0.1499...
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except InvalidOperation:
        raise ValueError(f"{what} must be a number of {unit}, got {value!r}") from None
    if not number.is_finite() or number < 0:
        raise ValueError(f"{what} must be finite and >= 0 ({unit}), got {value!r}")
    if number > _MOST:  # Decimal holds 1e99999999999, and overflows computing with it
        raise ValueError(f"{what} must be at most 1E+15 ({unit}: a quadrillion), got {value!r}")
    return number


def model_of(request: ChatRequest, response: AgentResponse | None) -> str | None:
    """The model a call is priced for: the one that answered (a fallback names its own),
    else the one the call asked for, else the agent's client's."""
    if response is not None and response.model:
        return response.model
    if request.options.model:
        return request.options.model
    agent = getattr(request.invocation, "agent", None)
    model = getattr(getattr(agent, "chat_client", None), "model", None)
    return model if isinstance(model, str) and model else None


def _genai_rates(found: Any, input_tokens: int) -> Rates | None:
    """genai-prices' prices of a model (``None``: unknown) at a prompt of ``input_tokens``."""
    if found is None:
        return None
    values: dict[str, Decimal] = {}
    for kind, name in _GENAI.items():
        price = getattr(found, name, None)
        if price is None:
            continue
        if not isinstance(price, Decimal):  # tiered: one tier's price for every token
            tier_price: Decimal = price.base
            for tier in price.tiers:
                if input_tokens > tier.start:
                    tier_price = tier.price
            price = tier_price
        values[kind] = price
    if "input" not in values or "output" not in values:
        return None  # priced by something else (images, requests): not by tokens
    base = values["input"]
    return Rates(
        base,
        values.get("cached_input", base),
        values.get("cache_write", base),
        values["output"],
    )


def nanos(cost: Decimal) -> int:
    """``cost`` (USD) in whole nano-dollars, rounded up: what the spend stores count in."""
    return math.ceil(cost * 1_000_000_000)
