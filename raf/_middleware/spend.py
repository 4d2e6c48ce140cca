"""SpendLimits: spending budgets in USD across runs and processes, per minute, hour, day or
month, each a session's, an agent's, an API key's or anyone's a function names."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final, Literal

import anyio
import attrs

from raf._log import log as _log
from raf._middleware.limits import count_input
from raf._sessions.spend import MemorySpendCounts, SpendCounts, spend_counts
from raf._sessions.stores import is_redis_url, open_store
from raf._values.context import ChatRequest, Invocation
from raf._values.messages import AgentResponse
from raf._values.prices import Prices, amount, model_of, nanos
from raf._values.run import KEY_SCOPE
from raf.errors import BudgetExceeded, ConfigError, StreamClosedError

__all__ = ["Budget", "SpendLimits"]

Per = Literal["minute", "hour", "day", "month"]
#: Whose budget a call spends: the run's session, its agent, the served API key, or what a
#: function of the invocation says.
Scope = Literal["session", "agent", "key"] | Callable[[Invocation | None], str]

_PERS: Final = ("minute", "hour", "day", "month")
_SCOPES: Final = ("session", "agent", "key")
#: Where a served route puts the caller's key scope for the run (``Run.state``).
SERVED_KEY: Final = KEY_SCOPE  # one key for every reader of the served key scope
#: How long settling a call may take once its caller is cancelled (it runs shielded).
_SETTLE_TIMEOUT: Final = 10.0
_NANO: Final = Decimal(1_000_000_000)


def _usd(value: object) -> Decimal:
    return amount("Budget: usd", value)


def _check_per(budget: Budget, attribute: Any, value: object) -> None:
    if value not in _PERS:
        raise ValueError(f"Budget: per must be one of {list(_PERS)}, got {value!r}")


def _check_scope(budget: Budget, attribute: Any, value: object) -> None:
    if value not in _SCOPES and (isinstance(value, str) or not callable(value)):
        raise ValueError(
            f"Budget: scope must be one of {list(_SCOPES)} or a function of the invocation "
            f"that returns a str, got {value!r}"
        )


def _check_name(budget: Budget, attribute: Any, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"Budget: name must be a non-empty str or None, got {value!r}")
    if value is None and callable(budget.scope) and _lasting_name(budget.scope) is None:
        raise ValueError(
            f"Budget: the scope {budget.scope!r} has no name that is the same in every process "
            "(a lambda, a functools.partial, an object), and the counts are kept under the "
            'budget\'s name; give it one: Budget(..., name="tenant")'
        )


def _lasting_name(scope: Callable[..., Any]) -> str | None:
    """A function's qualified name (the same in every process), or ``None``: a lambda's is
    every lambda's, and a partial or an object has only a repr with its address in it."""
    name = getattr(scope, "__qualname__", None)
    return name if isinstance(name, str) and "<lambda>" not in name else None


@attrs.frozen(slots=True)
class Budget:
    """At most ``usd`` dollars per ``per`` (``"minute"``, ``"hour"``, ``"day"``, ``"month"``,
    calendar windows in UTC) for each ``scope``.

    ``scope`` is ``"session"`` (each session its own budget), ``"agent"``
    (the agent's name), ``"key"`` (the served API key: each caller its own;
    runs not served, and servers without keys, share one) or a function of
    the :class:`raf.Invocation` that returns whose budget it is (a user id
    from the session, a tenant). The counts are kept under the scope's name
    (a function's qualified name): ``name`` gives one, and a function scope
    without a name that is the same in every process (a lambda, a
    ``functools.partial``, an object) needs it. A negative ``usd``, an
    unknown ``per`` or ``scope`` is a ``ValueError`` here.

    >>> from datetime import UTC, datetime
    >>> Budget("5", "day").window(datetime(2026, 1, 31, 13, 5, tzinfo=UTC))[1]
    datetime.datetime(2026, 2, 1, 0, 0, tzinfo=datetime.timezone.utc)
    """

    usd: Decimal = attrs.field(converter=_usd)
    per: Per = attrs.field(validator=_check_per)
    scope: Scope = attrs.field(default="session", validator=_check_scope)
    #: The name the counts are kept under (default: the scope's own).
    name: str | None = attrs.field(default=None, kw_only=True, validator=_check_name)

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        """The window ``now`` falls in: its start and its end (UTC)."""
        now = now.astimezone(UTC)
        if self.per == "minute":
            start = now.replace(second=0, microsecond=0)
            return start, start + timedelta(minutes=1)
        if self.per == "hour":
            start = now.replace(minute=0, second=0, microsecond=0)
            return start, start + timedelta(hours=1)
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.per == "day":
            return start, start + timedelta(days=1)
        start = start.replace(day=1)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else None
        return start, end or start.replace(month=start.month + 1)

    def whose(self, request: ChatRequest) -> str:
        """Whose budget ``request`` spends (``""``: no one's in particular)."""
        invocation = request.invocation
        if self.scope == "session":
            session = getattr(invocation, "session", None)
            return request.options.session_id or getattr(session, "id", None) or ""
        if self.scope == "agent":
            agent = getattr(invocation, "agent", None)
            return request.options.agent_name or getattr(agent, "name", None) or ""
        if self.scope == "key":
            return "" if invocation is None else str(invocation.run.state.get(SERVED_KEY, ""))
        assert callable(self.scope)
        who = self.scope(invocation)
        if not isinstance(who, str):
            raise TypeError(
                f"Budget: the scope function {self.scope!r} returned {who!r}, not a str"
            )
        return who

    def label(self) -> str:
        """The scope's name in the counts' keys: ``name``, else the scope's own."""
        if self.name is not None:
            return self.name
        if isinstance(self.scope, str):
            return self.scope
        return _lasting_name(self.scope) or repr(self.scope)  # the validator made it named


class SpendLimits:
    """Chat middleware: spending budgets across runs and processes; a call a budget has no
    room for is not sent.

    ``Agent(client, chat_stack=[SpendLimits([Budget(5, "day", "key")], store=url)])``.
    Before each model call, what it may cost is *held* in every budget it
    spends: its input (counted with the agent's client's ``count_tokens``, or
    roughly) at the uncached input price, plus its ``max_tokens`` of output
    when the call sets one. When a budget's window has no room for the hold
    (what it has spent and holds for calls in flight, plus this), the call is
    refused with :class:`raf.errors.BudgetExceeded` (``.budget``, ``.spent``,
    ``.resets_at``), no budget holds anything for it, and the run ends with
    every post stage run. Once the call has answered, the hold becomes its
    real cost (priced with ``prices`` for the model that answered: a
    fallback's call at its own model's price); a call that failed gives its
    hold back. A call cancelled in flight (a streamed reader who hangs up, a
    timeout) keeps its hold as its cost: it was sent, and the vendor bills it.
    A store that fails to settle an answered call does not cost its answer:
    the hold stays as its cost and the error is logged (``spend.settle_failed``).

    ``store`` is where the budgets are counted: ``None``, this process's
    memory (this object's); a session store's URL or file path
    (``postgresql://...``, a SQLite file: opened on first use, closed by
    :meth:`aclose`, which ``await agent.aclose()`` calls; ``redis://...``:
    opened with ``async with limits:`` or :meth:`open` before the first
    call, in the task that closes it, as a Redis client needs); or an open
    :class:`raf.SqliteSessionStore`, ``RedisSessionStore`` or
    ``PostgresSessionStore`` (its owner closes it). Every store counts
    atomically: of two processes that reserve a budget's last cent, one is
    refused. A model of no known price is a :class:`raf.errors.ConfigError`
    at its first call (give it with :class:`raf.Prices`).

    Served (``raf serve``), a call refused by a budget is a 429 with
    ``Retry-After`` (the seconds until the window ends), and the model is
    not called.

    >>> from raf import Agent, EchoChatClient
    >>> agent = Agent(EchoChatClient(), chat_stack=[SpendLimits([Budget("0.50", "hour")])])
    """

    __slots__ = ("_counts", "_opened", "_opening", "budgets", "prices", "store")

    def __init__(
        self,
        budgets: Budget | Sequence[Budget],
        *,
        store: str | os.PathLike[str] | object | None = None,
        prices: Prices | None = None,
    ) -> None:
        given = (budgets,) if isinstance(budgets, Budget) else tuple(budgets)
        if not given or not all(isinstance(budget, Budget) for budget in given):
            raise TypeError(f"SpendLimits: budgets must be one or more raf.Budget, got {budgets!r}")
        seen: dict[tuple[str, str], Budget] = {}
        for budget in given:
            both = seen.setdefault((budget.per, budget.label()), budget)
            if both is not budget:
                raise ValueError(
                    f"SpendLimits: {both!r} and {budget!r} count the same spending (one scope, "
                    "one period): keep one"
                )
        if prices is not None and not isinstance(prices, Prices):
            raise TypeError(f"SpendLimits: prices must be a raf.Prices, got {prices!r}")
        self.budgets: tuple[Budget, ...] = given
        self.prices = Prices() if prices is None else prices
        self.store = store
        self._opened: Any = None  # a store this object opened from a URL, to close
        self._opening = anyio.Lock() if isinstance(store, str | os.PathLike) else None
        if store is None:
            self._counts: SpendCounts | None = MemorySpendCounts()
        elif isinstance(store, str | os.PathLike):
            self._counts = None  # opened on first use, in the event loop that uses it
        else:
            self._counts = spend_counts(store)

    async def __call__(
        self, request: Any, call_next: Callable[[Any], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Hold the call's least cost in every budget, send it, then settle its real cost."""
        if not isinstance(request, ChatRequest):
            raise TypeError(
                "SpendLimits belongs in Agent(chat_stack=[...]): it budgets model calls, and "
                f"got a {type(request).__name__}"
            )
        counts = self._counts
        if counts is None:
            if isinstance(self.store, str) and is_redis_url(self.store):
                # A Redis client lives in the task that opened it: not in some run's task.
                raise ConfigError(
                    "SpendLimits: open the Redis store before the first call, in the task "
                    "that closes it: `async with limits:` (or await limits.open() and "
                    "limits.aclose()), or give an open raf.RedisSessionStore"
                )
            counts = await self.open()
        now = datetime.now(UTC)
        windows = [budget.window(now) for budget in self.budgets]
        whose = [budget.whose(request) for budget in self.budgets]
        keys = [
            f"{budget.per}:{budget.label()}:{who}:{int(start.timestamp())}"
            for budget, who, (start, _) in zip(self.budgets, whose, windows, strict=True)
        ]
        ends = [end.timestamp() for _, end in windows]
        limits = [nanos(budget.usd) for budget in self.budgets]
        hold = self._hold(request)
        held = await counts.reserve(keys, limits, hold, ends)
        if held is not None:
            index = next(i for i, h in enumerate(held) if h + hold > limits[i])
            raise BudgetExceeded(
                self.budgets[index],
                Decimal(held[index]) / _NANO,
                windows[index][1],
                scope=whose[index],
            )
        try:
            response = await call_next(request)
        except (anyio.get_cancelled_exc_class(), StreamClosedError):
            # Cancelled in flight (a reader hung up, a timeout): the call was sent and the
            # vendor bills it, so its hold stands; given back, a caller who hangs up every
            # call would spend past every budget.
            raise
        except BaseException as exc:
            try:
                await _settle(counts, keys, -hold, ends)
            except Exception as failed:  # the call's own error is the one to raise
                exc.add_note(f"raf: SpendLimits could not give the call's hold back: {failed}")
            raise
        usage = response.usage
        cost = None if usage is None else self.prices.cost(usage, model_of(request, response))
        if cost is not None and nanos(cost) != hold:  # unpriced: the hold stands for it
            try:
                await _settle(counts, keys, nanos(cost) - hold, ends)
            except Exception as exc:
                # The call was answered and is billed: its answer is the caller's. Its hold
                # stays counted as its cost, and the log says what was not.
                _log.error(
                    "spend.settle_failed",
                    budgets=list(keys),
                    held=str(Decimal(hold) / _NANO),
                    cost=str(cost),
                    error=f"{type(exc).__name__}: {exc}",
                )
        return response

    def _hold(self, request: ChatRequest) -> int:
        """What the call costs at least, in nano-dollars: its input at the uncached price and
        the output it may write (``max_tokens``)."""
        counted = count_input(request)
        model = model_of(request, None)
        rates = self.prices.rates(model, counted)
        if rates is None:
            raise ConfigError(
                f"SpendLimits: the budgets need the price of model {model!r}; give it with "
                'raf.Prices(overrides={model: {"input": ..., "output": ...}})'
            )
        most = request.options.max_tokens or 0
        return nanos((counted * rates.input + most * rates.output) / 1_000_000)

    async def open(self) -> SpendCounts:
        """Open the store now (a URL's: else on the first call), and return its counts."""
        if self._counts is not None:
            return self._counts
        assert self._opening is not None
        async with self._opening:
            if self._counts is None:
                location = self.store
                assert isinstance(location, str | os.PathLike)
                self._opened = await open_store(location)
                self._counts = spend_counts(self._opened)
        return self._counts

    async def aclose(self) -> None:
        """Close the store this object opened from a URL (a store given as an object is
        its owner's to close)."""
        opened, self._opened = self._opened, None
        if opened is not None:
            self._counts = None
            await opened.aclose()

    async def __aenter__(self) -> SpendLimits:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"SpendLimits({list(self.budgets)!r})"


async def _settle(
    counts: SpendCounts, keys: Sequence[str], delta: int, ends: Sequence[float]
) -> None:
    """Settle a call: shielded (a run cancelled once its call answered still settles it),
    boundedly."""
    if delta:
        with anyio.move_on_after(_SETTLE_TIMEOUT, shield=True):
            await counts.settle(keys, delta, ends)
