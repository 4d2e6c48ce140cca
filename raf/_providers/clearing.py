"""ClearToolResults: older tool results replaced by a short placeholder, in batches."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence

import attrs

from raf._providers.compression import _AGENT_COUNTER
from raf._sessions.cold import COLD_AFTER, checked_cold_after, view_start
from raf._sessions.window import TokenCounter, checked_counter
from raf._values.messages import ChatMessage
from raf._values.placeholders import cleared_text
from raf._values.spill import parse_cut

__all__ = ["ClearToolResults"]

#: How a placeholder says to read a spilled result back, or ``None`` for a result that
#: was not spilled. ToolOutputLimit (issue 42, item 1) keeps the full text of a result it
#: reduced with the session; the lead joins its read_tool_result here.
ReadBack = Callable[[ChatMessage], "str | None"]


def spilled_read_back(message: ChatMessage) -> str | None:
    """How to read back the full text of a result :class:`raf.ToolOutputLimit` cut and
    kept with the session (its marker names the call); ``None`` for any other result.

    The placeholder keeps the ``read_tool_result`` call in its text, so the agent
    goes on offering the read tool while the placeholder is in view.
    """
    cut = parse_cut(message.content)
    if cut is None or cut.call_id is None:
        return None
    return (
        f"its full text ({cut.total:,} characters) is kept: "
        f"read_tool_result(call_id={json.dumps(cut.call_id)})"
    )


class ClearToolResults:
    """Replace the results of older tool calls with a short placeholder, in batches.

    A compression strategy (for :class:`raf.CompressionProvider`): every
    tool result but the newest ``keep_last`` is replaced by a placeholder
    that names the tool, the call and the size the result had (and, for a
    result kept in full with the session, how to read it back). Nothing is
    dropped: each call keeps its result message, so a call and its result
    are never split; every other message is kept as it is. A result of a
    tool named in ``exclude`` is never cleared.

    Clearing rewrites the middle of the prompt, so the provider's cache
    serves nothing after the first cleared result: it moves in batches. The
    results are cleared oldest first, only when at least ``clear_at_least``
    tokens of results (by ``counter``; by default the agent's client's
    count, else :func:`raf.compression.approximate_tokens`) can go at once;
    between batches every call extends the previous one. Which results are
    cleared is a pure function of the history: every process agrees. The
    default batch, 8,000 tokens, is where ``benchmarks/bench_cache_peers.py``
    finds clearing on its frontier: with tool results of 3,000 to 12,000
    characters, batches of 2,000 tokens break the prefix three times as often
    and bill more for less context.

    ``cold_after`` (seconds; ``None`` never; ``0`` always): under a
    :class:`raf.CompressionProvider`, when the session's last model call is
    older than that (the cache has expired: the next call is billed in full
    anyway), every result but the newest ``keep_last`` is cleared now.

    >>> import anyio
    >>> from raf import ChatMessage, ToolCall
    >>> call = ChatMessage.assistant(tool_calls=[ToolCall("c1", "search", "{}")])
    >>> history = [call, ChatMessage.tool("c1", "x" * 9000), ChatMessage.user("thanks")]
    >>> cleared = anyio.run(ClearToolResults(keep_last=0, clear_at_least=0).compress, history)
    >>> cleared[1].content
    '[tool result cleared: search, call c1, 9000 characters]'
    """

    def __init__(
        self,
        keep_last: int = 3,
        *,
        clear_at_least: int = 8000,
        exclude: Iterable[str] = (),
        cold_after: float | None = COLD_AFTER,
        counter: TokenCounter | None = None,
        read_back: ReadBack = spilled_read_back,
    ) -> None:
        if type(keep_last) is not int or keep_last < 0:
            raise ValueError(
                f"keep_last must be an int >= 0 (how many of the newest tool results stay "
                f"whole), got {keep_last!r}; write e.g. ClearToolResults(keep_last=3)"
            )
        if type(clear_at_least) is not int or clear_at_least < 0:
            raise ValueError(
                f"clear_at_least must be an int >= 0 (tokens cleared at once), got "
                f"{clear_at_least!r}; write e.g. clear_at_least=2000, or 0 to clear every call"
            )
        if isinstance(exclude, str):
            raise TypeError(
                f"exclude must be an iterable of tool names, got the str {exclude!r}; "
                f"write exclude=({exclude!r},)"
            )
        names = tuple(exclude)
        for name in names:
            if type(name) is not str:
                raise TypeError(f"exclude must hold tool names (str), got {name!r}")
        self.keep_last = keep_last
        self.clear_at_least = clear_at_least
        self.exclude = frozenset(names)
        self.cold_after = checked_cold_after(cold_after)
        self.counter = checked_counter(counter, "counter")
        if not callable(read_back):
            raise TypeError(f"read_back must be callable(message) -> str | None: {read_back!r}")
        self.read_back = read_back

    async def compress(self, messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
        """``messages`` with the older results cleared (see the class)."""
        names = _tool_names(messages)
        results = [i for i, m in enumerate(messages) if m.role == "tool"]
        eligible = results[: max(0, len(results) - self.keep_last)]
        candidates = [
            i
            for i in eligible
            if names.get(messages[i].tool_call_id or "", messages[i].name) not in self.exclude
        ]
        if not candidates:
            return tuple(messages)
        count = self.counter or _AGENT_COUNTER.get()
        # The boundary: every candidate before it is cleared. It moves to just past a
        # candidate once the candidates since the last move weigh clear_at_least tokens.
        boundary, weight = 0, 0
        for index in candidates:
            weight += count(messages[index])
            if weight >= self.clear_at_least:
                boundary, weight = index + 1, 0
        everything = candidates[-1] + 1  # the cut due next: every candidate
        boundary = view_start(
            "cleared", boundary, everything, cold_after=self.cold_after, limit=len(messages)
        )
        out = list(messages)
        for index in candidates:
            if index >= boundary:
                break
            out[index] = self._placeholder(messages[index], names)
        return tuple(out)

    def _placeholder(self, message: ChatMessage, names: dict[str, str | None]) -> ChatMessage:
        call_id = message.tool_call_id or ""
        name = names.get(call_id) or message.name or "a tool"
        text = cleared_text(name, call_id, len(message.content or ""), self.read_back(message))
        return attrs.evolve(message, content=text)

    def __repr__(self) -> str:
        return (
            f"ClearToolResults(keep_last={self.keep_last}, clear_at_least={self.clear_at_least}, "
            f"exclude={sorted(self.exclude)!r}, cold_after={self.cold_after!r})"
        )


def _tool_names(messages: Sequence[ChatMessage]) -> dict[str, str | None]:
    """call id -> the name of the tool it called."""
    return {call.id: call.name for m in messages for call in m.tool_calls}
