"""raf.Prices: genai-prices' data, the caller's overrides, and bad prices refused when built."""

from __future__ import annotations

from decimal import Decimal

import genai_prices
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raf import Budget, Prices, Usage, UsageLimits

pytestmark = pytest.mark.anyio


def test_an_override_prices_a_model_per_million_tokens() -> None:
    prices = Prices(
        overrides={
            "house-model": {"input": 2, "cached_input": "0.5", "cache_write": 2.5, "output": 8}
        }
    )
    usage = Usage(1_000_000, 1_000_000, cached_input_tokens=400_000, cache_write_tokens=100_000)
    # 500k plain at 2, 400k cached at 0.5, 100k written at 2.5, 1M out at 8.
    assert prices.cost(usage, "house-model") == Decimal("1") + Decimal("0.2") + Decimal(
        "0.25"
    ) + Decimal("8")


def test_cached_and_write_prices_default_to_the_input_price() -> None:
    rates = Prices(overrides={"m": {"input": 1, "output": 2}}).rates("m")
    assert rates is not None
    assert (rates.cached_input, rates.cache_write) == (Decimal(1), Decimal(1))


def test_a_float_price_is_the_number_written() -> None:
    rates = Prices(overrides={"m": {"input": 0.15, "output": 0.6}}).rates("m")
    assert rates is not None
    assert rates.input == Decimal("0.15")


def test_an_override_wins_over_genai_prices() -> None:
    prices = Prices(overrides={"gpt-4o-mini": {"input": 0, "output": 0}})
    assert prices.cost(Usage(1000, 1000), "gpt-4o-mini") == 0


def test_an_unknown_model_has_no_price() -> None:
    prices = Prices()
    assert prices.rates("no-such-model-anywhere") is None
    assert prices.cost(Usage(10, 10), "no-such-model-anywhere") is None
    assert prices.cost(Usage(10, 10), None) is None


MODELS = ["gpt-4o-mini", "gpt-4.1", "claude-sonnet-4-5", "gemini-2.5-pro"]


@given(
    model=st.sampled_from(MODELS),
    plain=st.integers(0, 400_000),
    cached=st.integers(0, 400_000),
    written=st.integers(0, 50_000),
    output=st.integers(0, 100_000),
)
def test_a_known_model_costs_what_genai_prices_says(
    model: str, plain: int, cached: int, written: int, output: int
) -> None:
    usage = Usage(
        plain + cached + written,
        output,
        cached_input_tokens=cached,
        cache_write_tokens=written,
    )
    theirs = genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=usage.input_tokens,
            cache_read_tokens=cached,
            cache_write_tokens=written,
            output_tokens=output,
        ),
        model,
    ).total_price
    assert Prices().cost(usage, model) == theirs


@pytest.mark.parametrize(
    ("given_prices", "error", "message"),
    [
        ({"input": -1, "output": 1}, ValueError, "'input' must be finite and >= 0"),
        ({"input": "cheap", "output": 1}, ValueError, "'input' must be a number"),
        ({"input": 1, "output": None}, ValueError, "'output' must be a number"),
        ({"input": True, "output": 1}, ValueError, "'input' must be a number"),
        ({"input": float("nan"), "output": 1}, ValueError, "must be finite and >= 0"),
        ({"input": "inf", "output": 1}, ValueError, "must be finite and >= 0"),
        # A number Decimal holds but cannot compute with: it overflowed at the first call.
        ({"input": "1e99999999999", "output": 1}, ValueError, "at most 1E+15"),
        ({"input": 1}, ValueError, "needs an 'output' price"),
        ({"input": 1, "output": 1, "cached": 1}, ValueError, "unknown prices ['cached']"),
        ([1, 2], TypeError, "must be a mapping"),
    ],
)
def test_bad_prices_are_refused_when_built(
    given_prices: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match="Prices: ") as caught:
        Prices(overrides={"m": given_prices})  # type: ignore[dict-item]
    assert message in str(caught.value)


def test_overrides_must_be_a_mapping_of_names() -> None:
    with pytest.raises(TypeError, match="overrides must be a mapping"):
        Prices(overrides=[("m", {})])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a model name must be a non-empty str"):
        Prices(overrides={"": {"input": 1, "output": 1}})


def test_a_budget_or_a_limit_past_what_money_counts_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="Budget: usd must be at most 1E"):
        Budget("1e99999999999", "day")
    with pytest.raises(ValueError, match="UsageLimits: max_cost must be at most 1E"):
        UsageLimits(max_cost="1e16")
