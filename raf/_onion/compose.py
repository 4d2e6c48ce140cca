"""ContextProvider, and the layer that wraps one provider around the rest.

A provider layer runs its provider's pre stage, merges the result into the
invocation it passes inward, and runs the post stage on the way out (a
:func:`raf.parallel` group's layer, in :mod:`raf._onion.parallel`, runs its
members' stages through the same functions). Post
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
import attrs

from raf._errors import ContextResultError, ProviderError, StreamClosedError
from raf._log import log as _log
from raf._onion.observe import ProviderStage, StageHook, stage_hook
from raf._sessions.base import Session
from raf._values.context import AgentLike, ContextResult, Invocation, merge
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.options import AgentRunOptions

__all__ = ["ContextProvider", "ContextProviderLike"]

CompleteInvocation = Callable[[Invocation], Awaitable[AgentResponse]]
PreStage = Callable[..., Awaitable[Any]]
PostStage = Callable[..., Awaitable[None]]

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


def provider_name(provider: object) -> str:
    """The provider's ``name`` attribute, or its class name."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


def validate_stages(provider: object, where: str) -> None:
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


def stages_of(provider: Any, observers: Sequence[Any]) -> tuple[PreStage, PostStage | None]:
    """The provider's pre and post stage (``None``: it has none), each inside the observers'
    ``provider_stage`` hooks (see :class:`raf.Observer`).

    A post stage inherited from :class:`ContextProvider` does nothing and is
    skipped, unless an observer asks to see it (``inherited_post_stages``).
    """
    on_invoking = provider.on_invoking
    on_invoked = post_stage_of(provider)
    observe = stage_hook(observers) if observers else None
    if observe is None:
        return on_invoking, on_invoked
    name, kind = provider_name(provider), str(getattr(provider, "kind", "unknown"))
    pre = ProviderStage(provider, name, kind, "on_invoking")

    # Plain functions that return the hook's coroutine: no frame of their own per stage.
    def observed_pre(*args: Any) -> Awaitable[Any]:
        return observe(pre, lambda: on_invoking(*args))

    post: PostStage | None = on_invoked
    observe_post: StageHook | None = observe
    if on_invoked is None:
        post = getattr(provider, "on_invoked", None)
        observe_post = stage_hook(observers, inherited=True)
    if post is None or observe_post is None:
        return observed_pre, None

    succeeded = ProviderStage(provider, name, kind, "on_invoked")

    def observed_post(*args: Any) -> Awaitable[None]:
        error = args[4]  # agent, session, request_messages, response, error
        stage = succeeded if error is None else attrs.evolve(succeeded, error=error)
        return observe_post(stage, lambda: post(*args))

    return observed_pre, observed_post


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
    provider: Any,
    call_next: CompleteInvocation,
    *,
    post_timeout: float,
    observers: Sequence[Any] = (),
) -> CompleteInvocation:
    """One provider around ``call_next``: its pre stage, the rest of the run, its post stage."""
    on_invoking, on_invoked = stages_of(provider, observers)
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
        inner = _merged(name, invocation, result)
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
        if _cancel_pending():
            # The deadline fired as the model returned: the post stage still runs, shielded.
            outcome = await _after_success(provider, on_invoked, invocation, response, post_timeout)
            if isinstance(outcome, PostStageFailures):
                raise outcome
            return outcome
        # The common case, in line (a provider layer's budget is 3 bare coroutine layers).
        try:
            await on_invoked(
                invocation.agent, invocation.session, invocation.request_messages, response, None
            )
        except Exception as exc:
            failure = _post_failure(provider, exc, None)
        else:
            return response
        raise PostStageFailures(response, [failure])

    return layer


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
    """``merge``, a malformed result becoming the provider's ProviderError."""
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
