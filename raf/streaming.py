"""Streamed runs: the model's stream through the chat stack, and the iterator form.

A streamed run is the same onion as any other: the updates go out through
``Invocation.on_update`` (ASGI's ``send``) while every layer stays a plain
await in the run's task. The callback form needs nothing more. The
iterator form (:class:`AgentStream`) runs the onion in one task, outside
it, and hands each update over to the consumer; when the consumer leaves
early, the run's in-flight model stream and tools are cancelled and the run
raises :class:`raf.StreamClosedError` from that point, so every provider
layer's ordinary error path gives its post stage the error, not under
cancellation.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup

from raf.errors import StreamClosedError
from raf.messages import AgentResponse, ChatMessage, OnUpdate, Update
from raf.options import ChatOptions

__all__ = ["AgentStream"]

T = TypeVar("T")


class Closing:
    """The early-close state of one iterator-form run, shared by its in-flight work.

    The run's model streams and tool batches run through :meth:`run`, each
    in a cancel scope that :meth:`close` cancels; the cancellation is caught
    at that innermost point and becomes the run's ``StreamClosedError``.
    """

    __slots__ = ("closed", "error", "scopes")

    def __init__(self) -> None:
        self.closed = False
        self.error = StreamClosedError()
        self.scopes: set[anyio.CancelScope] = set()

    def close(self, partial: AgentResponse) -> None:
        """The consumer has gone: stop what is in flight, refuse what comes."""
        self.error = StreamClosedError(partial)
        self.closed = True
        for scope in self.scopes:
            scope.cancel()

    async def run(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await function(*args)``, cancelled (as ``StreamClosedError``) on an early close."""
        if self.closed:
            raise self.error
        # One cancel scope per model call or tool batch, only in the iterator form:
        # never one per update.
        with anyio.CancelScope() as scope:
            self.scopes.add(scope)
            try:
                return await function(*args)
            finally:
                self.scopes.discard(scope)
        # Only reached when close() cancelled the scope: the consumer left.
        raise self.error


#: The iterator-form run that the current task is running, if any: its in-flight work
#: registers with it. A callback-form run (or an unstreamed one) sets None.
CLOSING: ContextVar[Closing | None] = ContextVar("raf_stream_closing", default=None)


async def closable(function: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await function(*args)``, as in-flight work that an early close cancels."""
    closing = CLOSING.get()
    if closing is None:
        return await function(*args)
    return await closing.run(function, *args)


async def stream_model(
    client: Any, messages: Sequence[ChatMessage], options: ChatOptions, on_update: OnUpdate
) -> AgentResponse:
    """One model call of a streamed run: each update to ``on_update``, then the response.

    Uses ``client.stream`` when the client has one (the response is what
    the updates assemble to), else ``client.complete`` (its answer is then
    sent as updates). The client's iterator is always closed here, also
    when the run stops early.
    """
    closing = CLOSING.get()
    if closing is None:
        return await _stream_model(client, messages, options, on_update)
    return await closing.run(_stream_model, client, messages, options, on_update)


async def _stream_model(
    client: Any, messages: Sequence[ChatMessage], options: ChatOptions, on_update: OnUpdate
) -> AgentResponse:
    stream = getattr(client, "stream", None)
    if stream is None:
        response: AgentResponse = await client.complete(messages, options)
        for update in response.to_updates():
            await on_update(update)
        return response
    iterator = stream(messages, options)
    if not hasattr(iterator, "__anext__"):
        if inspect.iscoroutine(iterator):
            iterator.close()  # 'async def stream' that returns: never awaited, no warning
        raise TypeError(
            f"{type(client).__name__}.stream() must return an async iterator of raf.Update "
            f"(write it as an async generator), got {type(iterator).__name__}"
        )
    updates: list[Update] = []
    try:
        async for update in iterator:
            if type(update) is not Update:
                raise TypeError(
                    f"{type(client).__name__}.stream() yielded {update!r:.80}, not a raf.Update"
                )
            updates.append(update)
            await on_update(update)
    finally:
        # Closed here, in this task, whatever ends the loop: an abandoned generator would
        # be finalised later, elsewhere, with other context variables.
        aclose = getattr(iterator, "aclose", None)
        if aclose is not None:
            await aclose()
    return AgentResponse.from_updates(updates)


class AgentStream:
    """The iterator form of a streamed run: ``async with agent.stream(...) as stream``.

    Iterate it for the :class:`raf.Update` objects as they come; afterwards
    :attr:`response` is the run's :class:`raf.AgentResponse`, or ``None``
    if the run did not complete. The run goes in one task that the
    ``async with`` owns, outside the onion; each update is handed over, not
    queued, and the run goes on only when the consumer asks for the next
    one. An error of the run is raised from the iteration, unchanged.

    Leaving the ``async with`` before the end (``break``, ``return``, an
    exception) cancels the run's model stream and tools; every entered
    provider then gets its post stage with a :class:`raf.StreamClosedError`,
    not under cancellation, and the ``async with`` exits once they all ran.
    A post stage that failed is raised then as the innermost
    :class:`raf.ProviderError` (or added as a note to the consumer's own
    exception). A cancelled consumer follows the cancellation rules.

    >>> import anyio
    >>> from raf import Agent, EchoChatClient
    >>> async def main():
    ...     async with Agent(EchoChatClient()).stream("hello big world") as stream:
    ...         words = [update.text async for update in stream if update.kind == "text"]
    ...     return words, stream.response.text
    >>> anyio.run(main)
    (['hello ', 'big ', 'world'], 'hello big world')
    """

    __slots__ = (
        "_asked",
        "_busy",
        "_cancelled",
        "_closing",
        "_error",
        "_error_delivered",
        "_free",
        "_group",
        "_holding",
        "_item",
        "_ready",
        "_received",
        "_response",
        "_run",
        "_start",
        "_state",
    )

    def __init__(
        self,
        start: Callable[[OnUpdate], Awaitable[Any]],
        run: Callable[[Any], Awaitable[AgentResponse]],
    ) -> None:
        # ``start(on_update)`` makes the run's request (the session's request hash
        # included); ``run(request)`` runs the onion.
        self._start = start
        self._run = run
        self._state = "new"  # new -> running -> done (the run ended) ; exited
        self._closing = Closing()
        self._response: AgentResponse | None = None
        self._error: BaseException | None = None
        self._error_delivered = False
        self._cancelled: BaseException | None = None
        self._received: list[Update] = []
        self._group: TaskGroup | None = None
        # The hand-over: the run puts ``_item`` and sets ``_ready`` (also set when the run
        # ends), then waits for ``_asked``, which the consumer sets when it asks for the
        # next update (or leaves). One event each way: two task switches per update.
        self._item: Update | None = None
        self._holding = False
        self._ready: anyio.Event | None = None
        self._asked: anyio.Event | None = None
        # Updates sent concurrently (from tasks of the run) are handed over one by one.
        self._busy = False
        self._free: anyio.Event | None = None

    @property
    def response(self) -> AgentResponse | None:
        """The run's response once it completed; ``None`` before, or if it did not."""
        return self._response

    async def __aenter__(self) -> AgentStream:
        if self._state != "new":
            raise RuntimeError("an agent.stream(...) can be entered only once: call it again")
        self._state = "running"
        invocation = await self._start(self._hand_over)
        self._ready, self._asked = anyio.Event(), anyio.Event()
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        group.start_soon(self._run_task, invocation)
        return self

    async def _run_task(self, invocation: Any) -> None:
        """The run, in its own task: never raises (but for its cancellation)."""
        CLOSING.set(self._closing)  # this task's own context: nothing to reset
        try:
            self._response = await self._run(invocation)
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                self._cancelled = exc  # its notes (failed post stages) go to the consumer's
                raise
            # Kept for the consumer, never raised into the task group (which would wrap
            # it in an exception group and cancel the consumer's block).
            self._error = exc
        finally:
            self._state = "done" if self._state == "running" else self._state
            assert self._ready is not None
            self._ready.set()  # wakes a consumer waiting for the next update: there is none

    async def _hand_over(self, update: Update) -> None:
        """The run's ``on_update``: hand the update over, then wait for the consumer.

        The run goes on only once the consumer asks for the next update, so
        whatever the run does next — the next chunk, the tools, the post
        stages — comes after the consumer is done with this one, and a
        consumer that leaves finds the run here.
        """
        while self._busy:  # another task of the run is handing an update over: queue up
            if self._free is None:
                self._free = anyio.Event()
            await self._free.wait()
        closing = self._closing
        if closing.closed:
            raise closing.error
        self._busy = True
        try:
            asked = self._asked
            assert asked is not None
            assert self._ready is not None
            self._item = update
            self._ready.set()
            await asked.wait()
            if closing.closed:
                raise closing.error
            self._asked = anyio.Event()
        finally:
            self._busy = False
            free, self._free = self._free, None
            if free is not None:
                free.set()

    def __aiter__(self) -> AsyncIterator[Update]:
        return self

    async def __anext__(self) -> Update:
        ready = self._ready
        if ready is None:
            raise RuntimeError(
                "iterate a stream inside its block: 'async with agent.stream(...) as stream: "
                "async for update in stream: ...'"
            )
        if self._holding:  # the run waits for this: the consumer wants the next one
            self._holding = False
            assert self._asked is not None
            self._asked.set()
        await ready.wait()
        update = self._item
        if update is not None:
            self._item = None
            self._ready = anyio.Event()
            self._holding = True
            self._received.append(update)
            return update
        error = self._error
        if error is not None and not self._error_delivered:
            self._error_delivered = True
            raise error  # as it is: its __cause__ and __context__ untouched
        raise StopAsyncIteration

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        group, asked = self._group, self._asked
        assert group is not None
        assert asked is not None
        if self._state == "running" and not isinstance(exc, anyio.get_cancelled_exc_class()):
            # An early close: what the consumer received is the partial answer.
            self._closing.close(AgentResponse.from_updates(self._received))
            asked.set()  # wakes a run waiting at its hand-over: it finds the stream closed
        self._state = "exited"
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            # The consumer is being cancelled: the group cancels the run, whose post
            # stages run shielded and bounded; the cancellation propagates as it is.
            try:
                swallowed = await group.__aexit__(exc_type, exc, tb)
            except BaseException as propagated:  # the backend may raise a new cancellation
                self._pass_notes(propagated)
                raise
            self._pass_notes(exc)
            return swallowed
        # The consumer's own exception never enters the task group (which would wrap it).
        await group.__aexit__(None, None, None)
        self._raise_after(exc)
        return None

    def _pass_notes(self, propagated: BaseException) -> None:
        """The notes of the run's cancellation (failed post stages) on the consumer's.

        A run that had failed by itself before the cancellation, unseen by the
        consumer, is a note too: nothing is swallowed silently.
        """
        cancelled = self._cancelled
        if cancelled is not None and cancelled is not propagated:
            for note in getattr(cancelled, "__notes__", ()):
                propagated.add_note(note)
        error = self._error
        if error is not None and not self._error_delivered and error is not self._closing.error:
            self._error_delivered = True
            propagated.add_note(
                f"raf: the streamed run failed too: {type(error).__name__}: {error}"
            )

    def _raise_after(self, exc: BaseException | None) -> None:
        """What the ``async with`` raises once the run is over: nothing is swallowed."""
        error = self._error
        if error is None or self._error_delivered:
            return None
        if error is self._closing.error:
            failures = self._closing.error.post_failures
            if not failures:
                return None
            if exc is not None:
                for failure in failures:
                    exc.add_note(
                        f"raf: on the early close, {failure} (cause: {failure.__cause__!r})"
                    )
                return None
            first, *others = failures
            for other in others:
                first.add_note(f"raf: also, {other} (cause: {other.__cause__!r})")
            raise first from first.__cause__
        # The run failed by itself and the consumer, gone, never saw it.
        if exc is not None:
            exc.add_note(f"raf: the streamed run failed too: {type(error).__name__}: {error}")
            return
        raise error
