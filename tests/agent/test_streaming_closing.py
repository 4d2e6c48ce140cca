"""The early close of a callback-form run (``Closing``), as ``raf.serve`` uses it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    EchoChatClient,
    StreamClosedError,
    Update,
)
from raf._agent.streamed import Closing

pytestmark = pytest.mark.anyio


class Endless:
    """A model that streams a word every millisecond, for ever."""

    async def complete(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        raise NotImplementedError

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        while True:
            yield Update.of_text("word ")
            await anyio.sleep(0.001)


class Journal(ContextProvider):
    """Records the error its post stage got; its awaits must work (not under cancellation)."""

    def __init__(self) -> None:
        self.errors: list[BaseException | None] = []

    async def on_invoked(
        self, agent: Any, session: Any, request: Any, response: Any, error: Any
    ) -> None:
        await anyio.sleep(0.001)  # raises at once under a cancellation
        self.errors.append(error)


async def test_closing_a_callback_form_run_is_an_early_close_with_the_partial(
    anyio_backend: str,
) -> None:
    journal = Journal()
    agent = Agent(Endless(), stack=[journal])
    sent: list[Update] = []

    async def on_update(update: Update) -> None:
        sent.append(update)
        if len(sent) == 3:  # as raf.serve's watcher does, from wherever the run is
            closing.close(AgentResponse.from_updates(sent))

    with anyio.fail_after(10), Closing() as closing, pytest.raises(StreamClosedError) as raised:
        await agent.run("go", on_update=on_update)
    assert raised.value is closing.closed
    assert raised.value.partial.text == "word word word "
    assert journal.errors == [raised.value]
    closing.close(AgentResponse())  # once only: the first close stands
    assert closing.closed is raised.value


async def test_a_run_closed_before_its_core_or_after_it(anyio_backend: str) -> None:
    agent = Agent(EchoChatClient())

    async def ignore(update: Update) -> None:
        pass

    with Closing() as closing:
        closing.close(AgentResponse())
        with pytest.raises(StreamClosedError):
            await agent.run("hi there", on_update=ignore)
    with Closing() as closing:  # the core done: the run completed
        response = await agent.run("hi there", on_update=ignore)
        closing.close(AgentResponse())
    assert response.text == "hi there"
    # Left, the Closing is no run's: a later run is not closed.
    assert (await agent.run("hi", on_update=ignore)).text == "hi"
