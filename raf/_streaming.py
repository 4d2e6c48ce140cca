"""Streamed runs: the model's stream through the chat stack, and the iterator form.

A streamed run is the same onion as any other: the updates go out through
``Invocation.on_update`` (ASGI's ``send``) while every layer stays a plain
await in the run's task. The callback form needs nothing more.

The iterator form (:class:`AgentStream`) runs the onion in a task of its
own, outside the consumer's block, so that no cancel scope of the onion
ever spans the consumer's code. Only the model's stream crosses over: when
the run reaches it, it hands the stream to the consumer, whose
``__anext__`` reads it, one update a call, and sends each update through
the ``on_update`` chain that the chat stack built (with the run's context
variables). A streamed update thus costs no task switch; only a model call,
a tool result and the end of the run pass between the two tasks.
"""

from __future__ import annotations

import contextvars
import inspect
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup

from raf._errors import StreamClosedError
from raf._messages import AgentResponse, ChatMessage, OnUpdate, Update
from raf._options import ChatOptions

__all__ = ["AgentStream"]

T = TypeVar("T")

Drive = Callable[[str, AsyncIterator[Update], OnUpdate], Awaitable[list[Update]]]


class Closing:
    """The early-close state of one iterator-form run, shared by its in-flight work.

    The run's tool batches (and a model call of a client without
    ``stream``) run through :meth:`run`, each in a cancel scope that
    :meth:`close` cancels; the cancellation is caught at that innermost
    point and becomes the run's ``StreamClosedError``. Its model streams go
    through :attr:`drive`, to the consumer.
    """

    __slots__ = ("closed", "drive", "error", "scopes")

    def __init__(self, drive: Drive) -> None:
        self.closed = False
        self.error = StreamClosedError()
        self.scopes: set[anyio.CancelScope] = set()
        self.drive = drive

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
        # One cancel scope per tool batch, only in the iterator form: never one per update.
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
    sent as updates). The client's iterator is always closed here, in the
    run's task, also when the run stops early. In the iterator form the
    consumer's task reads the stream (see :class:`AgentStream`).
    """
    closing = CLOSING.get()
    name = type(client).__name__
    stream = getattr(client, "stream", None)
    if stream is None:
        if closing is None:
            response: AgentResponse = await client.complete(messages, options)
            await pump(name, _replay(response), on_update)
        else:
            response = await closing.run(client.complete, messages, options)
            await closing.drive(name, _replay(response), on_update)
        return response
    iterator = _open(client, stream, messages, options)
    if closing is None:
        return AgentResponse.from_updates(await pump(name, iterator, on_update))
    return AgentResponse.from_updates(await closing.drive(name, iterator, on_update))


async def pump(client: str, iterator: AsyncIterator[Update], on_update: OnUpdate) -> list[Update]:
    """Send each update of a model's stream to ``on_update``, here: the updates sent.

    The callback form's way; the iterator form hands the stream to its
    consumer instead (:meth:`AgentStream._drive`).
    """
    updates: list[Update] = []
    try:
        async for update in iterator:
            if type(update) is not Update:
                _check(client, update)
            updates.append(update)
            await on_update(update)
    finally:
        await _aclose(iterator)
    return updates


def _open(
    client: Any, stream: Any, messages: Sequence[ChatMessage], options: ChatOptions
) -> AsyncIterator[Update]:
    iterator = stream(messages, options)
    if not hasattr(iterator, "__anext__"):
        if inspect.iscoroutine(iterator):
            iterator.close()  # 'async def stream' that returns: never awaited, no warning
        raise TypeError(
            f"{type(client).__name__}.stream() must return an async iterator of raf.Update "
            f"(write it as an async generator), got {type(iterator).__name__}"
        )
    return iterator  # type: ignore[no-any-return]


def _check(client: str, update: object) -> None:
    if type(update) is not Update:
        raise TypeError(f"{client}.stream() yielded {update!r:.80}, not a raf.Update")


async def _replay(response: AgentResponse) -> AsyncIterator[Update]:
    for update in response.to_updates():
        yield update


async def _aclose(iterator: AsyncIterator[Update]) -> None:
    # Closed in the run's task, whatever ended the stream: an abandoned generator would
    # be finalised later, elsewhere, with other context variables.
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


class _DeadlinePassed(Exception):
    """How a read ends when the run's deadline passed while it waited: never raised."""


_DEADLINE = _DeadlinePassed()
#: In _Steps: no step of the coroutine is under way: take the next one now.
_UNSTARTED = object()


class _ModelStream:
    """One model stream of an iterator-form run, handed by the run to the consumer.

    The consumer reads it (:meth:`pull` in :attr:`context`, the run's
    context variables) until it ends, fails or the consumer leaves, then
    sets :attr:`outcome` and :attr:`done`, which the run waits for.
    """

    __slots__ = (
        "client",
        "context",
        "deadline",
        "done",
        "finished",
        "interrupted",
        "iterator",
        "on_update",
        "outcome",
        "reading",
        "released",
        "scope",
        "scoped",
        "updates",
    )

    def __init__(
        self, client: str, iterator: AsyncIterator[Update], on_update: OnUpdate, deadline: float
    ) -> None:
        self.client = client
        self.iterator = iterator
        self.on_update = on_update
        self.context = contextvars.copy_context()
        # A cancel scope of the onion with a deadline must stop a read that waits for the
        # model; each read then goes in a scope with the same deadline (3-7 us). Without
        # one, a read goes in no scope at all.
        self.deadline = deadline
        self.scoped = deadline != math.inf
        self.updates: list[Update] = []
        self.done = anyio.Event()
        self.finished = False
        self.outcome: BaseException | None = None
        self.reading = False  # a read waits inside the model's stream
        self.scope: anyio.CancelScope | None = None  # that read's scope (with a deadline)
        self.released: anyio.Event | None = None  # set when that read is over
        # The consumer's own cancellation reached the model's stream in the middle of a
        # read: the stream is as good as closed. Leaving the block is an early close;
        # reading again closes the run too (_close_after_interruption).
        self.interrupted = False

    def finish(self, outcome: BaseException | None = None) -> None:
        """The stream is over for the run: ended (None), failed, closed or timed out."""
        if not self.finished:
            self.finished = True
            self.outcome = outcome
            self.done.set()

    async def pull(self) -> bool:
        """Read one update and send it on through ``on_update``; False at the end."""
        try:
            update = await self.iterator.__anext__()
        except StopAsyncIteration:
            return False
        if type(update) is not Update:
            _check(self.client, update)
        self.updates.append(update)
        await self.on_update(update)
        return True


class _Steps:
    """Await a coroutine stepped by hand: each step in ``context``, marked as a read.

    The steps go through ``context.run`` so that the model's stream and the
    chat stack's ``on_update`` see the run's context variables, and with
    ``stream._stepping`` set, so that the run's ``on_update`` knows it is
    called from the consumer's own read. What a step yields (a future, a
    trio trap) goes to the event loop as it is; what the loop sends or
    throws back goes into the coroutine.
    """

    __slots__ = ("context", "coroutine", "first", "stream")

    def __init__(self, stream: AgentStream, context: Any, coroutine: Any, first: Any) -> None:
        self.stream = stream
        self.context = context
        self.coroutine = coroutine
        self.first = first

    def __await__(self) -> Generator[Any, Any, bool]:
        stream, context, coroutine = self.stream, self.context, self.coroutine
        step: Callable[[Any], Any] = coroutine.send
        argument: Any = None
        yielded = self.first
        while True:
            if yielded is _UNSTARTED:
                stream._stepping = True
                try:
                    yielded = context.run(step, argument)
                except StopIteration as stop:
                    result: bool = stop.value
                    return result
                finally:
                    stream._stepping = False
            try:
                argument = yield yielded
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as exc:  # the event loop throws (a cancellation)
                step, argument = coroutine.throw, exc
            else:
                step = coroutine.send
            yielded = _UNSTARTED


class AgentStream:
    """The iterator form of a streamed run: ``async with agent.stream(...) as stream``.

    Iterate it for the :class:`raf.Update` objects as they come; afterwards
    :attr:`response` is the run's :class:`raf.AgentResponse`, or ``None``
    if the run did not complete. The run goes in one task that the
    ``async with`` owns, outside the onion. The model's stream is read by
    the iterating task itself, one update per ``__anext__``, so the run
    never gets ahead of the consumer and an update costs no task switch;
    an update sent from elsewhere in the run (a tool result) is handed
    over, and the run waits until the consumer asks for the next one. An
    error of the run is raised from the iteration, unchanged.

    Leaving the ``async with`` before the end (``break``, ``return``, an
    exception) cancels the run's model stream and tools; every entered
    provider then gets its post stage with a :class:`raf.StreamClosedError`,
    not under cancellation, and the ``async with`` exits once they all ran.
    A post stage that failed is raised then as the innermost
    :class:`raf.ProviderError` (or added as a note to the consumer's own
    exception). A cancelled consumer follows the cancellation rules. A read
    that is cancelled (``move_on_after`` around it) cancels the model's
    stream with it: leaving the block then is an early close, and reading
    again raises that :class:`raf.StreamClosedError`.

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
        "_model_stream",
        "_pending",
        "_reading",
        "_ready",
        "_received",
        "_response",
        "_run",
        "_start",
        "_state",
        "_stepping",
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
        self._closing = Closing(self._drive)
        self._response: AgentResponse | None = None
        self._error: BaseException | None = None
        self._error_delivered = False
        self._cancelled: BaseException | None = None
        self._received: list[Update] = []
        self._group: TaskGroup | None = None
        # The run tells the consumer that something is there (a model stream to read, an
        # update handed over, the end) by setting ``_ready``; the consumer makes a new
        # one each time it woke and looks at the state again.
        self._ready: anyio.Event | None = None
        self._model_stream: _ModelStream | None = None
        # Updates that the consumer's own read sent through on_update, not yet returned.
        self._pending: deque[Update] = deque()
        self._stepping = False  # the consumer's task is in a step of its read
        self._reading = False  # an __anext__ is under way
        # An update sent from the run's task is handed over: the run puts ``_item``, sets
        # ``_ready`` and waits for ``_asked``, which the consumer sets when it asks for the
        # next update (or leaves). Updates sent concurrently queue on ``_busy``.
        self._item: Update | None = None
        self._holding = False
        self._asked: anyio.Event | None = None
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
        invocation = await self._start(self._send)
        self._ready, self._asked = anyio.Event(), anyio.Event()
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        group.start_soon(self._run_task, invocation)
        return self

    # --- The run's side ---------------------------------------------------------------

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

    async def _drive(
        self, client: str, iterator: AsyncIterator[Update], on_update: OnUpdate
    ) -> list[Update]:
        """Hand a model stream to the consumer and wait until it is over: its updates."""
        closing = self._closing
        if self._model_stream is not None:
            # A second model stream at once (a middleware that calls the model twice
            # concurrently): this one goes the callback form's way, its updates handed
            # over one by one, so neither waits for the other.
            return await closing.run(pump, client, iterator, on_update)
        stream: _ModelStream | None = None
        try:
            if closing.closed:
                raise closing.error
            stream = _ModelStream(client, iterator, on_update, anyio.current_effective_deadline())
            self._model_stream = stream
            assert self._ready is not None
            self._ready.set()
            try:
                await stream.done.wait()
            except BaseException:  # the run is cancelled: from inside the onion, or with us
                stream.finish()  # no read starts any more
                if stream.reading:  # let that read end before the stream is closed
                    stream.released = released = anyio.Event()
                    if stream.scope is not None:
                        stream.scope.cancel()
                    with anyio.CancelScope(shield=True):
                        await released.wait()
                raise
            if stream.outcome is _DEADLINE:
                # A deadline of the onion passed during a read: it cancels this task too.
                await closing.run(anyio.sleep_forever)
            if stream.outcome is not None:
                raise stream.outcome
            return stream.updates
        finally:
            if stream is not None and self._model_stream is stream:
                self._model_stream = None
            await _aclose(iterator)

    async def _send(self, update: Update) -> None:
        """The run's ``on_update``: the end of the chain the chat stack built.

        Called from the consumer's own read, the update is put aside for
        that ``__anext__`` to return. Called from the run's task, it is
        handed over: the run goes on only once the consumer asks for the
        next update, so whatever the run does next comes after the consumer
        is done with this one, and a consumer that leaves finds the run here.
        """
        if self._stepping:
            self._pending.append(update)
            return
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

    # --- The consumer's side ----------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Update]:
        return self

    async def __anext__(self) -> Update:
        if self._reading or self._ready is None:
            raise RuntimeError(
                "a stream is read by one task at a time: this one is being read"
                if self._reading
                else "iterate a stream inside its block: 'async with agent.stream(...) as "
                "stream: async for update in stream: ...'"
            )
        self._reading = True
        try:
            while True:
                pending = self._pending
                if pending:
                    update = pending.popleft()
                    self._received.append(update)
                    return update
                if self._holding:  # the run waits at its hand-over: the consumer wants more
                    self._holding = False
                    assert self._asked is not None
                    self._asked.set()
                stream = self._model_stream
                if stream is not None and not stream.finished:
                    if stream.interrupted:
                        await self._close_after_interruption(stream)
                    if stream.scoped:
                        await self._read_scoped(stream)
                    else:
                        waiting = self._step(stream)
                        if waiting is not None:
                            await self._read_on(stream, waiting)
                    continue
                if self._state != "running" and self._item is None:
                    return self._end()
                await self._ready.wait()
                self._ready = anyio.Event()
                handed = self._item
                if handed is not None:
                    self._item = None
                    self._holding = True
                    self._received.append(handed)
                    return handed
        finally:
            self._reading = False

    def _step(self, stream: _ModelStream) -> tuple[Any, Any] | None:
        """The first step of a read, with no cancel scope: most often the whole read.

        ``None`` when the read is over (an update went on, or the stream
        ended or failed); else the read waits, and the rest is
        :meth:`_read_on`'s, with what the step yielded.
        """
        pull = stream.pull()
        self._stepping = True
        try:
            yielded = stream.context.run(pull.send, None)
        except StopIteration as stop:
            if not stop.value:
                stream.finish()
            return None
        except BaseException as exc:  # the model's stream, or an on_update, failed
            stream.finish(exc)
            return None
        finally:
            self._stepping = False
        return pull, yielded

    async def _read_on(self, stream: _ModelStream, waiting: tuple[Any, Any]) -> None:
        """The rest of a read that waits (for the model), still in no cancel scope."""
        pull, yielded = waiting
        stream.reading = True
        try:
            more = await _Steps(self, stream.context, pull, yielded)
        except anyio.get_cancelled_exc_class():
            stream.interrupted = True  # see _ModelStream.interrupted
            raise
        except BaseException as exc:
            stream.finish(exc)
            return
        finally:
            stream.reading = False
            if stream.released is not None:
                stream.released.set()
        if not more:
            stream.finish()

    async def _read_scoped(self, stream: _ModelStream) -> None:
        """A read in a cancel scope with the run's deadline, which the run may cancel."""
        try:
            with anyio.CancelScope(deadline=stream.deadline) as scope:
                stream.scope, stream.reading = scope, True
                try:
                    more = await _Steps(self, stream.context, stream.pull(), _UNSTARTED)
                finally:
                    stream.scope, stream.reading = None, False
        except anyio.get_cancelled_exc_class():
            stream.interrupted = True
            raise
        except BaseException as exc:
            stream.finish(exc)
            return
        finally:
            if stream.released is not None:
                stream.released.set()
        if scope.cancelled_caught:  # the deadline passed (or the run gave up: finished)
            stream.finish(_DEADLINE)
        elif not more:
            stream.finish()

    async def _close_after_interruption(self, stream: _ModelStream) -> None:
        """A read again after a cancelled one: close the run, raise its StreamClosedError."""
        closing = self._closing
        closing.close(AgentResponse.from_updates(self._received))
        stream.finish(closing.error)
        while self._state == "running":
            assert self._ready is not None
            await self._ready.wait()
            self._ready = anyio.Event()
        error = self._error
        if error is None or error is closing.error:
            error = closing.error
            for failure in error.post_failures:  # none is lost: notes on what is raised
                error.add_note(f"raf: on the early close, {failure} (cause: {failure.__cause__!r})")
        self._error_delivered = True
        raise error

    def _end(self) -> Update:
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
            stream = self._model_stream
            if stream is not None:
                stream.finish(self._closing.error)  # the run closes the model's stream
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
