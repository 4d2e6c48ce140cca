"""ReplayReport: what a replayed conversation sent and billed, call by call, and its tables."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Final

import attrs

from raf._observers.ledger import LedgerEntry, usd
from raf._values.messages import Usage
from raf._values.prices import Prices

__all__ = ["ReplayCall", "ReplayDivergence", "ReplayReport"]

#: What a token a prefix cache serves is billed, against a fresh one: a tenth (cache reads
#: of OpenAI's GPT-5 family and of Anthropic). Billed units are the fresh tokens plus this
#: share of the cached ones, the unit raf's cache benchmarks count in.
CACHED_PRICE: Final = 0.1
#: The regions of a prompt that hold the conversation (not the tools or the system message).
_CONTEXT: Final = frozenset({"history", "tail", "request", "loop"})


@attrs.frozen(slots=True)
class ReplayCall:
    """One model call of a replay, from the ledger's entry of it.

    ``turn`` is the recorded turn it belongs to (from 1). ``input_tokens`` is
    the whole prompt; ``cached_tokens`` the part a prefix cache serves (what
    the session's previous call already sent as its prefix);
    ``billed_units`` the fresh tokens plus a tenth of the cached ones;
    ``context_tokens`` the conversation the call kept in view (its history,
    tail, request and tool-loop turns: the prompt without its tools and
    system message). ``cost`` is the prompt's bill at the model's prices
    (the cached part at the cached price; ``None`` for a model of no known
    price): the answers are the recording's, the same whatever the stack,
    so their output is not in it.
    """

    turn: int
    input_tokens: int
    cached_tokens: int
    context_tokens: int
    broken_by: str | None
    entry: LedgerEntry = attrs.field(repr=False)
    cost: Decimal | None = attrs.field(default=None, kw_only=True)

    @property
    def billed_units(self) -> float:
        """The fresh tokens plus :data:`CACHED_PRICE` of the cached ones."""
        return self.input_tokens - self.cached_tokens + CACHED_PRICE * self.cached_tokens

    @property
    def cached_share(self) -> float:
        """The part of the prompt a prefix cache serves, 0 to 1."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    @classmethod
    def of(cls, turn: int, entry: LedgerEntry, prices: Prices | None = None) -> ReplayCall:
        """The row of the ledger's ``entry``, its prompt priced with ``prices`` (when given)."""
        broken = entry.broken_by
        rates = None if prices is None else prices.rates(entry.model, entry.input_tokens)
        prompt = Usage(entry.input_tokens, 0, cached_input_tokens=entry.shared_prefix_tokens)
        return cls(
            turn,
            entry.input_tokens,
            entry.shared_prefix_tokens,
            sum(part.tokens for part in entry.parts if part.region in _CONTEXT),
            None if broken is None else f"{broken.layer} ({broken.region})",
            entry,
            cost=None if rates is None else rates.cost(prompt),
        )


@attrs.frozen(slots=True)
class ReplayDivergence:
    """Where the replayed stack did not follow the recording: ``turn`` (from 1), the call
    of that turn (from 1; ``None``: the turn as a whole) and what happened."""

    turn: int
    call: int | None
    reason: str

    def __str__(self) -> str:
        where = f"turn {self.turn}" + ("" if self.call is None else f", call {self.call}")
        return f"{where}: {self.reason}"


@attrs.frozen(slots=True)
class ReplayReport:
    """What a stack would have sent and billed over a recorded conversation
    (``await raf.replay(agent, messages)``).

    ``calls``: one :class:`ReplayCall` per model call, in order. ``turns``:
    the recorded turns replayed; ``recorded_calls``: the model calls the
    recording holds (its assistant messages). ``divergences``: where the
    stack asked for more calls than were recorded, or fewer, or for a tool
    result the recording lacks; a replay that diverged still reports what
    it measured. ``counted_by``: how the tokens were counted.
    """

    calls: tuple[ReplayCall, ...]
    turns: int
    recorded_calls: int
    divergences: tuple[ReplayDivergence, ...]
    counted_by: str

    @property
    def input_tokens(self) -> int:
        """Every call's prompt, together."""
        return sum(call.input_tokens for call in self.calls)

    @property
    def cached_tokens(self) -> int:
        """What a prefix cache serves of every call, together."""
        return sum(call.cached_tokens for call in self.calls)

    @property
    def cached_share(self) -> float:
        """The part of all the input a prefix cache serves, 0 to 1."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def billed_units(self) -> float:
        """Every call's billed units, together."""
        return sum(call.billed_units for call in self.calls)

    @property
    def context_tokens(self) -> float:
        """The conversation a call kept in view, on average (tokens)."""
        return sum(c.context_tokens for c in self.calls) / len(self.calls) if self.calls else 0.0

    @property
    def cost(self) -> Decimal | None:
        """The calls' cost together, when every call has one; else ``None``."""
        costs = [call.cost for call in self.calls]
        if not costs or any(cost is None for cost in costs):
            return None
        return sum((cost for cost in costs if cost is not None), Decimal(0))

    @property
    def diverged(self) -> bool:
        """Whether the stack did not follow the recording somewhere."""
        return bool(self.divergences)

    def table(self) -> str:
        """The calls as a table a person reads, the totals under them, and the divergences."""
        return side_by_side([("", self)])


def side_by_side(reports: Sequence[tuple[str, ReplayReport]]) -> str:
    """Reports of one conversation as one table, a group of columns per named report, one
    row per call: the k-th call of a turn in each (a stack that made fewer has a gap)."""
    head = ["turn", "call"]
    for name, _ in reports:
        label = f"{name}: " if name else ""
        head += [f"{label}input", "cached", "billed", "cost", "context", "broken by"]
    rows = [head]
    placed = [_by_place(report) for _, report in reports]
    for turn, number in sorted({place for calls in placed for place in calls}):
        row = [str(turn), str(number)]
        for calls in placed:
            call = calls.get((turn, number))
            if call is None:
                row += ["", "", "", "", "", ""]
                continue
            row += [
                f"{call.input_tokens:,}",
                f"{call.cached_share:.0%}",
                f"{call.billed_units:,.0f}",
                usd(call.cost),
                f"{call.context_tokens:,}",
                call.broken_by or "-",
            ]
        rows.append(row)
    longest = max((len(report.calls) for _, report in reports), default=0)
    total = ["all", str(longest)]
    for _, report in reports:
        broken = sum(call.broken_by is not None for call in report.calls)
        total += [
            f"{report.input_tokens:,}",
            f"{report.cached_share:.0%}",
            f"{report.billed_units:,.0f}",
            usd(report.cost),
            f"{report.context_tokens:,.0f}",
            f"{broken} broken",
        ]
    rows.append(total)
    widths = [max(len(row[column]) for row in rows) for column in range(len(head))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    counted = ", ".join(sorted({report.counted_by for _, report in reports}))
    lines.append(
        f"tokens counted by {counted}; cached: the prefix the previous call sent; billed: fresh "
        f"tokens + {CACHED_PRICE:g} x cached; context: the conversation in view (mean in 'all')"
    )
    for name, report in reports:
        label = f"{name}: " if name else ""
        for divergence in report.divergences:
            lines.append(f"{label}diverged at {divergence}")
    return "\n".join(lines)


def _by_place(report: ReplayReport) -> dict[tuple[int, int], ReplayCall]:
    """The report's calls by their turn and their number within it (from 1)."""
    placed: dict[tuple[int, int], ReplayCall] = {}
    counts: dict[int, int] = {}
    for call in report.calls:
        counts[call.turn] = counts.get(call.turn, 0) + 1
        placed[(call.turn, counts[call.turn])] = call
    return placed
