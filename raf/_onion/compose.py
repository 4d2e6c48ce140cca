"""The onion: ContextProvider, the layer that wraps one provider around the rest, and compose.

A provider layer runs its provider's pre stage, merges the result into the
invocation it passes inward, calls the rest, and runs the post stage on the
way out, whatever happened (a :func:`raf.parallel` group's layer, in
:mod:`raf._onion.parallel`, runs its members through the same functions).
The one post-stage failure policy (``design.md``, "Error and cancellation
rules"), written once in :func:`run_post_stages`: a failed post stage does
not change what the layers outside see. On a failed run it becomes a note
on the error; on a successful run it goes into ``Invocation.post_failures``,
the list that :func:`collect_post_failures`, the outermost layer of a stack
with providers, gives each run and raises from once every post stage ran.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar, overload, runtime_checkable

import anyio
import attrs

from raf._errors import ContextResultError, ProviderError, StreamClosedError
from raf._log import log as _log
from raf._onion.observe import PostStage, PreStage, observed_stages
from raf._values.context import AgentLike, ContextResult, Invocation, merge
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.options import AgentRunOptions
from raf._values.protocols import Session

__all__ = ["CallNext", "ContextProvider", "ContextProviderLike", "Middleware", "compose"]

Request = TypeVar("Request")
Request_contra = TypeVar("Request_contra", contravariant=True)

#: The inner rest of a stack: ``await call_next(request)`` runs it.
CallNext = Callable[[Request], Awaitable[AgentResponse]]
CompleteInvocation = Callable[[Invocation], Awaitable[AgentResponse]]
#: The providers whose pre stage returned, with their post stage, in the order entered.
Entered = list[tuple[Any, PostStage]]


class Middleware(Protocol[Request_contra]):
    """``async (request, call_next) -> AgentResponse``.

    In the run stack the request is an :class:`raf.Invocation`; in the chat
    stack it is a :class:`raf.ChatRequest`. Call ``call_next`` once to go on
    inward, more than once to retry, or not at all to answer yourself.
    """

    async def __call__(
        self, request: Request_contra, call_next: CallNext[Any], /
    ) -> AgentResponse: ...


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
        return ContextResult()

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


@runtime_checkable
class GroupLike(Protocol):
    """A stack item that builds its own layer from this module's parts: a :func:`raf.parallel`
    group (which imports this module, so this module names it by what it does)."""

    members: tuple[Any, ...]

    def build_layer(
        self, call_next: CompleteInvocation, *, where: str, post_timeout: float, observers: Any
    ) -> CompleteInvocation: ...


def is_provider(item: object) -> bool:
    """A stack item with ``on_invoking`` (or a :func:`raf.parallel` group) is a provider."""
    return isinstance(item, GroupLike) or callable(getattr(item, "on_invoking", None))


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
    if getattr(on_invoked, "__func__", None) is ContextProvider.on_invoked:
        return None
    return on_invoked


def stages_of(provider: Any, observers: Sequence[Any]) -> tuple[PreStage, PostStage | None]:
    """The provider's pre and post stage (``None``: it has none or inherits the no-op),
    inside the observers' ``provider_stage`` hooks (see :class:`raf.Observer`)."""
    own = post_stage_of(provider)
    if not observers:
        return provider.on_invoking, own
    kind = str(getattr(provider, "kind", "unknown"))
    inherited = getattr(provider, "on_invoked", None)
    return observed_stages(
        provider, provider_name(provider), kind, provider.on_invoking, own, inherited, observers
    )


def provider_layer(
    provider: Any, call_next: CompleteInvocation, *, post_timeout: float, observers: Any = ()
) -> CompleteInvocation:
    """One provider around ``call_next``: its pre stage, the rest of the run, its post stage."""
    on_invoking, on_invoked = stages_of(provider, observers)
    name = provider_name(provider)
    entered: Entered = [] if on_invoked is None else [(provider, on_invoked)]

    async def layer(invocation: Invocation) -> AgentResponse:
        try:
            result = await on_invoking(
                invocation.agent,
                invocation.session,
                invocation.request_messages,
                invocation.options,
            )
        except Exception as exc:
            raise stage_error(provider, "on_invoking", exc) from exc
        inner = merged(name, invocation, result)
        return await around(call_next, inner, invocation, entered, post_timeout)

    return layer


async def around(
    call_next: CompleteInvocation,
    inner: Invocation,
    invocation: Invocation,
    entered: Entered,
    post_timeout: float,
) -> AgentResponse:
    """``call_next(inner)``, then the post stages of ``entered`` with how it ended."""
    if not entered:
        return await call_next(inner)
    try:
        response = await call_next(inner)
    except BaseException as error:
        await run_post_stages(entered, invocation, None, error, post_timeout)
        raise
    await run_post_stages(entered, invocation, response, None, post_timeout)
    return response


async def run_post_stages(
    entered: Entered,
    invocation: Invocation,
    response: AgentResponse | None,
    error: BaseException | None,
    post_timeout: float,
) -> None:
    """The post stages of ``entered``, last entered first, with the run's outcome.

    A failure is a note on ``error``; on success it goes to
    ``invocation.post_failures`` (raised here once all ran, when there is no
    such list). A BaseException arriving in one (a cancellation) is what the
    remaining ones see, and is raised once they have run.
    """
    failures = invocation.post_failures
    collected: list[ProviderError] = [] if failures is None else failures
    arrived: BaseException | None = None
    for provider, on_invoked in reversed(entered):
        seen = arrived or error
        args = (invocation.agent, invocation.session, invocation.request_messages)
        try:
            failure = await _post_stage(
                provider,
                on_invoked,
                (*args, response if seen is None else None, seen),
                post_timeout,
            )
        except BaseException as exc:
            arrived = exc
            continue
        if failure is None:
            continue
        if seen is None:
            collected.append(failure)
        else:
            note(seen, failure)
    if failures is None and arrived is not None:
        for failure in collected:
            note(arrived, failure)
    if arrived is not None:
        raise arrived
    if failures is None and collected:
        raise_failures(collected)


def collect_post_failures(call_next: CompleteInvocation) -> CompleteInvocation:
    """The outermost layer of a stack with providers: it gives each run the list of its
    post-stage failures and, once every post stage ran, raises the innermost one as a
    :class:`ProviderError` (the others as notes), or notes them on the run's error."""

    async def outermost(invocation: Invocation) -> AgentResponse:
        failures: list[ProviderError] = []
        try:
            response = await call_next(attrs.evolve(invocation, post_failures=failures))
        except BaseException as error:
            for failure in failures:
                note(error, failure)
            raise
        if failures:
            raise_failures(failures)
        return response

    return outermost


def compose(
    core: CallNext[Request],
    stack: Sequence[Any] = (),
    *,
    post_timeout: float = 10.0,
    observers: Sequence[Any] = (),
) -> CallNext[Request]:
    """Build the onion once: ``stack[0]`` outermost, ``core`` in the middle.

    Each item is a provider (it has ``on_invoking``; only for a run stack,
    whose request is an :class:`raf.Invocation`), a :func:`raf.parallel`
    group, or a middleware callable; each is one layer. Calling the result
    runs the whole stack. A failed post stage of a successful run does not
    change what the layers outside it see: it is raised once every post
    stage ran, by the outermost layer. The ``provider_stage`` hooks of
    ``observers`` (see :class:`raf.Observer`) wrap every provider stage.

    >>> async def core(request):
    ...     return AgentResponse()
    >>> compose(core, []) is core
    True
    """
    complete: Any = core
    for index in range(len(stack) - 1, -1, -1):
        complete = _layer(stack[index], complete, f"stack[{index}]", post_timeout, observers)
    if any(is_provider(item) for item in stack):
        complete = collect_post_failures(complete)
    return complete  # type: ignore[no-any-return]


def _layer(
    item: Any, call_next: Any, where: str, post_timeout: float, observers: Sequence[Any]
) -> Any:
    if isinstance(item, GroupLike):
        return item.build_layer(
            call_next, where=where, post_timeout=post_timeout, observers=observers
        )
    if callable(getattr(item, "on_invoking", None)):
        validate_stages(item, where)
        return provider_layer(item, call_next, post_timeout=post_timeout, observers=observers)
    if isinstance(item, type) or not callable(item):
        raise TypeError(
            f"{where} is neither a context provider (no on_invoking) nor a middleware "
            f"callable: {item!r}"
            + (" (a class: put an instance in the stack)" if isinstance(item, type) else "")
        )
    # A lambda, not a coroutine: the middleware's own coroutine is the only frame.
    return lambda request: item(request, call_next)


# The stages ------------------------------------------------------------------------------


def merged(name: str, invocation: Invocation, result: object) -> Invocation:
    """``merge``, a malformed result becoming the provider's ProviderError."""
    try:
        return merge(invocation, result, source=name)  # type: ignore[arg-type]
    except ContextResultError as exc:
        raise ProviderError(name, "on_invoking", str(exc), field=exc.field) from exc


async def _post_stage(
    provider: Any, on_invoked: PostStage, args: tuple[Any, ...], post_timeout: float
) -> ProviderError | None:
    """One post stage; its failure, if it failed. Shielded and bounded by ``post_timeout``
    when the run is being cancelled or the consumer of a stream left (so a hung post stage
    cannot keep the caller open); otherwise the caller's own deadlines apply."""
    error = args[4]
    bounded = isinstance(error, StreamClosedError) or _being_cancelled(error)
    deadline = anyio.current_time() + post_timeout if bounded else math.inf
    finished = False
    with anyio.CancelScope(deadline=deadline, shield=bounded) as scope:
        try:
            await on_invoked(*args)
            finished = True
        except Exception as exc:
            return _post_failure(provider, exc, error)
    if finished or not scope.cancelled_caught:
        return None
    overrun = TimeoutError(f"post_timeout={post_timeout}s")
    while_ = (
        "on the early close of the stream"
        if isinstance(error, StreamClosedError)
        else ("while the run was being cancelled")
    )
    failure = ProviderError(
        provider_name(provider),
        "on_invoked",
        f"did not finish within post_timeout={post_timeout}s {while_}",
    )
    failure.__cause__ = overrun
    _log_failure(failure, overrun, error)
    return failure


def _being_cancelled(error: BaseException | None) -> bool:
    """Whether the run is being cancelled: the backend's exception, or a cancelled scope
    around us (which also covers a cancellation wrapped in a group, or translated)."""
    try:
        if error is not None and isinstance(error, anyio.get_cancelled_exc_class()):
            return True
        return anyio.current_effective_deadline() == -math.inf
    except Exception:  # no async library is running: nothing can be cancelling us
        return False


# Failures ---------------------------------------------------------------------------------


def stage_error(provider: Any, stage: Any, exc: BaseException) -> ProviderError:
    """The :class:`ProviderError` of ``provider``'s ``stage`` that raised ``exc``."""
    return ProviderError(provider_name(provider), stage, f"{type(exc).__name__}: {exc}")


def _post_failure(provider: Any, exc: BaseException, error: BaseException | None) -> ProviderError:
    failure = stage_error(provider, "on_invoked", exc)
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


def note(error: BaseException, failure: ProviderError, how: str = "while this propagated") -> None:
    """Attach ``failure`` to ``error``; an early close keeps it to raise it as after success."""
    error.add_note(f"raf: {how}, {failure} (cause: {failure.__cause__!r})")
    if type(error) is StreamClosedError:
        error.post_failures.append(failure)


def raise_failures(failures: Sequence[ProviderError], how: str = "also") -> None:
    """Raise the first of ``failures`` (the innermost), the others attached as notes."""
    first, *others = failures
    for other in others:
        first.add_note(f"raf: {how}, {other} (cause: {other.__cause__!r})")
    raise first from first.__cause__
