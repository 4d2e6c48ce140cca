"""ContextProvider, and the layer that wraps one provider (or one parallel group) around the rest.

A provider layer runs its provider's pre stage, merges the result into the
invocation it passes inward, and runs the post stage on the way out. Post
stages of a cancelled run run shielded and bounded; post-stage failures never
change what the layers outside see: on an error they become notes on it, on
success they travel outward with the response (:class:`PostStageFailures`)
until :func:`raise_post_failures` — the layer just inside each middleware, and
the outermost one — raises them.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, overload, runtime_checkable

import anyio
import structlog

from raf.context import AgentLike, ContextResult, Invocation, merge
from raf.errors import ContextResultError, ProviderError, StreamClosedError
from raf.messages import AgentResponse, ChatMessage
from raf.options import AgentRunOptions
from raf.parallel import ProviderGroup, provider_name
from raf.sessions.base import Session

__all__ = ["ContextProvider", "ContextProviderLike"]

CompleteInvocation = Callable[[Invocation], Awaitable[AgentResponse]]
PostStage = Callable[..., Awaitable[None]]

_log = structlog.get_logger("raf")
_EMPTY = ContextResult()


class _ClassName:
    """``name`` defaults to the class name; a non-data descriptor, so a class
    attribute, a property or an instance attribute of a subclass all win."""

    @overload
    def __get__(self, instance: None, owner: type) -> str: ...
    @overload
    def __get__(self, instance: object, owner: type) -> str: ...
    def __get__(self, instance: object | None, owner: type) -> str:
        return owner.__name__


class ContextProvider:
    """Base class of context providers; both stages default to doing nothing.

    Override ``on_invoking`` to add instructions, messages or tools before the
    model is called, and ``on_invoked`` to act after it: it runs once for
    every ``on_invoking`` that returned, with the response on success or the
    error that ended the run. Subclasses need not call ``super().__init__()``.

    >>> class Clock(ContextProvider):
    ...     kind = "clock"
    ...     async def on_invoking(self, agent, session, messages, options):
    ...         return ContextResult(instructions="It is noon.")
    >>> Clock().name
    'Clock'
    """

    name: str = _ClassName()  # type: ignore[assignment]
    kind: str = "unknown"

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """Before the model call: return what to add to the context."""
        return _EMPTY

    async def on_invoked(
        self,
        agent: AgentLike | None,
        session: Session,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        """After the model call, always: ``response`` on success, else ``error``."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} kind={self.kind!r}>"


@runtime_checkable
class ContextProviderLike(Protocol):
    """What the run stack accepts as a provider: anything with ``on_invoking``.

    ``on_invoked``, ``name`` and ``kind`` are optional; a missing
    ``on_invoked`` means the provider has no post stage.
    """

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult: ...


def is_provider(item: object) -> bool:
    """A stack item with ``on_invoking`` (or a :func:`raf.parallel` group) is a provider."""
    return isinstance(item, ProviderGroup) or callable(getattr(item, "on_invoking", None))


def check_provider(provider: object, where: str) -> None:
    """Refuse, when the stack is built, the mistakes that would only show mid-run."""
    if isinstance(provider, type):
        raise TypeError(
            f"{where} is the class {provider.__name__}, not a provider: "
            f"put an instance in the stack, {provider.__name__}(...)"
        )
    for stage in ("on_invoking", "on_invoked"):
        method = getattr(provider, stage, None)
        # Only plain functions can be told apart for sure; other callables may return awaitables.
        if (inspect.isfunction(method) or inspect.ismethod(method)) and not (
            inspect.iscoroutinefunction(method)
        ):
            raise TypeError(
                f"{where} ({provider_name(provider)}): {stage} must be a coroutine "
                f"function: write 'async def {stage}(...)'"
            )


def post_stage_of(provider: object) -> PostStage | None:
    """The provider's ``on_invoked``, or ``None`` when it has none or inherits the no-op."""
    on_invoked = getattr(provider, "on_invoked", None)
    # A method bound from the base class does nothing: skip its frames. A function set on
    # the instance (or any other callable) has no such __func__ and is kept.
    if on_invoked is None or getattr(on_invoked, "__func__", None) is ContextProvider.on_invoked:
        return None
    return on_invoked  # type: ignore[no-any-return]


class PostStageFailures(Exception):
    """A run that succeeded, on its way out, with the post stages that failed so far.

    Raised by a provider layer whose post stage failed on success; the
    provider layers outside it treat it as the success it carries (their
    post stages get ``response``) and add their own failures, innermost
    first. :func:`raise_post_failures` turns it into the public error.
    """

    def __init__(self, response: AgentResponse, failures: list[ProviderError]) -> None:
        super().__init__(response, failures)
        self.response = response
        self.failures = failures


def provider_layer(
    provider: Any, call_next: CompleteInvocation, *, post_timeout: float
) -> CompleteInvocation:
    """One provider around ``call_next``: its pre stage, the rest of the run, its post stage."""
    on_invoking = provider.on_invoking
    on_invoked = post_stage_of(provider)
    name = provider_name(provider)

    async def layer(invocation: Invocation) -> AgentResponse:
        try:
            result = await on_invoking(
                invocation.agent,
                invocation.session,
                invocation.request_messages,
                invocation.options,
            )
        except Exception as exc:
            raise _stage_error(provider, "on_invoking", exc) from exc
        try:
            inner = merge(invocation, result, source=name)
        except ContextResultError as exc:
            raise ProviderError(name, "on_invoking", str(exc), field=exc.field) from exc
        if on_invoked is None:
            return await call_next(inner)
        try:
            response = await call_next(inner)
        except PostStageFailures as carried:
            await _after_success(provider, on_invoked, invocation, carried, post_timeout)
            raise
        except BaseException as error:
            await _after_error(provider, on_invoked, invocation, error, post_timeout)
            raise
        outcome = await _after_success(provider, on_invoked, invocation, response, post_timeout)
        if isinstance(outcome, PostStageFailures):
            raise outcome
        return outcome

    return layer


def group_layer(
    group: ProviderGroup, call_next: CompleteInvocation, *, post_timeout: float
) -> CompleteInvocation:
    """A parallel group as one layer: concurrent pre stages, then post stages last-first."""
    members = tuple((member, post_stage_of(member)) for member in group.members)

    async def layer(invocation: Invocation) -> AgentResponse:
        entered: list[tuple[Any, PostStage]] = []
        try:
            inner = await _group_pre(members, invocation, entered)
            outcome: AgentResponse | PostStageFailures = await call_next(inner)
        except PostStageFailures as carried:
            outcome = carried
        except BaseException as error:
            await _unwind_error(entered, invocation, error, post_timeout)
            raise
        while entered:
            member, on_invoked = entered.pop()
            try:
                outcome = await _after_success(
                    member, on_invoked, invocation, outcome, post_timeout
                )
            except BaseException as arrived:  # a cancellation now: what the rest see
                await _unwind_error(entered, invocation, arrived, post_timeout)
                raise
        if isinstance(outcome, PostStageFailures):
            raise outcome
        return outcome

    return layer


async def _unwind_error(
    entered: list[tuple[Any, PostStage]],
    invocation: Invocation,
    error: BaseException,
    post_timeout: float,
) -> None:
    """The post stages of ``entered``, last first, with ``error``.

    A BaseException arriving in one of them (a cancellation) is what the
    remaining ones see, and is raised once they have run, as between
    nested layers.
    """
    arrived: BaseException | None = None
    for member, on_invoked in reversed(entered):
        try:
            await _after_error(member, on_invoked, invocation, arrived or error, post_timeout)
        except BaseException as exc:
            arrived = exc
    if arrived is not None:
        raise arrived


def raise_post_failures(call_next: CompleteInvocation) -> CompleteInvocation:
    """The layer that raises post-stage failures of a successful run, once all post stages ran.

    The innermost failure is raised (a :class:`ProviderError`, the post
    stage's exception as ``__cause__``), the others attached as notes.
    ``compose`` puts one outermost and one just inside every middleware, so
    a middleware sees exactly what its caller would.
    """

    async def layer(invocation: Invocation) -> AgentResponse:
        try:
            return await call_next(invocation)
        except PostStageFailures as carried:
            first, *others = carried.failures
            for other in others:
                first.add_note(f"raf: also, {other} (cause: {other.__cause__!r})")
            raise first from first.__cause__

    return layer


# The stages ------------------------------------------------------------------------------


def _merged(name: str, invocation: Invocation, result: object) -> Invocation:
    try:
        return merge(invocation, result, source=name)  # type: ignore[arg-type]
    except ContextResultError as exc:
        raise ProviderError(name, "on_invoking", str(exc), field=exc.field) from exc


async def _after_success(
    provider: Any,
    on_invoked: PostStage,
    invocation: Invocation,
    outcome: AgentResponse | PostStageFailures,
    post_timeout: float,
) -> AgentResponse | PostStageFailures:
    """The post stage of a run that succeeded; returns the outcome, with its failure if any.

    The caller raises what comes back when it is a ``PostStageFailures``
    (a failure is added to one already carried). A BaseException from
    the post stage (a cancellation arriving now) propagates, carrying the
    failures so far as notes.
    """
    carried = outcome if isinstance(outcome, PostStageFailures) else None
    response = carried.response if carried is not None else outcome
    assert isinstance(response, AgentResponse)
    args = (invocation.agent, invocation.session, invocation.request_messages, response, None)
    try:
        if _cancel_pending():
            # The deadline fired as the model returned: the post stage still runs, shielded.
            failure = await _bounded(provider, on_invoked, args, post_timeout)
        else:
            failure = None
            try:
                await on_invoked(*args)
            except Exception as exc:
                failure = _post_failure(provider, exc, None)
    except BaseException as arrived:
        if carried is not None:
            _add_notes(arrived, carried.failures)
        raise
    if failure is None:
        return outcome
    if carried is not None:
        carried.failures.append(failure)
        return carried
    return PostStageFailures(response, [failure])


async def _after_error(
    provider: Any,
    on_invoked: PostStage,
    invocation: Invocation,
    error: BaseException,
    post_timeout: float,
) -> None:
    """The post stage of a run that failed; its own failure becomes a note on ``error``."""
    args = (invocation.agent, invocation.session, invocation.request_messages, None, error)
    if isinstance(error, StreamClosedError) or _being_cancelled(error):
        # The consumer left (an early close) or the run is cancelled: bounded, so a hung
        # post stage cannot keep the caller (a web request whose client went away) open.
        failure = await _bounded(provider, on_invoked, args, post_timeout, error)
    else:
        # Not cancelled: no cancel scope, the caller's own deadlines apply.
        failure = None
        try:
            await on_invoked(*args)
        except Exception as exc:
            failure = _post_failure(provider, exc, error)
    if failure is not None:
        _add_notes(error, (failure,))
        if type(error) is StreamClosedError:
            # An early close is raised to the consumer as a successful run would be.
            error.post_failures.append(failure)


async def _bounded(
    provider: Any,
    on_invoked: PostStage,
    args: tuple[Any, ...],
    post_timeout: float,
    error: BaseException | None = None,
) -> ProviderError | None:
    """A post stage shielded from the cancellation and bounded by ``post_timeout``."""
    finished = False
    with anyio.CancelScope(shield=True), anyio.move_on_after(post_timeout) as scope:
        try:
            await on_invoked(*args)
            finished = True
        except Exception as exc:
            return _post_failure(provider, exc, error)
    if finished or not scope.cancelled_caught:
        return None
    overrun = TimeoutError(f"post_timeout={post_timeout}s")
    failure = ProviderError(
        provider_name(provider),
        "on_invoked",
        f"did not finish within post_timeout={post_timeout}s "
        + (
            "on the early close of the stream"
            if isinstance(error, StreamClosedError)
            else "while the run was being cancelled"
        ),
    )
    failure.__cause__ = overrun
    _log_failure(failure, overrun, error)
    return failure


def _cancel_pending() -> bool:
    """True when the current task is inside a cancelled (unshielded) cancel scope."""
    try:
        return anyio.current_effective_deadline() == -math.inf
    except Exception:  # no async library is running: nothing can be cancelling us
        return False


def _being_cancelled(error: BaseException) -> bool:
    """Whether the run is being cancelled: the backend's exception, or a cancelled scope.

    The scope's state also covers a cancellation wrapped in an exception
    group, or one that a layer translated into another exception.
    """
    if isinstance(error, Exception) and not isinstance(error, BaseExceptionGroup):
        return _cancel_pending()
    try:
        if isinstance(error, anyio.get_cancelled_exc_class()):
            return True
    except Exception:  # no async library is running
        return False
    return _cancel_pending()


async def _group_pre(
    members: tuple[tuple[Any, PostStage | None], ...],
    invocation: Invocation,
    entered: list[tuple[Any, PostStage]],
) -> Invocation:
    """The members' pre stages in one task group; the merged invocation, in declaration order.

    The first member that fails cancels the others and its ProviderError is
    raised (a BaseException that is not an Exception is raised unchanged,
    never in an exception group). Every member whose pre stage returned a
    valid result is put in ``entered`` all the same, so it gets its post
    stage with the error.
    """
    args = (
        invocation.agent,
        invocation.session,
        invocation.request_messages,
        invocation.options,
    )
    outcomes: list[Any] = [_NOT_RETURNED] * len(members)
    failures: list[ProviderError] = []
    fatal: list[BaseException] = []  # a BaseException that is neither an Exception nor a cancel

    async def run(index: int, provider: Any, scope: anyio.CancelScope) -> None:
        try:
            outcomes[index] = await provider.on_invoking(*args)
        except Exception as exc:
            failure = _stage_error(provider, "on_invoking", exc)
            failure.__cause__ = exc
            failures.append(failure)
            scope.cancel()
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            fatal.append(exc)  # kept out of the task group, which would wrap it in a group
            scope.cancel()

    def settle() -> Invocation:
        # Whatever ended the group, every member that returned is merged or failed here.
        merged = invocation
        for (provider, on_invoked), outcome in zip(members, outcomes, strict=True):
            if outcome is _NOT_RETURNED:
                continue
            try:
                merged = _merged(provider_name(provider), merged, outcome)
            except ProviderError as failure:
                failures.append(failure)
                continue
            if on_invoked is not None:
                entered.append((provider, on_invoked))
        return merged

    try:
        async with anyio.create_task_group() as group:
            for index, (provider, _) in enumerate(members):
                group.start_soon(run, index, provider, group.cancel_scope)
    except BaseException as error:  # cancelled from outside: what failed meanwhile is not lost
        settle()
        if fatal:
            raise fatal[0]  # noqa: B904  (a BaseException beats the cancellation, unchanged)
        _add_notes(error, failures, "in the cancelled group")
        raise
    merged = settle()
    if fatal:
        raise fatal[0]
    if failures:
        first, *others = failures
        for other in others:
            first.add_note(f"raf: in the same group, {other} (cause: {other.__cause__!r})")
        raise first from first.__cause__
    return merged


_NOT_RETURNED: Any = object()


# Failures ---------------------------------------------------------------------------------


def _stage_error(provider: Any, stage: Any, exc: BaseException) -> ProviderError:
    return ProviderError(provider_name(provider), stage, f"{type(exc).__name__}: {exc}")


def _post_failure(provider: Any, exc: BaseException, error: BaseException | None) -> ProviderError:
    failure = _stage_error(provider, "on_invoked", exc)
    failure.__cause__ = exc
    _log_failure(failure, exc, error)
    return failure


def _log_failure(failure: ProviderError, exc: BaseException, error: BaseException | None) -> None:
    # Logged as well as raised or noted: a cancel scope that swallows the cancellation
    # carrying the note would otherwise hide it for good.
    _log.error(
        "provider.post_failed",
        provider=failure.provider,
        stage=failure.stage,
        error=f"{type(exc).__name__}: {exc}",
        run_error=None if error is None else type(error).__name__,
    )


def _add_notes(
    error: BaseException, failures: Sequence[ProviderError], how: str = "while this propagated"
) -> None:
    for failure in failures:
        error.add_note(f"raf: {how}, {failure} (cause: {failure.__cause__!r})")
