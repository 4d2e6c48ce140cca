"""ContextProvider, and the layer that wraps one around the rest of the run."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol, overload, runtime_checkable

import anyio

from raf.context import (
    EMPTY_RESULT,
    CheckedResult,
    ContextResult,
    Invocation,
    checked_result,
    merge_all,
)
from raf.errors import ContextResultError, ProviderError, Stage
from raf.messages import AgentResponse, ChatMessage
from raf.options import AgentRunOptions
from raf.parallel import ProviderGroup
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


#: One provider as the layer runs it: the provider, its ``on_invoking``, and
#: its ``on_invoked`` (``None`` when it has none or inherits the no-op).
_Member = tuple[Any, Callable[..., Awaitable[Any]], Callable[..., Awaitable[None]] | None]

#: A step of a layer: one provider (``group`` is ``None``) or a parallel group.
_Step = tuple[ProviderGroup | None, tuple[_Member, ...]]

#: A provider whose pre stage returned, with the post stage it is owed.
_Entered = tuple[Any, Callable[..., Awaitable[None]]]


def _member(provider: Any) -> _Member:
    on_invoked = getattr(provider, "on_invoked", None)
    if getattr(type(provider), "on_invoked", None) is ContextProvider.on_invoked:
        on_invoked = None  # the inherited no-op: skip the post stage's frames entirely
    return (provider, provider.on_invoking, on_invoked)


def providers_layer(
    providers: Sequence[Any], call_next: CompleteInvocation, *, post_timeout: float
) -> CompleteInvocation:
    """Wrap consecutive providers (or parallel groups) around ``call_next`` as one layer.

    It behaves exactly like one nested layer per provider: pre stages
    outermost first, then ``call_next``, then a post stage for every pre
    stage that returned, innermost first, whatever happened further in.
    Post stages run directly on the normal path; when the run is being
    cancelled they run shielded and bounded by ``post_timeout``. Pre stages
    only see the run's agent, session, request messages and options, which
    no provider changes, so the layer can build the inner invocation once
    for all of them (:func:`raf.context.merge_all`) instead of once each.
    """
    steps: tuple[_Step, ...] = tuple(
        (item, tuple(_member(m) for m in item.members))
        if isinstance(item, ProviderGroup)
        else (None, (_member(item),))
        for item in providers
    )

    async def layer(invocation: Invocation) -> AgentResponse:
        args = (invocation.agent, invocation.session, invocation.request_messages)
        options = invocation.options
        results: list[CheckedResult] = []
        entered: list[_Entered] = []
        try:
            for group, members in steps:
                if group is not None:
                    await _group_pre(members, (*args, options), results, entered)
                    continue
                member = members[0]
                try:
                    result = await member[1](*args, options)
                except Exception as exc:
                    raise _provider_error(member[0], "on_invoking", exc) from exc
                results.append(_checked(member[0], result))
                if member[2] is not None:
                    entered.append((member[0], member[2]))
            response = await call_next(merge_all(invocation, results) if results else invocation)
        except BaseException as error:
            final = await _unwind(entered, invocation, None, error, post_timeout)
            if final is error or final is None:
                raise
            # A cancellation (or other BaseException) that arrived in a post stage: raised
            # as it is, ``error`` only as its implicit ``__context__``, as between layers.
            raise final  # noqa: B904
        if entered:
            final = await _unwind(entered, invocation, response, None, post_timeout)
            if final is not None:
                raise final
        return response

    return layer


def _checked(provider: Any, result: object) -> CheckedResult:
    try:
        return checked_result(result)
    except ContextResultError as exc:
        raise ProviderError(
            provider_name(provider), "on_invoking", str(exc), field=exc.field
        ) from exc


_NOT_RETURNED: Any = object()


async def _group_pre(
    members: tuple[_Member, ...],
    args: tuple[Any, ...],
    results: list[CheckedResult],
    entered: list[_Entered],
) -> None:
    """A group's pre stages in one task group; results and entered members in declaration order.

    The first member that fails cancels the others and its ProviderError is
    raised (a BaseException that is not an Exception is raised unchanged,
    never in an exception group); every member whose pre stage returned a
    valid result is entered all the same, so the layer gives it its post
    stage with the error.
    """
    outcomes: list[Any] = [_NOT_RETURNED] * len(members)
    failures: list[ProviderError] = []
    fatal: list[BaseException] = []  # a BaseException that is neither an Exception nor a cancel

    async def run(index: int, member: _Member, scope: anyio.CancelScope) -> None:
        try:
            outcomes[index] = await member[1](*args)
        except Exception as exc:
            failure = _provider_error(member[0], "on_invoking", exc)
            failure.__cause__ = exc
            failures.append(failure)
            scope.cancel()
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            # Kept out of the task group, which would wrap it in an exception group.
            fatal.append(exc)
            scope.cancel()

    try:
        async with anyio.create_task_group() as group:
            for index, member in enumerate(members):
                group.start_soon(run, index, member, group.cancel_scope)
    except BaseException as error:  # cancelled from outside: what failed meanwhile is not lost
        if fatal:
            raise fatal[0]  # noqa: B904  (a BaseException beats the cancellation, unchanged)
        for failure in failures:
            error.add_note(f"raf: in the cancelled group, {failure} (cause: {failure.__cause__!r})")
        raise
    finally:
        for member, outcome in zip(members, outcomes, strict=True):
            if outcome is _NOT_RETURNED:
                continue
            try:
                results.append(_checked(member[0], outcome))
            except ProviderError as failure:
                failures.append(failure)
                continue
            if member[2] is not None:
                entered.append((member[0], member[2]))
    if fatal:
        raise fatal[0]
    if failures:
        first, *others = failures
        for other in others:
            first.add_note(f"raf: in the same group, {other} (cause: {other.__cause__!r})")
        raise first from first.__cause__


async def _unwind(
    entered: list[_Entered],
    invocation: Invocation,
    response: AgentResponse | None,
    error: BaseException | None,
    post_timeout: float,
) -> BaseException | None:
    """The post stages of ``entered``, innermost first; returns what the layer must raise.

    A post stage that raises an ``Exception`` is recorded and changes
    nothing for the others. One that raises a ``BaseException`` (a
    cancellation arriving now) becomes the error the remaining post stages
    see and the one raised, as it would between nested layers.
    """
    for provider, on_invoked in reversed(entered):
        try:
            if error is None:
                await on_invoked(
                    invocation.agent,
                    invocation.session,
                    invocation.request_messages,
                    response,
                    None,
                )
            else:
                await _post_stage(provider, on_invoked, invocation, None, error, post_timeout)
        except Exception as exc:
            _record(_provider_error(provider, "on_invoked", exc), exc)
        except BaseException as exc:
            error, response = exc, None
    return error


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
