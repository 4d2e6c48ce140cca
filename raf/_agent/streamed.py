"""A streamed run's model calls: the model's stream into ``on_update``, and the early close.

A streamed run is the same onion as any other: the updates go out through
``Invocation.on_update`` (ASGI's ``send``) while every layer stays a plain
await in the run's task. What streaming adds is the early close, held by the
run's own :class:`raf.Run`: the consumer leaves before the end
(``run.close(partial)``), the run's core (its tool loop, entered through
``run.core``) is cancelled and comes out as ``StreamClosedError(partial)``,
which the provider layers then see as the run's error. The iterator form
(``raf._agent.streaming.AgentStream``) closes its run this way when its block is
left early; a callback-form caller (``raf.serve``) hands its own ``Run`` in as
``agent.run(on_update=run)`` and closes it when its client leaves.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from raf._values.assembly import Assembly
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate, Update
from raf._values.options import ChatOptions
from raf._values.run import Run

__all__: list[str] = []


async def stream_model(
    client: Any,
    messages: Sequence[ChatMessage],
    options: ChatOptions,
    on_update: OnUpdate,
    run: Run | None = None,
) -> AgentResponse:
    """One model call of a streamed run: each update to ``on_update``, then the response.

    Uses ``client.stream`` when the client has one (the response is what
    the updates assemble to), else ``client.complete`` (its answer is then
    sent as updates). The early close of ``run`` (the run the call belongs
    to) comes out as its ``StreamClosedError``, so the chat middleware see
    that rather than a cancellation.
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
        if run is not None and run.closed is not None:
            raise run.closed from None
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
