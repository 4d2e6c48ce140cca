"""HistoryProvider: the session's history in, the turn's messages back to the session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from raf._sessions.base import Session, require_pending
from raf._sessions.cold import COLD_AFTER, Cuts, checked_cold_after, keep_cuts, read_cuts
from raf._sessions.waiting import still_owed
from raf._sessions.window import (
    TokenCounter,
    checked_counter,
    client_counter,
    read_window,
    window_steps,
)
from raf._values.context import ContextResult
from raf._values.messages import AgentResponse, ChatMessage, PendingCall, ToolCall
from raf._values.options import AgentRunOptions
from raf.errors import GuardrailError, StreamClosedError

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__ = ["HistoryProvider"]


class HistoryProvider:
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
    A response that ends with calls waiting for approval is stored with
    ``session.record_pending``, which records them in the same step; tool
    results that open a response answer the previous turn's calls (a
    resumed run's decisions), so they are stored before the request
    messages (see ``docs/approvals.md``).

    ``max_messages`` and ``max_tokens`` bound what goes in to the newest
    messages of the history (a window): at most that many messages, at most
    that many tokens by ``count_tokens`` (by default the agent's client's
    ``count_tokens(messages, tools)`` when it has one, else
    :func:`raf.compression.approximate_tokens`). The window's first message stays where
    it is from turn to turn while the window fits; when it would not, the
    start jumps forward by ``step`` (in the bound's unit; by default four
    fifths of the bound), so the model provider's prompt cache still serves the
    calls in between (see ``docs/scale.md``). The start is a pure function
    of the stored history: every worker computes the same window. A message
    window is read from the store's count and tail alone, so a turn costs
    the same over 100,000 stored messages as over 1,000; a token window
    counts from the message window's start (or the first message, without
    ``max_messages``). It never splits an assistant turn's tool calls from
    their results. The session keeps everything.

    ``cold_after`` (seconds, default 300; ``None`` never; ``0`` always):
    when the session's last model call is older than that, the provider's
    prompt cache has expired and the next call is billed in full anyway, so
    the window makes now the cut it would make next (to ``bound - step``).
    The time of the last call and where the window began are kept with the
    session (every raf store), so a window moved early stays there.

    ``inject=False`` keeps the post stage but injects nothing; use it when a
    :class:`raf.CompressionProvider` decides what the model sees.
    ``persist_partial=True`` also stores a streamed turn that its consumer
    left early (:class:`raf.StreamClosedError`), or that an output guardrail
    stopped mid-answer (a :class:`raf.GuardrailError` with a ``partial``):
    the request and the partial answer the consumer saw (never the text the
    guardrail held back), each tool call left without its result answered
    as interrupted (a model would refuse a history with a call unanswered).

    >>> import anyio
    >>> from raf import Agent, EchoChatClient, InMemorySession
    >>> agent = Agent(EchoChatClient(), stack=[HistoryProvider()])
    >>> session = InMemorySession()
    >>> anyio.run(lambda: agent.run("hello", session=session)).text
    'hello'
    >>> [m.role for m in anyio.run(session.get_messages)]
    ['user', 'assistant']
    """

    #: A context provider by its shape (``on_invoking`` and ``on_invoked``), not by
    #: subclassing :class:`raf.ContextProvider`: the stores' layer knows no pipeline.
    name: str = "HistoryProvider"
    kind = "memory"
    #: It stores every turn, the calls that wait included: deferred calls need that
    #: (the agent looks for this mark, the HistoryKeeper protocol, not for the class).
    keeps_history = True

    def __init__(
        self,
        *,
        inject: bool = True,
        persist_partial: bool = False,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
        step: int | None = None,
        name: str | None = None,
        cold_after: float | None = COLD_AFTER,
    ) -> None:
        if name is not None:
            self.name = name
        self.cold_after = checked_cold_after(cold_after)
        #: session id -> the cuts its running turn's window took, kept in on_invoked.
        self._cuts: dict[str, Cuts] = {}
        self.inject = inject
        self.persist_partial = persist_partial
        self.message_step, self.token_step = window_steps(max_messages, max_tokens, step)
        self.count_tokens = checked_counter(count_tokens, "count_tokens")
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
        cuts = None
        if self.cold_after is not None and (self.max_messages or self.max_tokens):
            cuts = await read_cuts(session, f"{self.name}/")
        history = await read_window(
            session,
            self.max_messages,
            self.max_tokens,
            self.count_tokens or client_counter(agent),
            message_step=self.message_step,
            token_step=self.token_step,
            cuts=cuts,
            cold_after=self.cold_after,
        )
        if cuts is not None and cuts.keeps:
            self._cuts[session.id] = cuts
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
        """On success, append the request and every response message in one call (and,
        with a window, the time of the last model call and where the window began)."""
        cuts = self._cuts.pop(session.id, None)
        if response is not None and error is None:
            messages = response.messages
            lead = 0  # the answers to the previous turn's calls come before the request
            while lead < len(messages) and messages[lead].role == "tool":
                lead += 1
            answers = await still_owed(session, messages[:lead]) if lead else ()
            batch = (*answers, *request_messages, *messages[lead:])
            new = _new_pending(response)
            if new:
                require_pending(session, "the turn asked for calls that wait for approval")
                await session.record_pending(batch, new)
            else:
                await session.add_messages(batch)
            await keep_cuts(session, cuts)
        elif self.persist_partial and (
            type(error) is StreamClosedError
            or (isinstance(error, GuardrailError) and error.partial is not None)
        ):
            partial = answered(error.partial.messages)
            await session.add_messages((*request_messages, *partial))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} kind={self.kind!r}>"


def _new_pending(response: AgentResponse) -> tuple[PendingCall, ...]:
    """The pending calls that this response's own turns asked for (not those still waiting
    from an earlier turn, which the session recorded then)."""
    if not response.pending:
        return ()
    asked = {call.id for call in response.tool_calls}
    return tuple(p for p in response.pending if p.call.id in asked)


#: What a closed stream's unanswered call is answered with in the stored history.
INTERRUPTED = "This call was interrupted before its result came back; it may or may not have run."


def answered(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """``messages`` with every tool call answered and every tool result after its call.

    A call with no result right after its turn is answered as interrupted
    (it may have run: the model must not think it was never asked); a tool
    result that answers no call of the turn before it is dropped (in a
    resumed run, those answers are stored by the tool loop itself); a turn
    with neither text nor calls is dropped.
    """
    kept: list[ChatMessage] = []
    owed: dict[str, ToolCall] = {}  # the open turn's calls still without a result

    def close() -> None:
        kept.extend(ChatMessage.tool(c.id, INTERRUPTED, name=c.name) for c in owed.values())
        owed.clear()

    for message in messages:
        if message.role == "tool":
            if message.tool_call_id in owed:
                del owed[message.tool_call_id]
                kept.append(message)
            continue
        close()
        if message.role == "assistant" and not message.tool_calls and not message.content:
            continue
        kept.append(message)
        owed.update((call.id, call) for call in message.tool_calls)
    close()
    return tuple(kept)
