"""HistoryProvider: the session's history in, the turn's messages back to the session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from raf._builtin.window import TokenCounter, checked_window, read_window
from raf._context import ContextResult, stored_history
from raf._errors import StreamClosedError
from raf._messages import AgentResponse, ChatMessage
from raf._options import AgentRunOptions
from raf._providers import ContextProvider
from raf._sessions.base import CHECKED_SESSION_TYPES, Session

if TYPE_CHECKING:
    from raf._context import AgentLike

__all__ = ["HistoryProvider", "InMemoryHistoryProvider"]


class HistoryProvider(ContextProvider):
    """Conversation memory: what the session holds goes in, the new turn goes back.

    It works with every session store (in memory, SQLite, Redis): the
    session is where the history is kept, this provider is what reads and
    writes it. ``Agent(..., history=True)`` puts one outermost in the stack.

    Pre stage: the session's history, injected before the request messages
    (the session's snapshot is passed on as it is, so a long history costs
    no copy). Post stage, on success only: the request messages and every
    message of the response (tool calls and tool results included) are
    appended to the session in one ``add_messages`` call. A run that failed
    or was cancelled persists nothing, so the session never holds half a turn.

    ``max_messages`` and ``max_tokens`` bound what goes in to the newest
    messages of the history (a window): at most that many messages, at most
    that many tokens by ``count_tokens`` (default
    :func:`raf.approximate_tokens`). The window is read from the store's
    tail alone, so a turn costs the same over 100,000 stored messages as
    over 1,000, and it never splits an assistant turn's tool calls from
    their results. The session keeps everything.

    ``inject=False`` keeps the post stage but injects nothing; use it when a
    :class:`raf._builtin.CompressionProvider` decides what the model sees.
    ``persist_partial=True`` also stores a streamed turn that its consumer
    left early (:class:`raf.StreamClosedError`): the request and the partial
    answer the consumer saw, less any tool call left without its result (a
    model would refuse that history).

    >>> import anyio
    >>> from raf import Agent, EchoChatClient, InMemorySession
    >>> agent = Agent(EchoChatClient(), stack=[HistoryProvider()])
    >>> session = InMemorySession()
    >>> anyio.run(lambda: agent.run("hello", session=session)).text
    'hello'
    >>> [m.role for m in anyio.run(session.get_messages)]
    ['user', 'assistant']
    """

    kind = "memory"

    def __init__(
        self,
        *,
        inject: bool = True,
        persist_partial: bool = False,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
        name: str | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        self.inject = inject
        self.persist_partial = persist_partial
        self.count_tokens = checked_window(max_messages, max_tokens, count_tokens)
        self.max_messages = max_messages
        self.max_tokens = max_tokens

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
        history = await read_window(session, self.max_messages, self.max_tokens, self.count_tokens)
        if not history:
            return ContextResult()
        if type(session) in CHECKED_SESSION_TYPES:
            return stored_history(history)  # no second pass over a long history
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
        if response is not None and error is None:
            await session.add_messages((*request_messages, *response.messages))
        elif self.persist_partial and type(error) is StreamClosedError:
            partial = _answered(error.partial.messages)
            await session.add_messages((*request_messages, *partial))


def _answered(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """``messages`` without the tool calls that no tool message answers.

    A turn left with neither text nor calls is dropped. The calls of a
    closed stream's last turn may not have run: a history holding them
    would be refused by the model on the next turn.
    """
    results = {m.tool_call_id for m in messages if m.role == "tool"}
    kept: list[ChatMessage] = []
    for message in messages:
        if message.tool_calls and not all(call.id in results for call in message.tool_calls):
            calls = tuple(call for call in message.tool_calls if call.id in results)
            if not calls and not message.content:
                continue
            message = attrs.evolve(message, tool_calls=calls)
        kept.append(message)
    return tuple(kept)


#: The first name of :class:`HistoryProvider`, kept so existing code runs unchanged.
InMemoryHistoryProvider = HistoryProvider
