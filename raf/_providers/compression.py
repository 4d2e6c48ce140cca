"""CompressionProvider and its strategies: a shorter history, tool call groups kept whole."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from raf._agent.approvals import unanswered_tail
from raf._errors import CompressionError
from raf._onion.compose import ContextProvider
from raf._providers.tokens import Unit, approximate_tokens, message_units
from raf._providers.window import checked_window, read_window
from raf._sessions.base import Session
from raf._values.context import ContextResult
from raf._values.messages import ChatMessage, checked_messages
from raf._values.options import AgentRunOptions, ChatOptions

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


def _flatten(units: Sequence[Unit]) -> tuple[ChatMessage, ...]:
    return tuple(message for unit in units for message in unit)


def _units_from_the_end(messages: Sequence[ChatMessage]) -> Iterator[Unit]:
    """The units of :func:`message_units`, newest first, read lazily from the end.

    Units are delimited by the messages that are not tool results, so
    reading backwards finds the same units: a run of tool results belongs
    to the calling turn just before it, or is dropped with it.
    """
    results: list[ChatMessage] = []
    for message in reversed(messages):
        if message.role == "tool":
            results.append(message)
            continue
        if message.role == "assistant" and message.tool_calls:
            wanted = {call.id for call in message.tool_calls}
            answers = [r for r in reversed(results) if r.tool_call_id in wanted]
            if wanted <= {answer.tool_call_id for answer in answers}:
                yield (message, *answers)
        else:
            yield (message,)
        results = []  # results after a turn that does not call tools are orphans


def _newest(
    messages: Sequence[ChatMessage], budget: int, cost: Callable[[Unit], int]
) -> tuple[ChatMessage, ...]:
    """The longest run of newest whole units whose total cost fits ``budget``.

    Reads from the end and stops at the first unit that does not fit, so a
    turn costs what is kept, not the length of the stored history.
    """
    kept: list[Unit] = []
    spent = 0
    for unit in _units_from_the_end(messages):
        spent += cost(unit)
        if spent > budget:
            break
        kept.append(unit)
    kept.reverse()
    return _flatten(kept)


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class TruncationStrategy:
    """Keep the newest messages, at most ``keep_last`` of them.

    Drops whole units (see :func:`message_units`): the result is the longest
    run of newest units whose message count fits, so a tool call group is
    kept with all its results or not at all.

    >>> import anyio
    >>> history = [ChatMessage.user(str(n)) for n in range(5)]
    >>> [m.content for m in anyio.run(TruncationStrategy(2).compress, history)]
    ['3', '4']
    """

    def __init__(self, keep_last: int) -> None:
        _check_positive("keep_last", keep_last)
        self.keep_last = keep_last

    async def compress(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """The newest whole units, at most ``keep_last`` messages."""
        return _newest(messages, self.keep_last, len)

    def __repr__(self) -> str:
        return f"TruncationStrategy(keep_last={self.keep_last})"


class TokenBudgetStrategy:
    """Keep the newest messages that fit in ``max_tokens``.

    ``counter`` counts one message's tokens; the default,
    :func:`approximate_tokens`, is a rough estimate. Pass a real tokenizer's
    count for precision. Whole units only, like :class:`TruncationStrategy`.
    """

    def __init__(
        self, max_tokens: int, counter: Callable[[ChatMessage], int] = approximate_tokens
    ) -> None:
        _check_positive("max_tokens", max_tokens)
        if not callable(counter):
            raise TypeError(f"counter must be a function of a ChatMessage, got {counter!r}")
        self.max_tokens = max_tokens
        self.counter = counter

    async def compress(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """The newest whole units whose tokens add up to at most ``max_tokens``."""
        counter = self.counter

        def cost(unit: Unit) -> int:
            return sum(counter(message) for message in unit)

        return _newest(messages, self.max_tokens, cost)

    def __repr__(self) -> str:
        return f"TokenBudgetStrategy(max_tokens={self.max_tokens})"


DEFAULT_SUMMARY_PROMPT = (
    "You compress conversations. Summarise the conversation below for the assistant "
    "that will continue it: keep the facts, names, numbers, decisions, open questions and "
    "what tools returned that still matters. Write plain prose, at most 200 words, "
    "and nothing but the summary."
)


class SummaryStrategy:
    """Summarise everything but the newest ``keep_last`` messages into one message.

    The older messages (whole units, see :func:`message_units`) go to
    ``chat_client`` with ``prompt``; its answer becomes one system message
    ``"Summary of the earlier conversation: ..."`` in front of the kept
    messages. The last summary is remembered: when the history has only
    grown, the next summary extends it instead of reading everything again.

    If the summary call fails or answers nothing, ``on_failure="truncate"``
    (the default) returns just the kept messages, as
    :class:`TruncationStrategy` would; ``on_failure="raise"`` raises
    :class:`raf.CompressionError`, which fails the run before the
    model is called. A broken history is never returned.
    """

    def __init__(
        self,
        chat_client: ChatClient,
        keep_last: int,
        prompt: str = DEFAULT_SUMMARY_PROMPT,
        *,
        on_failure: Literal["truncate", "raise"] = "truncate",
        options: ChatOptions | None = None,
    ) -> None:
        _check_positive("keep_last", keep_last)
        if not callable(getattr(chat_client, "complete", None)):
            raise TypeError(f"chat_client must have an async complete() method: {chat_client!r}")
        if on_failure not in ("truncate", "raise"):
            raise ValueError(f"on_failure must be 'truncate' or 'raise', got {on_failure!r}")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty str")
        self.chat_client = chat_client
        self.keep_last = keep_last
        self.prompt = prompt
        self.on_failure = on_failure
        self.options = options if options is not None else ChatOptions()
        self._last: tuple[tuple[ChatMessage, ...], str] | None = None

    async def compress(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """A summary of the older messages, then the newest ``keep_last``."""
        units = message_units(messages)
        start, spent = len(units), 0
        while start > 0 and spent + len(units[start - 1]) <= self.keep_last:
            spent += len(units[start - 1])
            start -= 1
        kept = _flatten(units[start:])
        if start == 0:
            return kept
        older = tuple(_flatten(units[:start]))
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
    its results is refused with :class:`raf.CompressionError`.

    ``max_messages``, ``max_tokens`` and ``count_tokens`` bound what is
    loaded, as :class:`raf.HistoryProvider`'s window does: only the newest
    messages are read from the store and compressed.
    """

    kind = "compression"

    def __init__(
        self,
        strategy: CompressionStrategy,
        *,
        max_messages: int | None = None,
        max_tokens: int | None = None,
        count_tokens: Callable[[ChatMessage], int] | None = None,
        name: str | None = None,
    ) -> None:
        if not callable(getattr(strategy, "compress", None)):
            raise TypeError(
                f"strategy must have an async compress(messages) method, got {strategy!r}"
            )
        if name is not None:
            self.name = name
        self.strategy = strategy
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
        """The compressed history, replacing whatever was injected before."""
        history = await read_window(session, self.max_messages, self.max_tokens, self.count_tokens)
        # A last turn whose calls wait for approval (or lost their result) is kept out of
        # compression and put back after it, so the run can answer its calls in place.
        waiting = _waiting_turn(history)
        if waiting:
            history = history[: -len(waiting)]
        compressed = await self.strategy.compress(history)
        try:
            compressed = checked_messages(compressed, "compress() result")
        except TypeError as exc:
            raise CompressionError(f"{self.strategy!r} returned {exc}") from None
        problem = check_tool_pairing(compressed)
        if problem is not None:
            raise CompressionError(f"{self.strategy!r} returned a broken history: {problem}")
        return ContextResult(messages=(*compressed, *waiting), replace_messages=True)


def _waiting_turn(history: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The last calling turn and its results, when one of its calls has no result yet."""
    turn, gap = unanswered_tail(history)
    if turn is None or not gap:
        return ()
    start = len(history) - 1
    while history[start] is not turn:
        start -= 1
    return tuple(history[start:])
