"""CompressionProvider and its strategies: a shorter history, tool call groups kept whole."""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from raf._agent.repair import split_by
from raf._onion.compose import ContextProvider
from raf._sessions.base import Session
from raf._sessions.cold import (
    COLD_AFTER,
    CUTS,
    Cuts,
    checked_cold_after,
    keep_cuts,
    read_cuts,
    view_start,
)
from raf._sessions.tokens import approximate_tokens, message_units
from raf._sessions.waiting import waiting_turn
from raf._sessions.window import (
    TokenCounter,
    checked_counter,
    checked_step,
    client_counter,
    low_start,
    past_results,
    read_window,
    stepped_start,
    token_start,
    whole_units,
    window_steps,
)
from raf._values.context import ContextResult
from raf._values.messages import AgentResponse, ChatMessage, checked_messages
from raf._values.options import AgentRunOptions, ChatOptions
from raf.errors import CompressionError

if TYPE_CHECKING:
    from raf._values.client import ChatClient
    from raf._values.context import AgentLike

__all__ = [
    "CompressionProvider",
    "CompressionStrategy",
    "SummaryStrategy",
    "TokenBudgetStrategy",
    "TruncationStrategy",
    "approximate_tokens",
    "check_tool_pairing",
    "message_units",
]


@runtime_checkable
class CompressionStrategy(Protocol):
    """Turns a history into a shorter one.

    The result must be well formed: every tool result follows the assistant
    turn that called it, and every tool call has its results
    (:func:`check_tool_pairing`). :func:`message_units` splits a history
    into the pieces a strategy may keep or drop.
    """

    async def compress(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]: ...


def check_tool_pairing(messages: Sequence[ChatMessage]) -> str | None:
    """``None`` if every tool call has its results and every result its call, else the problem.

    >>> from raf import ChatMessage
    >>> check_tool_pairing([ChatMessage.tool("7", "ok")])
    "messages[0] is a tool result for call '7' with no assistant tool call before it"
    """
    pending: set[str] = set()  # calls of the current calling turn still unanswered
    answerable: set[str] = set()  # every call of the current calling turn
    for index, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id not in answerable:
                return (
                    f"messages[{index}] is a tool result for call {message.tool_call_id!r} "
                    "with no assistant tool call before it"
                )
            pending.discard(message.tool_call_id or "")
            continue
        if pending:
            return f"messages[{index}] comes before the results of tool calls {sorted(pending)}"
        calls = message.tool_calls if message.role == "assistant" else ()
        answerable = {call.id for call in calls}
        pending = set(answerable)
    if pending:
        return f"the history ends before the results of tool calls {sorted(pending)}"
    return None


#: The agent's client's counter while a CompressionProvider runs its strategy: what a
#: TokenBudgetStrategy given no counter counts with (the strategy sees only messages).
_AGENT_COUNTER: ContextVar[TokenCounter] = ContextVar(
    "raf_agent_counter", default=approximate_tokens
)


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class TruncationStrategy:
    """Keep the newest messages, at most ``keep_last`` of them, cut in steps.

    The first kept message stays where it is while the history grows, until
    one more would exceed ``keep_last``; then the cut jumps forward by
    ``step`` messages (by default four fifths of ``keep_last``), so a model
    provider's prompt cache serves the calls in between. The cut is a pure
    function of the history (see :func:`raf._sessions.window.stepped_start`)
    and drops whole units only (see :func:`message_units`): a tool call
    group is kept with all its results or not at all.

    ``cold_after`` (seconds; ``None`` never): under a
    :class:`CompressionProvider`, when the session's last model call is
    older than that (the provider's cache has expired, so the next call is
    billed in full anyway), the cut due next is made now: the history is cut
    to ``keep_last - step`` messages. ``0`` treats every call as cold.

    >>> import anyio
    >>> from raf import ChatMessage
    >>> history = [ChatMessage.user(str(n)) for n in range(5)]
    >>> [m.content for m in anyio.run(TruncationStrategy(3).compress, history)]
    ['2', '3', '4']
    >>> [m.content for m in anyio.run(TruncationStrategy(3, step=3).compress, history)]
    ['3', '4']
    """

    def __init__(
        self, keep_last: int, *, step: int | None = None, cold_after: float | None = COLD_AFTER
    ) -> None:
        _check_positive("keep_last", keep_last)
        self.keep_last = keep_last
        self.step = checked_step(step, keep_last)
        self.cold_after = checked_cold_after(cold_after)

    async def compress(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """The whole units from the stepped cut on: at most ``keep_last`` messages."""
        cut = _message_cut(messages, self.keep_last, self.step, self.cold_after)
        return whole_units(messages[cut:])

    def __repr__(self) -> str:
        return f"TruncationStrategy(keep_last={self.keep_last}, step={self.step})"


def _message_cut(
    messages: Sequence[ChatMessage], bound: int, step: int, cold_after: float | None
) -> int:
    """Where a message window over ``messages`` starts, moved past tool results."""
    total = len(messages)
    start = view_start(
        "cut",
        stepped_start(total, bound, step),
        low_start(total, bound, step),
        cold_after=cold_after,
        limit=total,
    )
    return past_results(messages, start)


class TokenBudgetStrategy:
    """Keep the newest messages that fit in ``max_tokens``, cut in steps.

    ``counter`` counts one message's tokens; ``None`` (the default) counts
    with the agent's client's ``count_tokens(messages, tools)`` when it has
    one (under :class:`CompressionProvider`), else with
    :func:`approximate_tokens`, a rough estimate. The cut stays put while
    the kept messages fit and jumps forward by ``step`` tokens (by default
    four fifths of ``max_tokens``) when they would not, as
    :class:`TruncationStrategy`'s does by messages; it counts every message
    it is given, so give :class:`CompressionProvider` a ``max_messages`` to
    bound that over a long history. Whole units only. ``cold_after`` as
    :class:`TruncationStrategy`'s: a cold call cuts to ``max_tokens - step``.
    """

    def __init__(
        self,
        max_tokens: int,
        counter: TokenCounter | None = None,
        *,
        step: int | None = None,
        cold_after: float | None = COLD_AFTER,
    ) -> None:
        _check_positive("max_tokens", max_tokens)
        self.max_tokens = max_tokens
        self.counter = checked_counter(counter, "counter")
        self.step = checked_step(step, max_tokens)
        self.cold_after = checked_cold_after(cold_after)

    async def compress(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """The whole units from the stepped cut on: at most ``max_tokens`` tokens."""
        counter = self.counter or _AGENT_COUNTER.get()

        def cut(stepped: int, due_next: int, limit: int) -> int:
            return view_start("cut", stepped, due_next, cold_after=self.cold_after, limit=limit)

        start = token_start(messages, self.max_tokens, self.step, counter, cut)
        return whole_units(messages[past_results(messages, start) :])

    def __repr__(self) -> str:
        return f"TokenBudgetStrategy(max_tokens={self.max_tokens}, step={self.step})"


DEFAULT_SUMMARY_PROMPT = (
    "You compress conversations. Summarise the conversation below for the assistant "
    "that will continue it: keep the facts, names, numbers, decisions, open questions and "
    "what tools returned that still matters. Write plain prose, at most 200 words, "
    "and nothing but the summary."
)


class SummaryStrategy:
    """Summarise everything before the newest ``keep_last`` messages into one message.

    The kept messages are :class:`TruncationStrategy`'s (``keep_last`` and
    ``step``): their first one stays put while the history grows, then
    jumps forward by ``step``. The older messages (whole units, see
    :func:`message_units`) go to ``chat_client`` with ``prompt``; its answer
    becomes one system message ``"Summary of the earlier conversation:
    ..."`` in front of the kept messages. The summary is remembered with
    the messages it covers, so it is made again only when the cut moves
    (once per ``step`` messages, not every turn), and then it extends the
    last one instead of reading everything again. A new strategy object (a
    new process) summarises once before it can reuse.

    If the summary call fails or answers nothing, ``on_failure="truncate"``
    (the default) returns just the kept messages, as
    :class:`TruncationStrategy` would; ``on_failure="raise"`` raises
    :class:`raf.errors.CompressionError`, which fails the run before the
    model is called. A broken history is never returned. ``cold_after`` as
    :class:`TruncationStrategy`'s: a cold call summarises now what the next
    step would.
    """

    def __init__(
        self,
        chat_client: ChatClient,
        keep_last: int,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        *,
        on_failure: Literal["truncate", "raise"] = "truncate",
        options: ChatOptions | None = None,
        step: int | None = None,
        cold_after: float | None = COLD_AFTER,
    ) -> None:
        _check_positive("keep_last", keep_last)
        self.cold_after = checked_cold_after(cold_after)
        if not callable(getattr(chat_client, "complete", None)):
            raise TypeError(f"chat_client must have an async complete() method: {chat_client!r}")
        if on_failure not in ("truncate", "raise"):
            raise ValueError(f"on_failure must be 'truncate' or 'raise', got {on_failure!r}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty str")
        self.chat_client = chat_client
        self.keep_last = keep_last
        self.step = checked_step(step, keep_last)
        self.prompt = prompt
        self.on_failure = on_failure
        self.options = options if options is not None else ChatOptions()
        self._last: tuple[tuple[ChatMessage, ...], str] | None = None

    async def compress(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """A summary of the older messages, then the newest ``keep_last``."""
        start = _message_cut(messages, self.keep_last, self.step, self.cold_after)
        kept = whole_units(messages[start:])
        older = whole_units(messages[:start])
        if not older:
            return kept
        try:
            summary = await self._summary(older)
        except Exception as exc:
            if self.on_failure == "raise":
                raise CompressionError(
                    f"SummaryStrategy: the summary call failed ({type(exc).__name__}: {exc}); "
                    "nothing was sent to the model"
                ) from exc
            return kept
        note = ChatMessage.system(f"Summary of the earlier conversation: {summary}")
        return (note, *kept)

    async def _summary(self, older: tuple[ChatMessage, ...]) -> str:
        previous = self._last
        if previous is not None and older[: len(previous[0])] == previous[0]:
            if len(older) == len(previous[0]):
                return previous[1]
            transcript = f"Summary so far: {previous[1]}\n\nWhat followed:\n" + _transcript(
                older[len(previous[0]) :]
            )
        else:
            transcript = _transcript(older)
        request = (ChatMessage.system(self.prompt), ChatMessage.user(transcript))
        response = await self.chat_client.complete(request, self.options)
        text = response.text.strip()
        if not text:
            raise CompressionError("the summary call answered with no text")
        self._last = (older, text)
        return text

    def __repr__(self) -> str:
        return f"SummaryStrategy(keep_last={self.keep_last}, on_failure={self.on_failure!r})"


def _transcript(messages: Sequence[ChatMessage]) -> str:
    lines: list[str] = []
    for message in messages:
        if message.role == "tool":
            lines.append(f"tool {message.name or message.tool_call_id} returned: {message.content}")
            continue
        if message.content:
            lines.append(f"{message.role}: {message.content}")
        for call in message.tool_calls:
            lines.append(f"{message.role} called tool {call.name} with {call.arguments}")
    return "\n".join(lines)


class CompressionProvider(ContextProvider):
    """Load the session's history, compress it with ``strategy``, and make it what the model sees.

    The result has ``replace_messages=True``: it replaces every message
    injected by providers registered before it. Place it after (inside) an
    :class:`raf.HistoryProvider`, which still saves each turn
    in full; give that one ``inject=False`` to skip an injection that would
    be replaced anyway. The session keeps the whole history; only what the
    model sees is compressed. A strategy result that splits a tool call from
    its results is refused with :class:`raf.errors.CompressionError`; a
    history broken before the strategy saw it (a crash between a call and its
    result, an import) is no error: the core repairs what it sends.

    ``max_messages``, ``max_tokens``, ``count_tokens`` and ``step`` bound
    what is loaded, as :class:`raf.HistoryProvider`'s window does (in
    steps): only the newest messages are read from the store and
    compressed. A :class:`TokenBudgetStrategy` given no counter counts with
    the agent's client, as the window does.

    ``cold_after`` (seconds, default 300; ``None`` never; ``0`` always):
    when the session's last model call is older than that, the provider's
    prompt cache has expired, so this window makes now the cut it would make
    next (to ``bound - step``); the strategy's own ``cold_after`` decides for
    the strategy. The time of the last call, and where each of its views
    started (a view moved early stays there on the warm calls that follow),
    are kept with the session (``last_model_call()``,
    ``record_model_call()``: every raf store has them).
    """

    kind = "compression"

    def __init__(
        self,
        strategy: CompressionStrategy,
        *,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        count_tokens: TokenCounter | None = None,
        step: int | None = None,
        name: str | None = None,
        cold_after: float | None = COLD_AFTER,
    ) -> None:
        if not callable(getattr(strategy, "compress", None)):
            raise TypeError(
                f"strategy must have an async compress(messages) method, got {strategy!r}"
            )
        if name is not None:
            self.name = name
        self.strategy = strategy
        self.message_step, self.token_step = window_steps(max_messages, max_tokens, step)
        self.count_tokens = checked_counter(count_tokens, "count_tokens")
        self.max_messages = max_messages
        self.max_tokens = max_tokens
        self.cold_after = checked_cold_after(cold_after)
        #: session id -> the cuts its running turn took, kept with it in on_invoked.
        self._cuts: dict[str, Cuts] = {}

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """The compressed history, replacing whatever was injected before."""
        counter = client_counter(agent)
        # The session's record is read only when a view may cut early.
        cuts = Cuts(None, {}, keeps=False)
        if (self.cold_after is not None and (self.max_messages or self.max_tokens)) or getattr(
            self.strategy, "cold_after", None
        ) is not None:
            cuts = await read_cuts(session, f"{self.name}/")
        history = await read_window(
            session,
            self.max_messages,
            self.max_tokens,
            self.count_tokens or counter,
            message_step=self.message_step,
            token_step=self.token_step,
            cuts=cuts,
            cold_after=self.cold_after,
        )
        # A last turn whose calls wait for approval (or lost their result) is kept out of
        # compression and put back after it, so the run can answer its calls in place.
        waiting = waiting_turn(history)
        if waiting:
            history = history[: -len(waiting)]
        token, cut_token = _AGENT_COUNTER.set(counter), CUTS.set(cuts)
        try:
            compressed = await self.strategy.compress(history)
        finally:
            CUTS.reset(cut_token)
            _AGENT_COUNTER.reset(token)
        if cuts.keeps:
            self._cuts[session.id] = cuts
        try:
            compressed = checked_messages(compressed, "compress() result")
        except TypeError as exc:
            raise CompressionError(f"{self.strategy!r} returned {exc}") from None
        problem = check_tool_pairing(compressed)
        # A history broken before (a crash, an import) is the core's repair's to mend; a
        # split the strategy made itself is its error, named.
        split = None if problem is None else split_by(history, compressed)
        if split is not None:
            raise CompressionError(
                f"{self.strategy!r} returned a broken history: {problem} ({split})"
            )
        return ContextResult(messages=(*compressed, *waiting), replace_messages=True)

    async def on_invoked(
        self,
        agent: AgentLike | None,
        session: Session,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        """Keep with the session the time of its last model call and where the views began."""
        cuts = self._cuts.pop(session.id, None)
        if response is not None:
            await keep_cuts(session, cuts)
