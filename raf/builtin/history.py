"""InMemoryHistoryProvider: the session's history in, the turn's messages back to the session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from raf.context import ContextResult
from raf.messages import AgentResponse, ChatMessage
from raf.options import AgentRunOptions
from raf.providers import ContextProvider
from raf.sessions.base import Session

if TYPE_CHECKING:
    from raf.context import AgentLike

__all__ = ["InMemoryHistoryProvider"]


class InMemoryHistoryProvider(ContextProvider):
    """Conversation memory: what the session holds goes in, the new turn goes back.

    Pre stage: the session's history, injected before the request messages
    (the session's snapshot is passed on as it is, so a long history costs
    no copy). Post stage, on success only: the request messages and every
    message of the response (tool calls and tool results included) are
    appended to the session in one ``add_messages`` call. A run that failed
    or was cancelled persists nothing, so the session never holds half a turn.

    ``inject=False`` keeps the post stage but injects nothing; use it when a
    :class:`raf.builtin.CompressionProvider` decides what the model sees.

    >>> import anyio
    >>> from raf import Agent, EchoChatClient, InMemorySession
    >>> agent = Agent(EchoChatClient(), stack=[InMemoryHistoryProvider()])
    >>> session = InMemorySession()
    >>> anyio.run(lambda: agent.run("hello", session=session)).text
    'hello'
    >>> [m.role for m in anyio.run(session.get_messages)]
    ['user', 'assistant']
    """

    kind = "memory"

    def __init__(self, *, inject: bool = True, name: str | None = None) -> None:
        if name is not None:
            self.name = name
        self.inject = inject

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """The stored history, as injected messages."""
        if not self.inject:
            return ContextResult()
        history = await session.get_messages()
        if not history:
            return ContextResult()
        return ContextResult(messages=history)

    async def on_invoked(
        self,
        agent: AgentLike | None,
        session: Session,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        """On success, append the request and every response message in one call."""
        if error is not None or response is None:
            return
        await session.add_messages((*request_messages, *response.messages))
