"""The bill of one model call, split among the layers that made its prompt.

A vendor bills a call's input in three kinds: the prefix it served from its
cache (at the cached price), the part it wrote to its cache (at the write
price), and the rest (at the input price). A prompt's cached part is its
beginning, and what a call writes to the cache follows what it read, so the
ledger walks the parts in prompt order: the first ones are billed as cached,
the next as written, the rest as plain input.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Final

from raf._values.messages import Usage
from raf._values.prices import Rates

__all__: list[str] = []

_MILLION: Final = Decimal(1_000_000)


def split_bill(counted: Sequence[int], usage: Usage, rates: Rates) -> list[Decimal]:
    """Each part's share of the input bill of a call whose parts raf counted as ``counted``.

    The vendor's own ``usage.input_tokens`` is what it billed: raf's counts
    are scaled to it (cumulatively, in whole tokens, so the shares add up to
    the input bill exactly). Then the first ``cached_input_tokens`` are
    priced as cached, the next ``cache_write_tokens`` as written, the rest as
    input.
    """
    total = sum(counted)
    billed = usage.input_tokens
    cached = min(usage.cached_input_tokens, billed)
    written = min(usage.cache_write_tokens, billed - cached)
    shares: list[Decimal] = []
    done = 0  # billed tokens given to the parts so far
    running = 0
    for tokens in counted:
        running += tokens
        end = billed if total == 0 else (running * billed + total // 2) // total
        shares.append(_priced(done, end, cached, cached + written, rates) / _MILLION)
        done = end
    if shares and done < billed:  # no part counted a token, yet the vendor billed some
        shares[0] += _priced(done, billed, cached, cached + written, rates) / _MILLION
    return shares


def _priced(start: int, end: int, cached_end: int, written_end: int, rates: Rates) -> Decimal:
    """Tokens ``start`` to ``end`` of the prompt, priced by the part of it each falls in."""
    cached = max(0, min(end, cached_end) - start)
    written = max(0, min(end, written_end) - max(start, cached_end))
    plain = max(0, end - max(start, written_end))
    return cached * rates.cached_input + written * rates.cache_write + plain * rates.input
