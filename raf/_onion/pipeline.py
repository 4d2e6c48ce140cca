"""Middleware, ChatRequest and compose: building the onion once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from raf._onion.compose import provider_layer, raise_post_failures, validate_stages
from raf._onion.parallel import ProviderGroup, group_layer, is_provider
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate
from raf._values.options import ChatOptions

__all__ = ["CallNext", "ChatRequest", "Middleware", "compose"]

Request = TypeVar("Request")
Request_contra = TypeVar("Request_contra", contravariant=True)

#: The inner rest of a stack: ``await call_next(request)`` runs it.
CallNext = Callable[[Request], Awaitable[AgentResponse]]


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
        self, request: Request_contra, call_next: CallNext[Any], /
    ) -> AgentResponse: ...


@attrs.frozen(slots=True)
class ChatRequest:
    """One model call on its way through the chat stack.

    ``on_update`` is where the call's updates go in a streamed run (``None``
    otherwise); a chat middleware may wrap it to see them, with
    ``attrs.evolve(request, on_update=...)``.
    """

    messages: Sequence[ChatMessage]
    options: ChatOptions
    on_update: OnUpdate | None = attrs.field(default=None, repr=False)


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
    change what the providers outside it see; it is raised once their post
    stages ran, by the nearest middleware boundary outside it (a middleware
    sees the error its caller would) or at the outermost layer. The
    ``provider_stage`` hooks of ``observers`` (see :class:`raf.Observer`)
    wrap every provider stage.

    >>> async def core(request):
    ...     return AgentResponse()
    >>> run = compose(core, [])
    >>> run is core
    True
    """
    complete: CallNext[Any] = core
    # Post-stage failures of the providers since the last boundary still travel outward
    # with the response: a middleware must see what its caller would, so they are
    # raised just inside it (and outermost).
    pending = False
    for index in range(len(stack) - 1, -1, -1):
        item = stack[index]
        where = f"stack[{index}]"
        if isinstance(item, ProviderGroup):
            for number, member in enumerate(item.members):
                validate_stages(member, f"{where} ({item.name}) member {number}")
            complete = group_layer(item, complete, post_timeout=post_timeout, observers=observers)
            pending = True
        elif is_provider(item):
            validate_stages(item, where)
            complete = provider_layer(
                item, complete, post_timeout=post_timeout, observers=observers
            )
            pending = True
        elif isinstance(item, type) or not callable(item):
            raise TypeError(
                f"{where} is neither a context provider (no on_invoking) nor a middleware "
                f"callable: {item!r}"
                + (" (a class: put an instance in the stack)" if isinstance(item, type) else "")
            )
        else:
            if pending:
                complete, pending = raise_post_failures(complete), False
            complete = _bind(item, complete)
    return raise_post_failures(complete) if pending else complete  # type: ignore[return-value]


def _bind(middleware: Middleware[Any], call_next: CallNext[Any]) -> CallNext[Any]:
    # A lambda, not a coroutine: the middleware's own coroutine is the only frame.
    return lambda request: middleware(request, call_next)
