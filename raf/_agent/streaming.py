"""The iterator form of a streamed run: ``async with agent.stream(...)``.

:class:`AgentStream` is two tasks and one rendezvous. The run's task runs
the whole onion and reads its own model stream, as the callback form does;
its ``on_update`` chain ends at the one hand-over point
(:meth:`AgentStream._send`): a zero-buffer anyio memory object stream, whose
``send`` returns once the consumer's task took the update, and an event per
update that the consumer sets when it asks for the next one. The consumer's
code runs in its own task, under none of the onion's cancel scopes. Leaving
the block early is an early close of the run's own :class:`raf.Run`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio

from raf._onion.errors import settle
from raf._values.assembly import Assembly
from raf._values.messages import AgentResponse, Update
from raf._values.run import Run
from raf.errors import ProviderError

if TYPE_CHECKING:  # these load typing_extensions: not at import time
    from anyio.abc import TaskGroup
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

__all__ = ["AgentStream"]


class AgentStream:
    """The iterator form of a streamed run: ``async with agent.stream(...) as stream``.

    Iterate it for the :class:`raf.Update` objects as they come; afterwards
    :attr:`response` is the run's :class:`raf.AgentResponse`, or ``None``
    if the run did not complete. The run goes in one task that the
    ``async with`` owns; each update is handed over, and the run waits
    until the consumer asks for the next one. An error of the run is
    raised from the iteration, unchanged.

    A read that is cancelled (``move_on_after`` around one ``__anext__``)
    loses nothing: the next read gets the update. Leaving the ``async
    with`` before the end (``break``, ``return``, an exception) is an early
    close: the run's model stream and tools are cancelled, then every
    entered provider gets its post stage with a :class:`raf.StreamClosedError`,
    not under cancellation and each bounded by ``post_timeout``; the block
    exits once they all ran, raising a failed one as the innermost
    :class:`raf.ProviderError` (or as a note on the consumer's own
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

    def __init__(
        self,
        start: Callable[[Run], Awaitable[Any]],
        go: Callable[[Any], Awaitable[AgentResponse]],
    ) -> None:
        # start(run) makes the run's request (the request hash included); go runs it.
        self._start = start
        self._go = go
        self._group: TaskGroup | None = None  # the run's task, once entered
        self._done = False  # the run is over
        self._response: AgentResponse | None = None
        self._error: BaseException | None = None  # the run's, until the consumer saw it
        self._cancelled: BaseException | None = None
        self._run = Run(self._send)  # the run's own object: its sink ends at the hand-over
        self._received = Assembly()  # what the consumer got: the pieces, not the updates
        self._reading = False  # an __anext__ is under way
        # The hand-over, made on entering: a zero-buffer stream of (update, asked); the run
        # then waits for ``asked``, which the consumer sets when it asks for the next update
        # (or leaves). ``_asked``: the one of the update the consumer holds.
        self._outbox: MemoryObjectSendStream[tuple[Update, anyio.Event]]
        self._inbox: MemoryObjectReceiveStream[tuple[Update, anyio.Event]]
        self._asked: anyio.Event | None = None

    @property
    def response(self) -> AgentResponse | None:
        """The run's response once it completed; ``None`` before, or if it did not."""
        return self._response

    async def __aenter__(self) -> AgentStream:
        if self._group is not None:
            raise RuntimeError("an agent.stream(...) can be entered only once: call it again")
        invocation = await self._start(self._run)
        self._outbox, self._inbox = anyio.create_memory_object_stream[tuple[Update, anyio.Event]](0)
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        group.start_soon(self._run_task, invocation)
        return self

    async def _run_task(self, invocation: Any) -> None:
        """The run, in its own task: never raises (but for its cancellation)."""
        with self._outbox:  # closed when the run is over: the consumer's read then ends
            try:
                self._response = await self._go(invocation)
            except BaseException as exc:
                if isinstance(exc, anyio.get_cancelled_exc_class()):
                    self._cancelled = exc  # its notes (failed post stages) go to the consumer's
                    raise
                self._error = exc  # for the consumer: never into the group, which would wrap it
            finally:
                self._done = True

    async def _send(self, update: Update) -> None:
        """The run's sink, the end of the ``on_update`` chain: hand ``update`` over.

        Returns once the consumer took it and asks for the next one, so the
        run is never ahead of the consumer and a consumer that leaves finds
        the run here. After an early close, :meth:`raf.Run.send` raises its
        ``StreamClosedError``.
        """
        asked = anyio.Event()
        try:
            await self._outbox.send((update, asked))
            await asked.wait()
        except anyio.BrokenResourceError:
            pass  # not taken: the consumer left (an early close, which the run raises)

    def _close(self) -> None:
        """An early close: stop the run's in-flight work; what comes next fails."""
        self._run.close(self._received.response())
        # The run's core is cancelled; an update outside it (a run middleware's) is let go.
        if self._asked is not None:
            self._asked.set()
        self._inbox.close()

    def __aiter__(self) -> AsyncIterator[Update]:
        return self

    async def __anext__(self) -> Update:
        if self._reading or self._group is None:
            raise RuntimeError(
                "a stream is read by one task at a time: this one is being read"
                if self._reading
                else "iterate a stream inside its block: 'async with agent.stream(...) as "
                "stream: async for update in stream: ...'"
            )
        self._reading = True
        try:
            if self._asked is not None:  # the run waits at the hand-over: it may go on
                self._asked.set()
                self._asked = None
            try:
                # Cancelled here, the read loses nothing: anyio hands no item to a receiver
                # whose cancellation is pending; the update waits for the next read.
                update, self._asked = await self._inbox.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                pass  # the run is over (or the block was left)
            else:
                self._received.add(update)
                return update
        finally:
            self._reading = False
        error, self._error = self._error, None
        if error is not None:
            raise error  # once, as it is: its __cause__ and __context__ untouched
        raise StopAsyncIteration

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._group is not None
        with self._inbox:
            return await self._exit(self._group, exc_type, exc, tb)

    async def _exit(
        self,
        group: TaskGroup,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        if not self._done and not cancelled:
            self._close()
        if not cancelled:
            try:
                # The consumer's own exception never enters the task group (which would
                # wrap it). A cancellation that arrives while the post stages run wins once
                # they have all run, with their failures as notes (level-triggered: ask).
                await group.__aexit__(None, None, None)
                await anyio.lowlevel.checkpoint_if_cancelled()
            except BaseException as propagated:
                unseen = self._unseen()
                if unseen is not None:
                    _note(propagated, unseen)
                raise
            unseen = self._unseen()
            if unseen is not None and exc is None:
                raise unseen
            if unseen is not None and exc is not None:
                _note(exc, unseen)  # the consumer's own exception wins
            return None
        # The consumer is being cancelled: the group cancels the run, whose post stages
        # run shielded and bounded; the cancellation propagates as it is, with notes.
        assert exc is not None
        try:
            return await group.__aexit__(exc_type, exc, tb)
        except BaseException as propagated:  # the backend may raise a new cancellation
            exc = propagated
            raise
        finally:
            run = self._cancelled
            if run is not None and run is not exc:
                for note in getattr(run, "__notes__", ()):
                    exc.add_note(note)  # the failed post stages
            unseen = self._unseen()
            if unseen is not None:
                _note(exc, unseen)

    def _unseen(self) -> BaseException | None:
        """What the run raised that the consumer did not see: nothing is swallowed.

        After an early close, that is the post stages that failed: the
        innermost :class:`raf.ProviderError`, the others as notes on it.
        """
        error, self._error = self._error, None
        closed = self._run.closed
        if closed is None or error is not closed:
            return error
        try:
            settle(self._run.failures, None)  # the consumer left: as after a successful run
        except ProviderError as failure:
            return failure
        return None


def _note(exc: BaseException, unseen: BaseException) -> None:
    exc.add_note(f"raf: the streamed run failed too: {type(unseen).__name__}: {unseen}")
    for note in getattr(unseen, "__notes__", ()):
        exc.add_note(note)
