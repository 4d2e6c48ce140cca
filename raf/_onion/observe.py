"""Observers: hooks that wrap a run, each provider stage, each model call and each tool call.

An observer is given to the agent (``Agent(..., observers=[...])``) and
watches every run of it. Each hook is a wrapper in the middleware shape,
``async (request, call_next)``, so an observer can time what it wraps,
see how it ended (its error or cancellation passes through the hook), and
make a context (an OpenTelemetry span) current for the work nested inside.
``raf.otel`` and ``raf run --trace`` are two observers of these hooks.

Where each hook sits, with observers ``[a, b]`` (``a`` outermost):

- ``run``: outermost run middleware, around the whole run;
- ``provider_stage``: around each provider stage (``on_invoking`` and
  ``on_invoked``, of single providers and of parallel groups' members);
- ``model_call``: outermost chat middleware, around each model call that
  the tool loop makes (a retried call is one model call);
- ``model_attempt``: innermost chat middleware, around each call that
  reaches the chat client (each attempt of a retried call);
- ``tool_call``: outermost tool middleware, around each tool call;
- ``guardrail``: around each check of a guardrail (:class:`raf.InputGuardrail`,
  :class:`raf.OutputGuardrail`, :class:`raf.ToolGuardrail`), wherever it sits.

An agent without observers runs as if this module did not exist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from functools import reduce
from typing import Any, ClassVar

import attrs

from raf._onion.errors import provider_name
from raf._values.context import ChatRequest, Invocation, ToolRequest
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.verdict import GuardrailCheck, Verdict
from raf.errors import Stage

__all__ = ["Observer", "ProviderStage"]

PreStage = Callable[..., Awaitable[Any]]
PostStage = Callable[..., Awaitable[None]]

#: What ``call_next`` of a ``provider_stage`` hook is: it runs the stage, returns its result.
RunStage = Callable[[], Awaitable[Any]]
#: The ``provider_stage`` hooks of an agent's observers, folded into one (outermost first).
StageHook = Callable[["ProviderStage", RunStage], Awaitable[Any]]

HOOKS = ("run", "provider_stage", "model_call", "model_attempt", "tool_call", "guardrail")

#: What ``call_next`` of a ``guardrail`` hook is: it runs the check, returns its verdict.
RunCheck = Callable[[], Awaitable[Verdict]]


@attrs.frozen(slots=True)
class ProviderStage:
    """One provider stage about to run, as a ``provider_stage`` hook sees it.

    ``name`` and ``kind`` are the provider's (``kind`` ``"unknown"`` when it
    says none); ``stage`` is ``"on_invoking"`` or ``"on_invoked"``; on a
    post stage, ``error`` is the error that ended the run (``None`` on
    success).
    """

    provider: Any = attrs.field(repr=False)
    name: str
    kind: str
    stage: Stage
    error: BaseException | None = None


class Observer:
    """Base class of observers: override the hooks you need, the others cost nothing.

    Every hook is a wrapper: await ``call_next`` exactly once and return
    what it returns; what it raises (an error, the backend's cancellation)
    passes through the hook, which may look at it and must re-raise it.
    An observer watches; it does not change the request or the outcome.
    A class that does not inherit from ``Observer`` works too: its hooks
    are the methods it has, by name.

    >>> import anyio
    >>> from raf import Agent, EchoChatClient
    >>> class Count(Observer):
    ...     calls = 0
    ...     async def model_call(self, request, call_next):
    ...         Count.calls += 1
    ...         return await call_next(request)
    >>> anyio.run(Agent(EchoChatClient(), observers=[Count()]).run, "hi").text
    'hi'
    >>> Count.calls
    1
    """

    __slots__ = ()

    #: Whether ``provider_stage`` also wraps the post stages that providers inherit from
    #: :class:`raf.ContextProvider`: they do nothing, and raf skips them for the others.
    inherited_post_stages: ClassVar[bool] = False
    #: Whether the observer also watches the runs of the agents its agent calls as tools
    #: (``agent.as_tool()``): its hooks then wrap those runs too (the context ledger does).
    #: Off by default: an observer made for one agent (raf.otel's) would name the child's
    #: work as its own; an instrumented child draws its own spans, nested in the caller's.
    watches_agent_tools: ClassVar[bool] = False

    async def run(
        self, invocation: Invocation, call_next: Callable[[Invocation], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Around the whole run (outermost run middleware)."""
        return await call_next(invocation)

    async def provider_stage(self, stage: ProviderStage, call_next: RunStage) -> Any:
        """Around one provider stage: ``await call_next()`` runs it and returns its result."""
        return await call_next()

    async def model_call(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Around one model call, its retries included (outermost chat middleware)."""
        return await call_next(request)

    async def model_attempt(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Around each call that reaches the chat client (innermost chat middleware)."""
        return await call_next(request)

    async def tool_call(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """Around one tool call (outermost tool middleware)."""
        return await call_next(request)

    async def guardrail(self, check: GuardrailCheck, call_next: RunCheck) -> Verdict:
        """Around one check of a guardrail: ``await call_next()`` runs it, returns its verdict."""
        return await call_next()


def checked_observers(observers: Iterable[Any]) -> tuple[Any, ...]:
    """``Agent(observers=)``, checked: instances that have at least one hook."""
    if isinstance(observers, (str, bytes)) or not isinstance(observers, Iterable):
        raise TypeError(f"observers must be a list of observers, got {observers!r}")
    checked = tuple(observers)
    for index, item in enumerate(checked):
        if isinstance(item, type):
            raise TypeError(
                f"observers[{index}] is the class {item.__name__}: "
                f"put an instance in the list, {item.__name__}(...)"
            )
        if not any(callable(getattr(item, name, None)) for name in HOOKS):
            raise TypeError(
                f"observers[{index}] has none of the hooks {', '.join(HOOKS)}: {item!r}"
            )
    return checked


def hooks(observers: Iterable[Any], name: str) -> list[Callable[..., Any]]:
    """The observers' hooks called ``name``, outermost first (``Observer``'s own are skipped)."""
    found = []
    default = getattr(Observer, name)
    for observer in observers:
        hook = getattr(observer, name, None)
        if callable(hook) and getattr(hook, "__func__", None) is not default:
            found.append(hook)
    return found


def stage_hook(observers: Iterable[Any], *, inherited: bool = False) -> StageHook | None:
    """The observers' ``provider_stage`` hooks as one (the first outermost), or ``None``.

    ``inherited``: only the hooks of the observers that see inherited post stages.
    """
    if inherited:
        observers = [o for o in observers if getattr(o, "inherited_post_stages", False)]
    found: list[StageHook] = hooks(observers, "provider_stage")
    if not found:
        return None

    def nest(outer: StageHook, inner: StageHook) -> StageHook:
        return lambda stage, call_next: outer(stage, lambda: inner(stage, call_next))

    return reduce(nest, found)


async def observed_check(observers: Iterable[Any], check: GuardrailCheck, run: RunCheck) -> Verdict:
    """``run()``, the check, inside the observers' ``guardrail`` hooks (the first outermost)."""
    call: RunCheck = run
    for hook in reversed(hooks(observers, "guardrail")):
        call = _nested(hook, check, call)
    return await call()


def _nested(hook: Callable[..., Any], check: GuardrailCheck, inner: RunCheck) -> RunCheck:
    return lambda: hook(check, inner)


def observed_stages(
    provider: Any, on_invoked: PostStage | None, observers: Iterable[Any]
) -> tuple[PreStage, PostStage | None]:
    """A provider's stages inside the observers' ``provider_stage`` hooks.

    ``on_invoked`` is its own post stage, ``None`` when it has none or
    inherits the no-op of :class:`raf.ContextProvider`, which is wrapped
    only for the observers that ask to see it (``inherited_post_stages``).
    """
    observers = tuple(observers)
    on_invoking = provider.on_invoking
    observe = stage_hook(observers)
    if observe is None:
        return on_invoking, on_invoked
    name, kind = provider_name(provider), str(getattr(provider, "kind", "unknown"))
    pre = ProviderStage(provider, name, kind, "on_invoking")

    # Plain functions that return the hook's coroutine: no frame of their own per stage.
    def observed_pre(*args: Any) -> Awaitable[Any]:
        return observe(pre, lambda: on_invoking(*args))

    post, observe_post = on_invoked, stage_hook(observers)
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
