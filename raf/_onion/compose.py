"""The onion: ContextProvider, the layer that wraps one provider around the rest, compose.

A provider layer runs its pre stage, merges the result into the invocation it
passes inward, calls the rest, and runs the post stage on the way out, however
the rest ended (a :func:`raf.parallel` group's layer runs its members through
the same functions). A failed post stage does not change what the layers
outside see (the policy is ``raf._onion.errors``'s): a note on an error, or
kept in the run's own list, ``invocation.run.failures``, which the outermost
layer (:func:`settle_post_failures`) raises once the run succeeded, or notes
on the run's error.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import anyio

from raf._onion import errors
from raf._onion.observe import PostStage, PreStage, observed_stages
from raf._values.context import AgentLike, ContextResult, Invocation
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.options import AgentRunOptions
from raf._values.protocols import CallNext, Request, Session
from raf.errors import ProviderError, StreamClosedError

__all__ = ["CallNext", "ContextProvider", "compose"]

CompleteInvocation = Callable[[Invocation], Awaitable[AgentResponse]]
#: The providers whose pre stage returned, with their post stage, in the order entered.
Entered = list[tuple[Any, PostStage]]


class _ClassName:
    """``name`` defaults to the class name; a non-data descriptor, so a class
    attribute, a property or an instance attribute of a subclass all win."""

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
class GroupLike(Protocol):
    """A stack item that builds its own layer from this module's parts: a
    :func:`raf.parallel` group, or a :class:`raf.LongTermMemory`, whose stages need the
    run's namespace first (named by what it does, as ``raf._onion.parallel`` imports
    this module)."""

    def build_layer(
        self, call_next: CompleteInvocation, *, where: str, post_timeout: float, observers: Any
    ) -> CompleteInvocation: ...


def is_provider(item: object) -> bool:
    """A stack item with ``on_invoking`` (or a :func:`raf.parallel` group) is a provider."""
    return isinstance(item, GroupLike) or callable(getattr(item, "on_invoking", None))


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
    inside the observers' ``provider_stage`` hooks (see :class:`raf.observe.Observer`)."""
    own = post_stage_of(provider)
    return observed_stages(provider, own, observers) if observers else (provider.on_invoking, own)


def provider_layer(
    provider: Any, call_next: CompleteInvocation, *, post_timeout: float, observers: Any = ()
) -> CompleteInvocation:
    """One provider around ``call_next``: its pre stage, the rest of the run, its post stage."""
    on_invoking, on_invoked = stages_of(provider, observers)
    name = errors.provider_name(provider)
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
            raise errors.stage_error(provider, "on_invoking", exc) from exc
        inner = errors.merged(name, invocation, result)
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

    A failure goes by the policy (:func:`raf._onion.errors.post_failed`). A
    BaseException arriving in one (a cancellation) is what the rest see,
    raised once they have run.
    """
    run = invocation.run
    arrived: BaseException | None = None
    start = (invocation.agent, invocation.session, invocation.request_messages)
    for provider, on_invoked in reversed(entered):
        seen = arrived or error
        args = (*start, response if seen is None else None, seen)
        try:
            failure = await _post_stage(provider, on_invoked, args, post_timeout)
        except BaseException as exc:
            arrived = exc
            continue
        if failure is not None:
            errors.post_failed(run, failure, seen)
    if arrived is not None:
        raise arrived


def settle_post_failures(call_next: CompleteInvocation) -> CompleteInvocation:
    """The outermost layer of a stack with providers: once every post stage ran, the run's
    failed ones are raised (the run succeeded) or noted on the run's error."""

    async def outermost(invocation: Invocation) -> AgentResponse:
        try:
            response = await call_next(invocation)
        except BaseException as error:
            errors.settle(invocation.run.failures, error)
            raise
        errors.settle(invocation.run.failures, None)
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

    Each item is one layer: a provider (it has ``on_invoking``; only in a run
    stack), a :func:`raf.parallel` group, or a middleware callable. A stack
    with providers gets the outermost layer that raises the post-stage
    failures of a successful run. The ``provider_stage`` hooks of
    ``observers`` (see :class:`raf.observe.Observer`) wrap every provider stage.

    >>> async def core(request):
    ...     return AgentResponse()
    >>> compose(core, []) is core
    True
    """
    complete: Any = core
    for index in range(len(stack) - 1, -1, -1):
        complete = _layer(stack[index], complete, f"stack[{index}]", post_timeout, observers)
    if any(is_provider(item) for item in stack):
        complete = settle_post_failures(complete)
    return complete  # type: ignore[no-any-return]


def _layer(
    item: Any, call_next: Any, where: str, post_timeout: float, observers: Sequence[Any]
) -> Any:
    if isinstance(item, GroupLike):
        return item.build_layer(
            call_next, where=where, post_timeout=post_timeout, observers=observers
        )
    if callable(getattr(item, "on_invoking", None)):
        errors.validate_stages(item, where)
        return provider_layer(item, call_next, post_timeout=post_timeout, observers=observers)
    errors.check_middleware(item, where)
    # A lambda, not a coroutine: the middleware's own coroutine is the only frame.
    return lambda request: item(request, call_next)


async def _post_stage(
    provider: Any, on_invoked: PostStage, args: tuple[Any, ...], post_timeout: float
) -> ProviderError | None:
    """One post stage; its failure, if it failed. Shielded and bounded by ``post_timeout``
    when the run is being cancelled or the consumer of a stream left (so a hung post stage
    cannot keep the caller open); otherwise a plain await: the caller's own deadlines apply."""
    error = args[4]
    closed = isinstance(error, StreamClosedError)
    if not (closed or _being_cancelled(error)):
        return await _attempt(provider, on_invoked, args)
    with anyio.CancelScope(deadline=anyio.current_time() + post_timeout, shield=True) as scope:
        return await _attempt(provider, on_invoked, args)
    if not scope.cancelled_caught:
        return None
    overrun = TimeoutError(f"post_timeout={post_timeout}s")
    when = "on the early close of the stream" if closed else "while the run was being cancelled"
    detail = f"did not finish within post_timeout={post_timeout}s {when}"
    return errors.post_failure(provider, overrun, error, detail)


async def _attempt(
    provider: Any, on_invoked: PostStage, args: tuple[Any, ...]
) -> ProviderError | None:
    try:
        await on_invoked(*args)
    except Exception as exc:
        return errors.post_failure(provider, exc, args[4], f"{type(exc).__name__}: {exc}")
    return None


def _being_cancelled(error: BaseException | None) -> bool:
    """Whether the run is being cancelled: the backend's exception, or a cancelled scope
    around us (which also covers a cancellation wrapped in a group, or translated)."""
    try:
        if error is not None and isinstance(error, anyio.get_cancelled_exc_class()):
            return True
        return anyio.current_effective_deadline() == -math.inf
    except Exception:  # no async library is running: nothing can be cancelling us
        return False
