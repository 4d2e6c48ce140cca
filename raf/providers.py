"""ContextProvider, and the layer that wraps one around the rest of the run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

import anyio

from raf.context import EMPTY_RESULT, ContextResult, Invocation, merge
from raf.errors import ContextResultError, ProviderError, Stage
from raf.messages import AgentResponse, ChatMessage
from raf.options import AgentRunOptions
from raf.sessions.base import Session

if TYPE_CHECKING:
    from raf.agent import Agent

__all__ = ["ContextProvider", "ContextProviderLike", "provider_name"]

CompleteInvocation = Callable[[Invocation], Awaitable[AgentResponse]]


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
        agent: Agent | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """Before the model call: return what to add to the context."""
        return EMPTY_RESULT

    async def on_invoked(
        self,
        agent: Agent | None,
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
        agent: Agent | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult: ...


def provider_name(provider: object) -> str:
    """The provider's ``name`` attribute, or its class name."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


# Post-stage failures of the current run, innermost first. A contextvar,
# not a field of the invocation, because the failures must reach the
# outermost frame while every layer in between sees the unchanged outcome.
_post_failures: ContextVar[list[ProviderError] | None] = ContextVar(
    "raf_post_failures", default=None
)


def provider_layer(
    provider: Any, call_next: CompleteInvocation, *, post_timeout: float
) -> CompleteInvocation:
    """Wrap ``provider`` around ``call_next``: pre stage in, post stage out.

    The post stage runs for every pre stage that returned, whatever
    happened further in. It runs directly on the normal path; when the run
    is being cancelled it runs shielded and bounded by ``post_timeout``.
    """
    on_invoking = provider.on_invoking
    on_invoked = getattr(provider, "on_invoked", None)
    if getattr(type(provider), "on_invoked", None) is ContextProvider.on_invoked:
        on_invoked = None  # the inherited no-op: skip the post stage's frames entirely

    async def layer(invocation: Invocation) -> AgentResponse:
        try:
            result = await on_invoking(
                invocation.agent,
                invocation.session,
                invocation.request_messages,
                invocation.options,
            )
        except Exception as exc:
            raise _provider_error(provider, "on_invoking", exc) from exc
        try:
            inner = merge(invocation, result)
        except ContextResultError as exc:
            raise ProviderError(
                provider_name(provider), "on_invoking", str(exc), field=exc.field
            ) from exc
        if on_invoked is None:
            return await call_next(inner)
        try:
            response = await call_next(inner)
        except BaseException as error:
            await _post_stage(provider, on_invoked, invocation, None, error, post_timeout)
            raise
        try:
            await on_invoked(
                invocation.agent,
                invocation.session,
                invocation.request_messages,
                response,
                None,
            )
        except Exception as exc:
            _record(_provider_error(provider, "on_invoked", exc), exc)
        return response

    return layer


async def _post_stage(
    provider: Any,
    on_invoked: Callable[..., Awaitable[None]],
    invocation: Invocation,
    response: None,
    error: BaseException,
    post_timeout: float,
) -> None:
    """The post stage of a run that failed: shielded and bounded if it is being cancelled."""
    args = (invocation.agent, invocation.session, invocation.request_messages, response, error)
    if isinstance(error, Exception) or not _is_cancellation(error):
        # Not cancelled: no cancel scope, the caller's own deadlines apply.
        try:
            await on_invoked(*args)
        except Exception as exc:
            _record(_provider_error(provider, "on_invoked", exc), exc)
        return
    with anyio.CancelScope(shield=True):
        try:
            with anyio.fail_after(post_timeout):
                await on_invoked(*args)
        except TimeoutError as exc:
            _record(
                ProviderError(
                    provider_name(provider),
                    "on_invoked",
                    f"did not finish within post_timeout={post_timeout}s while the run "
                    "was being cancelled",
                ),
                exc,
            )
        except Exception as exc:
            _record(_provider_error(provider, "on_invoked", exc), exc)


def _is_cancellation(error: BaseException) -> bool:
    try:
        return isinstance(error, anyio.get_cancelled_exc_class())
    except Exception:  # no async library is running: nothing can be cancelling us
        return False


def _provider_error(provider: Any, stage: Stage, exc: BaseException) -> ProviderError:
    return ProviderError(provider_name(provider), stage, f"{type(exc).__name__}: {exc}")


def _record(error: ProviderError, cause: BaseException) -> None:
    error.__cause__ = cause
    failures = _post_failures.get()
    if failures is None:  # pragma: no cover - layers only run inside collect_post_failures
        raise error
    failures.append(error)


def collect_post_failures(complete: CompleteInvocation) -> CompleteInvocation:
    """Run ``complete``, then raise what post stages recorded.

    On success the innermost post-stage failure is raised, the others
    attached to it as notes; on failure the original error propagates with
    every post-stage failure attached as a note.
    """

    async def run(invocation: Invocation) -> AgentResponse:
        failures: list[ProviderError] = []
        token = _post_failures.set(failures)
        try:
            response = await complete(invocation)
        except BaseException as error:
            for failure in failures:
                error.add_note(
                    f"raf: while this propagated, {failure} (cause: {failure.__cause__!r})"
                )
            raise
        finally:
            _post_failures.reset(token)
        if failures:
            first, *others = failures
            for other in others:
                first.add_note(f"raf: also, {other} (cause: {other.__cause__!r})")
            raise first
        return response

    return run
