"""The errors of provider stages: refused when a stack is built; made, logged and
attached when a stage fails at run time; the post-stage failure policy
(:func:`post_failed` where a post stage fails, :func:`settle` once all have run)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from raf._log import log as _log
from raf._values.context import Invocation, merge
from raf._values.run import Run
from raf.errors import ContextResultError, ProviderError


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


def check_middleware(item: object, where: str) -> None:
    """Refuse a stack item that is neither a provider nor a middleware callable."""
    if isinstance(item, type) or not callable(item):
        raise TypeError(
            f"{where} is neither a context provider (no on_invoking) nor a middleware "
            f"callable: {item!r}"
            + (" (a class: put an instance in the stack)" if isinstance(item, type) else "")
        )


def merged(name: str, invocation: Invocation, result: object) -> Invocation:
    """``merge``, a malformed result becoming the provider's ProviderError."""
    try:
        return merge(invocation, result, source=name)  # type: ignore[arg-type]
    except ContextResultError as exc:
        raise ProviderError(name, "on_invoking", str(exc), field=exc.field) from exc


def stage_error(provider: Any, stage: Any, exc: BaseException) -> ProviderError:
    """The :class:`ProviderError` of ``provider``'s ``stage`` that raised ``exc``."""
    return ProviderError(provider_name(provider), stage, f"{type(exc).__name__}: {exc}")


def post_failure(
    provider: Any, exc: BaseException, error: BaseException | None, detail: str
) -> ProviderError:
    failure = ProviderError(provider_name(provider), "on_invoked", detail)
    failure.__cause__ = exc
    # Logged as well as raised or noted: a cancel scope that swallows the cancellation
    # carrying the note would otherwise hide it for good.
    _log.error(
        "provider.post_failed",
        provider=failure.provider,
        stage="on_invoked",
        error=f"{type(exc).__name__}: {exc}",
        run_error=None if error is None else type(error).__name__,
    )
    return failure


# The post-stage failure policy: these two functions (the layers and agent.stream call them).


def post_failed(run: Run, failure: ProviderError, error: BaseException | None) -> None:
    """A post stage failed, having seen ``error`` (``None``: the run's response).

    A failed post stage does not change what the layers outside see. On
    another error it is a note on that error, at once (a run middleware that
    handles the error sees it, and it is not raised later). On success, or
    on the run's own early close (whose error its consumer never sees), it
    is kept in ``run.failures`` for :func:`settle`.
    """
    if error is None or error is run.closed:
        run.failures.append(failure)
    else:
        note(error, failure)


def settle(failures: Sequence[ProviderError], error: BaseException | None) -> None:
    """The kept failures of a run, once every post stage has run: notes on the run's
    ``error``, or, without one, raised (the first, the innermost; the others notes on it).

    The outermost provider layer settles ``invocation.run.failures``;
    ``agent.stream`` settles them again with no error after an early close,
    so its block raises them as after a successful run.
    """
    if error is not None:
        for failure in failures:
            note(error, failure)
    elif failures:
        raise_failures(failures)


def note(error: BaseException, failure: ProviderError, how: str = "while this propagated") -> None:
    """Attach ``failure`` to ``error``, as a note."""
    error.add_note(f"raf: {how}, {failure} (cause: {failure.__cause__!r})")


def raise_failures(failures: Sequence[ProviderError], how: str = "also") -> None:
    """Raise the first of ``failures`` (the innermost), the others attached as notes."""
    first, *others = failures
    for other in others:
        first.add_note(f"raf: {how}, {other} (cause: {other.__cause__!r})")
    raise first from first.__cause__
