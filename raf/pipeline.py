"""Middleware, ChatRequest and compose: building the onion once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from raf.messages import AgentResponse, ChatMessage
from raf.options import ChatOptions
from raf.parallel import ProviderGroup
from raf.providers import collect_post_failures, providers_layer

__all__ = ["ChatRequest", "Complete", "Middleware", "compose", "is_provider"]

Request = TypeVar("Request")
Request_contra = TypeVar("Request_contra", contravariant=True)

#: The inner rest of a stack: ``await call_next(request)`` runs it.
Complete = Callable[[Request], Awaitable[AgentResponse]]


class Middleware(Protocol[Request_contra]):
    """``async (request, call_next) -> AgentResponse``.

    In the run stack the request is an :class:`raf.Invocation`; in the chat
    stack it is a :class:`ChatRequest`. Call ``call_next`` once to go on
    inward, more than once to retry, or not at all to answer yourself.

    >>> async def shout(request, call_next):
    ...     response = await call_next(request)
    ...     return response
    """

    async def __call__(
        self, request: Request_contra, call_next: Callable[[Any], Awaitable[AgentResponse]], /
    ) -> AgentResponse: ...


@attrs.frozen(slots=True)
class ChatRequest:
    """One model call on its way through the chat stack."""

    messages: Sequence[ChatMessage]
    options: ChatOptions


def is_provider(item: object) -> bool:
    """A stack item with ``on_invoking`` (or a :func:`raf.parallel` group) is a provider.

    Other callables are middleware.
    """
    return isinstance(item, ProviderGroup) or callable(getattr(item, "on_invoking", None))


def compose(
    core: Complete[Request], stack: Sequence[Any] = (), *, post_timeout: float = 10.0
) -> Complete[Request]:
    """Build the onion once: ``stack[0]`` outermost, ``core`` in the middle.

    Each item is a provider (it has ``on_invoking``; only for a run stack,
    whose request is an :class:`raf.Invocation`) or a middleware callable.
    Calling the result runs the whole stack; post-stage failures are raised
    once every post stage has run.

    >>> async def core(request):
    ...     return AgentResponse()
    >>> run = compose(core, [])
    >>> run is core
    True
    """
    complete: Complete[Any] = core
    has_providers = False
    providers: list[Any] = []  # consecutive providers, innermost first: they share one layer
    for index in range(len(stack) - 1, -1, -1):
        item = stack[index]
        if is_provider(item):
            has_providers = True
            providers.append(item)
            continue
        if not callable(item):
            raise TypeError(
                f"stack[{index}] is neither a context provider (no on_invoking) nor a "
                f"middleware callable: {item!r}"
            )
        if providers:
            complete = providers_layer(providers[::-1], complete, post_timeout=post_timeout)
            providers = []
        complete = _bind(item, complete)
    if providers:
        complete = providers_layer(providers[::-1], complete, post_timeout=post_timeout)
    return collect_post_failures(complete) if has_providers else complete  # type: ignore[return-value]


def _bind(middleware: Middleware[Any], call_next: Complete[Any]) -> Complete[Any]:
    # A lambda, not a coroutine: the middleware's own coroutine is the only frame.
    return lambda request: middleware(request, call_next)
