"""RetryMiddleware: call the rest of the stack again when it fails with a retryable error."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from raf._agent.streamed import Onward
from raf._agent.tool_loop import ToolRequest
from raf._log import log as _log
from raf._values.context import ChatRequest
from raf._values.messages import AgentResponse, OnUpdate
from raf.errors import ChatClientError

if TYPE_CHECKING:
    from tenacity import RetryCallState

__all__ = ["RetryMiddleware"]


# A server's ask of at most this (retry-after-ms: 20, Retry-After: 1) means "soon", never
# "give up": it is waited for in full, even past wait_max (even when wait_max is 0).
_SHORT_ASK = 1.0


class RetryMiddleware:
    """Retry the rest of the stack with exponential backoff and jitter (tenacity).

    In ``Agent(chat_stack=[...])`` it retries single model calls: the tool
    calls already made are not repeated. In ``Agent(stack=[...])`` it reruns
    everything inside it, providers included. Set the chat client's own
    retries off (``OpenAIChatClient(..., max_retries=0)``) so the two do not
    multiply.

    ``attempts`` counts calls, the first included. ``retry_on`` is a tuple of
    exception types to retry; ``None`` retries a :class:`raf.ChatClientError`
    whose ``retryable`` is true (rate limits, timeouts, connection and
    server errors). The wait before retry *n* is
    ``wait_initial * 2**(n-1)`` plus up to ``wait_initial`` of random jitter,
    at most ``wait_max`` seconds. When the error says how long the server
    asked us to wait (``ChatClientError.retry_after``, from ``Retry-After``),
    the wait is at least that: a retry never comes earlier than the server
    asked. An ask of at most ``max(wait_max, 1.0)`` seconds is waited for in
    full (a short ask, a second or less, even past ``wait_max``); when the
    server asks for longer, the error is raised at once (event
    ``"retry.gave_up"``) rather than retried early. Each retry
    is logged (``"retry"`` event); when the attempts run out, the last error
    is raised unchanged.
    Cancellation, and any ``BaseException`` that is not an ``Exception``, is
    never retried. In a streamed run, an attempt is retried only while it
    has sent no update onward (the consumer has seen what it sent); after
    its first update, its error goes through (event ``"retry.gave_up"``,
    ``reason="streamed"``).

    >>> from raf import Agent, EchoChatClient
    >>> agent = Agent(EchoChatClient(), chat_stack=[RetryMiddleware(attempts=4)])
    """

    __slots__ = ("_retrying", "attempts", "retry_on", "wait_initial", "wait_max")

    def __init__(
        self,
        *,
        attempts: int = 3,
        retry_on: tuple[type[BaseException], ...] | None = None,
        wait_initial: float = 0.5,
        wait_max: float = 8.0,
    ) -> None:
        if type(attempts) is not int or attempts < 1:
            raise ValueError(f"RetryMiddleware: attempts must be an int >= 1, got {attempts!r}")
        if retry_on is not None and (
            not isinstance(retry_on, tuple)
            or not all(isinstance(t, type) and issubclass(t, BaseException) for t in retry_on)
        ):
            raise TypeError(
                f"RetryMiddleware: retry_on must be a tuple of exception types or None, "
                f"got {retry_on!r}"
            )
        if not (wait_initial >= 0 and wait_max >= 0):
            raise ValueError(
                f"RetryMiddleware: waits must be >= 0, got wait_initial={wait_initial!r}, "
                f"wait_max={wait_max!r}"
            )
        self.attempts = attempts
        self.retry_on = retry_on
        self.wait_initial = wait_initial
        self.wait_max = wait_max
        # Here: `import raf` does not import tenacity.
        from tenacity import AsyncRetrying, retry_if_exception

        self._retrying = AsyncRetrying(
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception(self.should_retry),
            sleep=anyio.sleep,
            before_sleep=self._log_retry,
            reraise=True,
        )

    def should_retry(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt."""
        if not isinstance(error, Exception):
            return False
        if self.retry_on is None:
            return isinstance(error, ChatClientError) and error.retryable
        return isinstance(error, self.retry_on)

    def _wait(self, state: RetryCallState) -> float:
        backoff = _backoff(state.attempt_number, self.wait_initial, self.wait_max)
        asked = _retry_after(state)
        # Never earlier than asked: _stop gave up on an ask that is too long to wait for.
        return backoff if asked is None else max(backoff, asked)

    def _stop(self, state: RetryCallState) -> bool:
        if state.attempt_number >= self.attempts:
            return True
        asked = _retry_after(state)
        if asked is None or asked <= max(self.wait_max, _SHORT_ASK):
            return False
        # Retrying sooner than the server asked would only be refused again.
        error = state.outcome.exception() if state.outcome is not None else None
        _log.warning(
            "retry.gave_up",
            reason="retry_after",
            attempt=state.attempt_number,
            attempts=self.attempts,
            retry_after_s=asked,
            wait_max=self.wait_max,
            error_type=type(error).__name__,
            error=str(error),
        )
        return True

    async def __call__(
        self, request: Any, call_next: Callable[[Any], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Call ``call_next(request)`` until it succeeds or the attempts run out."""
        if self.attempts == 1:
            return await call_next(request)
        send = getattr(request, "on_update", None)
        if send is not None:
            return await self._streamed(request, call_next, send)

        # tenacity awaits only what it sees as a coroutine function (call_next is a lambda).
        async def attempt(request: Any) -> AgentResponse:
            return await call_next(request)

        # A copy per call: tenacity keeps per-run statistics on the object.
        response: AgentResponse = await self._retrying.copy()(attempt, request)
        return response

    async def _streamed(
        self,
        request: Any,
        call_next: Callable[[Any], Awaitable[AgentResponse]],
        send: OnUpdate,
    ) -> AgentResponse:
        """A streamed call: retried only while the failed attempt sent no update onward.

        The consumer has already seen what an attempt sent, so a second
        attempt would repeat or contradict it: once an update went out, the
        error goes through as it is.
        """
        onward = Onward(send)
        wrapped = attrs.evolve(request, on_update=onward)

        async def attempt(request: Any) -> AgentResponse:
            onward.sent = False  # each attempt starts with nothing sent
            return await call_next(request)

        def should_retry(error: BaseException) -> bool:
            if not self.should_retry(error):
                return False
            if onward.sent:
                _log.warning(
                    "retry.gave_up",
                    reason="streamed",
                    error_type=type(error).__name__,
                    error=str(error),
                )
                return False
            return True

        from tenacity import retry_if_exception

        retrying = self._retrying.copy(retry=retry_if_exception(should_retry))
        response: AgentResponse = await retrying(attempt, wrapped)
        return response

    def _log_retry(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        request = state.args[0] if state.args else None
        _log.warning(
            "retry",
            retrying=_what(request),
            attempt=state.attempt_number,
            attempts=self.attempts,
            wait_s=round(state.upcoming_sleep, 3),
            error_type=type(error).__name__,
            error=str(error),
        )

    def __repr__(self) -> str:
        return (
            f"RetryMiddleware(attempts={self.attempts}, retry_on={self.retry_on!r}, "
            f"wait_initial={self.wait_initial}, wait_max={self.wait_max})"
        )


def _backoff(attempt: int, initial: float, most: float) -> float:
    """The wait after failed attempt number ``attempt``: ``initial`` doubled each time,
    plus up to ``initial`` of jitter, never over ``most``.

    Written here, not taken from tenacity: its ``wait_exponential_jitter`` takes
    ``initial`` up to 9.1 and ``multiplier`` from 9.2 (warning on ``initial``), and raf
    runs on both (google-genai pins ``tenacity<9.2``).

    >>> _backoff(1, 0.0, 8.0), _backoff(30, 1.0, 8.0)
    (0.0, 8.0)
    """
    try:
        grown = initial * 2.0 ** (attempt - 1)
    except OverflowError:
        grown = most
    return max(0.0, min(grown + random.uniform(0, initial), most))


def _retry_after(state: RetryCallState) -> float | None:
    """The wait the failed attempt's error asks for, in seconds, if it says."""
    error = state.outcome.exception() if state.outcome is not None else None
    asked = getattr(error, "retry_after", None) if isinstance(error, ChatClientError) else None
    return asked if isinstance(asked, float | int) else None


def _what(request: object) -> str:
    """What a retry re-runs, for its log event: a model call, a tool call or a run."""
    if isinstance(request, ChatRequest):
        return "model"
    return "tool" if isinstance(request, ToolRequest) else "run"
