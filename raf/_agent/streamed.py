"""A streamed run's core: the model's stream into ``on_update``, and its early close.

A streamed run is the same onion as any other: the updates go out through
``Invocation.on_update`` (ASGI's ``send``) while every layer stays a plain
await in the run's task. What streaming adds is the early close
(:class:`Closing`): the consumer leaves before the end, the run's core (its
tool loop) is cancelled and comes out as ``StreamClosedError(partial)``,
which the provider layers then see as the run's error. The iterator form
(``raf._agent.streaming.AgentStream``) closes its run this way when its block is
left early; a callback-form caller (``raf.serve``) enters a :class:`Closing`
around ``agent.run(on_update=...)`` and closes it when its client leaves.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

import anyio

from raf._values.assembly import Assembly
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate, Update
from raf._values.options import ChatOptions
from raf.errors import StreamClosedError

__all__: list[str] = []

P = ParamSpec("P")
T = TypeVar("T")


class Closing:
    """The early close of one streamed run: ``with Closing() as closing: await agent.run(...)``.

    Entered, it is the closing of the streamed run that the task runs next
    (context variables: a run's tasks started inside see it too). Its
    :meth:`close` cancels the run's core, wherever the run is; the core then
    raises :attr:`closed`, a ``StreamClosedError`` carrying the partial
    answer, and every entered provider's post stage gets it, bounded by
    ``post_timeout``, not under cancellation. A core not entered yet raises
    it at once; a core already done is not touched (the run completed).
    """

    __slots__ = ("_scopes", "_token", "closed")

    def __init__(self) -> None:
        self.closed: StreamClosedError | None = None  # set by close()
        self._scopes: list[anyio.CancelScope] = []  # the cores in flight
        self._token: Token[Closing | None] | None = None

    def close(self, partial: AgentResponse) -> None:
        """Close the run early; ``partial`` is what its consumer received. Once only."""
        if self.closed is None:
            self.closed = StreamClosedError(partial)
            for scope in self._scopes:
                scope.cancel()

    def __enter__(self) -> Closing:
        self._token = STREAMED_RUN.set(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._token is not None
        STREAMED_RUN.reset(self._token)


#: In a streamed run's task, until its core is entered: the closing of that run.
STREAMED_RUN: ContextVar[Closing | None] = ContextVar("raf_stream_run", default=None)
#: Inside that core: the closing its model calls answer. A streamed run nested in it
#: (from a tool) sets None for itself: it is not that run's.
_CORE: ContextVar[Closing | None] = ContextVar("raf_stream_core", default=None)


async def streamed_core(
    function: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``await function(*args, **kwargs)``: the core (tool loop) of a streamed run.

    In a run with a :class:`Closing` (the iterator form's, or one a caller
    entered), the core is the run's in-flight work: it runs in one cancel
    scope that an early close cancels, and the cancellation comes out of here
    as the ``StreamClosedError``. Anywhere else (a plain callback-form run, a
    run nested in a tool) it is a plain await that joins no outer stream.
    """
    closing = STREAMED_RUN.get()
    if closing is None and _CORE.get() is None:
        return await function(*args, **kwargs)
    tokens = STREAMED_RUN.set(None), _CORE.set(closing)
    try:
        if closing is None:  # a run nested in a stream's core is not that stream's
            return await function(*args, **kwargs)
        if closing.closed is None:
            with anyio.CancelScope() as scope:
                closing._scopes.append(scope)
                try:
                    result = await function(*args, **kwargs)
                finally:
                    closing._scopes.remove(scope)
                if closing.closed is None:
                    return result
        # Closed before the core, or meanwhile: what the consumer got is the partial answer.
        assert closing.closed is not None
        raise closing.closed
    finally:
        _CORE.reset(tokens[1])
        STREAMED_RUN.reset(tokens[0])


async def stream_model(
    client: Any, messages: Sequence[ChatMessage], options: ChatOptions, on_update: OnUpdate
) -> AgentResponse:
    """One model call of a streamed run: each update to ``on_update``, then the response.

    Uses ``client.stream`` when the client has one (the response is what
    the updates assemble to), else ``client.complete`` (its answer is then
    sent as updates). An early close comes out as ``StreamClosedError``.
    """
    name = type(client).__name__
    stream = getattr(client, "stream", None)
    try:
        if stream is None:
            response: AgentResponse = await client.complete(messages, options)
            await pump(name, _replay(response), on_update)
            return response
        iterator = stream(messages, options)
        if not hasattr(iterator, "__anext__"):
            if inspect.iscoroutine(iterator):
                iterator.close()  # 'async def stream' that returns: never awaited, no warning
            raise TypeError(
                f"{name}.stream() must return an async iterator of raf.Update "
                f"(write it as an async generator), got {type(iterator).__name__}"
            )
        return (await pump(name, iterator, on_update)).response()
    except anyio.get_cancelled_exc_class():
        closing = _CORE.get()
        if closing is not None and closing.closed is not None:
            raise closing.closed from None
        raise


async def pump(client: str, iterator: AsyncIterator[Update], on_update: OnUpdate) -> Assembly:
    """Send each update of a model's stream to ``on_update``, here: what they amount to.

    The updates themselves are not kept: their vendor chunks (``raw``) may
    be many times the answer's size (a server sending a character at a time).
    """
    updates = Assembly()
    try:
        async for update in iterator:
            if type(update) is not Update:
                raise TypeError(f"{client}.stream() yielded {update!r:.80}, not a raf.Update")
            updates.add(update)
            await on_update(update)
    finally:
        # Closed in the run's task, whatever ended the stream: an abandoned generator would
        # be finalised later, elsewhere, with other context variables.
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
    return updates


async def _replay(response: AgentResponse) -> AsyncIterator[Update]:
    for update in response.to_updates():
        yield update


class Onward:
    """An ``on_update`` that passes each update on to ``send`` and remembers that it did.

    What a chat middleware that may call the model again (a retry, a
    fallback) wraps the call's ``on_update`` in: once an update went
    onward, the consumer has seen it, and a second call would repeat or
    contradict it.
    """

    __slots__ = ("send", "sent")

    def __init__(self, send: OnUpdate) -> None:
        self.send = send
        self.sent = False

    async def __call__(self, update: Update) -> None:
        self.sent = True
        await self.send(update)
