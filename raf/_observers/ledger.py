"""ContextLedger: what each layer put in each model call's prompt, and which one broke the cache.

Providers bill a prompt prefix they have already seen at a fraction of the
price, so a call's cost depends on how far it extends the previous one. The
ledger cuts each prompt into the parts raf assembled (tools, system message,
history, tail, request, the tool loop's turns, each by the layer that
contributed it), counts their tokens, and compares the prompt with the
previous call of the same session.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Literal

import attrs

from raf._onion.observe import Observer
from raf._values.context import ChatRequest, Invocation, Segments
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.placeholders import is_cleared
from raf._values.protocols import Tool
from raf._values.tokens import approximate_prompt_tokens

__all__ = ["ContextLedger", "LedgerEntry", "LedgerPart"]

Region = Literal["tools", "system", "history", "tail", "request", "loop"]
#: Counts the tokens of a prompt: ``(messages, tools) -> int``.
PromptCounter = Callable[[Sequence[ChatMessage], Sequence[Tool]], int]

#: The regions a provider expects to change from call to call: a prompt that differs
#: from the previous one only from here on has not broken the cache.
_REGIONS: tuple[Region, ...] = ("tools", "system", "history", "tail", "request", "loop")
_MOVING: frozenset[str] = frozenset({"tail", "request", "loop"})


@attrs.frozen(slots=True)
class LedgerPart:
    """One layer's tokens in one region of a prompt.

    ``layer`` is a provider's name, ``"agent"``, ``"request"`` or
    ``"tool loop"``; ``region`` one of ``"tools"``, ``"system"``,
    ``"history"``, ``"tail"``, ``"request"``, ``"loop"``.
    """

    layer: str
    region: Region
    tokens: int


@attrs.frozen(slots=True)
class LedgerEntry:
    """One model call, as the ledger saw it.

    ``input_tokens`` is raf's count of the whole prompt (with ``counted_by``:
    an encoding such as ``"o200k_base"``, or ``"approximate"``) and the sum
    of ``parts``, which are in prompt order. ``shared_prefix_tokens`` are the
    tokens of this prompt that the previous call of the same session (in
    this process) already sent as its prefix. ``broken_by`` is ``None`` when
    this prompt extends the previous one up to that call's tail, else the
    first part whose content differs. ``reported_cached_tokens`` is what the
    provider said it served from its cache (``None``: no usage reported).
    ``cleared`` names the tool results this prompt sent as a placeholder
    (:class:`raf.ClearToolResults`): ``"tool call_id"`` each, in order.
    """

    session_id: str | None
    input_tokens: int
    counted_by: str
    parts: tuple[LedgerPart, ...]
    shared_prefix_tokens: int
    broken_by: LedgerPart | None
    reported_cached_tokens: int | None
    cleared: tuple[str, ...] = attrs.field(default=(), kw_only=True)

    def tokens_of(self, layer: str) -> int:
        """The tokens ``layer`` put in this prompt, all regions together."""
        return sum(part.tokens for part in self.parts if part.layer == layer)


@attrs.frozen(slots=True)
class _Piece:
    """The smallest thing the ledger compares: a tool, a whole message, or one
    contributor's text inside a shared system message (``slot`` is its message)."""

    layer: str
    region: Region
    content: Any  # a Tool, a ChatMessage, or a str of a system message
    slot: int = -1  # the message a text belongs to; -1: a tool or a whole message

    def key(self) -> Any:
        if isinstance(self.content, (ChatMessage, str)):
            return self.content
        tool = self.content
        return ("tool", tool.name, tool.description, repr(tool.parameters))


@attrs.frozen(slots=True)
class _Seen:
    """What the ledger keeps of a session's last call: its pieces and where its tail began."""

    keys: tuple[Any, ...]
    stable_end: int


class ContextLedger(Observer):
    """An observer that records every model call's prompt by layer and region.

    ``Agent(..., observers=[ledger])``; then ``ledger.calls`` holds one
    :class:`LedgerEntry` per model call and ``ledger.report()`` is a table.
    Tokens are counted with ``count_tokens`` (``(messages, tools) -> int``)
    when given, else with the agent's client's ``count_tokens`` when it has
    one, else :func:`raf.compression.approximate_tokens`. An agent without a ledger pays
    nothing for it: the counting happens here. A ledger keeps every entry and
    each session's last prompt: it is meant for a command, a test or a
    debugging session, not for a server's lifetime.

    >>> import anyio
    >>> from raf import Agent, EchoChatClient
    >>> ledger = ContextLedger()
    >>> agent = Agent(EchoChatClient(), instructions="Be brief.", observers=[ledger])
    >>> anyio.run(agent.run, "hello").text
    'hello'
    >>> [(part.layer, part.region) for part in ledger.calls[0].parts]
    [('agent', 'system'), ('request', 'request')]
    """

    __slots__ = ("_count_tokens", "_seen", "calls")

    def __init__(self, *, count_tokens: PromptCounter | None = None) -> None:
        if count_tokens is not None and not callable(count_tokens):
            raise TypeError(f"count_tokens must be callable(messages, tools), got {count_tokens!r}")
        self._count_tokens = count_tokens
        #: One entry per model call, in order.
        self.calls: list[LedgerEntry] = []
        self._seen: dict[str | None, _Seen] = {}

    async def model_call(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Records the call once it ended (a failed call too: its prompt was sent)."""
        try:
            response = await call_next(request)
        except Exception:
            self._record(request, None)
            raise
        self._record(request, response)
        return response

    def report(self) -> str:
        """The calls as a table: tokens by layer, shared with the previous call, cached as
        the provider reported, and the part that broke the cache."""
        return report(self.calls)

    def _record(self, request: ChatRequest, response: AgentResponse | None) -> None:
        pieces = list(_pieces(request))
        count, counted_by = self._counter(request.invocation)
        session = request.options.session_id
        previous = self._seen.get(session)
        keys = tuple(piece.key() for piece in pieces)
        shared = 0 if previous is None else _common_prefix(previous.keys, keys)
        marks, parts = _parts(pieces, count)
        broken = None
        if previous is not None and shared < previous.stable_end and parts:
            broken = parts[_part_at(marks, shared)] if shared < len(pieces) else parts[-1]
        stable_end = next((i for i, p in enumerate(pieces) if p.region in _MOVING), len(pieces))
        self._seen[session] = _Seen(keys, stable_end)
        usage = response.usage if response is not None else None
        self.calls.append(
            LedgerEntry(
                session,
                sum(part.tokens for part in parts),
                counted_by,
                parts,
                count(*_prompt(pieces[:shared])) if shared else 0,
                broken,
                None if usage is None else usage.cached_input_tokens,
                cleared=_cleared(request.messages),
            )
        )

    def _counter(self, invocation: Invocation | None) -> tuple[PromptCounter, str]:
        if self._count_tokens is not None:
            return self._count_tokens, getattr(self._count_tokens, "__name__", "count_tokens")
        client = getattr(getattr(invocation, "agent", None), "chat_client", None)
        counter = getattr(client, "count_tokens", None)
        if callable(counter):
            encoding = getattr(client, "token_encoding", None)
            return counter, encoding if isinstance(encoding, str) else type(client).__name__
        return approximate_prompt_tokens, "approximate"


def _cleared(messages: Sequence[ChatMessage]) -> tuple[str, ...]:
    """The results sent as a placeholder: ``"tool call_id"`` each."""
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    return tuple(
        f"{names.get(m.tool_call_id or '', m.name or 'a tool')} {m.tool_call_id}"
        for m in messages
        if is_cleared(m)
    )


def _common_prefix(before: Sequence[Any], now: Sequence[Any]) -> int:
    shared = 0
    for old, new in zip(before, now, strict=False):
        if old != new:
            break
        shared += 1
    return shared


def _parts(
    pieces: Sequence[_Piece], count: PromptCounter
) -> tuple[list[int], tuple[LedgerPart, ...]]:
    """The pieces in runs of one layer and region, each counted as the tokens its end adds
    to the prompt (so the parts add up to the whole count); the runs' starting pieces."""
    marks: list[int] = []
    for index, piece in enumerate(pieces):
        if not marks or (piece.layer, piece.region) != (
            pieces[index - 1].layer,
            pieces[index - 1].region,
        ):
            marks.append(index)
    parts: list[LedgerPart] = []
    before = count(*_prompt(()))
    for number, start in enumerate(marks):
        end = marks[number + 1] if number + 1 < len(marks) else len(pieces)
        total = count(*_prompt(pieces[:end]))
        parts.append(LedgerPart(pieces[start].layer, pieces[start].region, total - before))
        before = total
    if parts:  # what an empty prompt counts (a client's priming tokens) goes to the first part
        first = parts[0]
        parts[0] = attrs.evolve(first, tokens=first.tokens + count(*_prompt(())))
    return marks, tuple(parts)


def _part_at(marks: Sequence[int], index: int) -> int:
    found = 0
    for number, start in enumerate(marks):
        if start <= index:
            found = number
    return found


def _prompt(pieces: Sequence[_Piece]) -> tuple[list[ChatMessage], list[Tool]]:
    """The prompt made of ``pieces`` (a prefix of a call's): its messages and tools."""
    tools: list[Tool] = []
    messages: list[ChatMessage] = []
    texts: list[str] = []
    slot = -1
    for piece in pieces:
        if texts and piece.slot != slot:
            messages.append(ChatMessage("system", "\n".join(texts)))
            texts = []
        if isinstance(piece.content, ChatMessage):
            messages.append(piece.content)
        elif isinstance(piece.content, str):
            texts.append(piece.content)
            slot = piece.slot
        else:
            tools.append(piece.content)
    if texts:
        messages.append(ChatMessage("system", "\n".join(texts)))
    return messages, tools


def _pieces(request: ChatRequest) -> Iterator[_Piece]:
    """The call's prompt in the order raf assembled it, each piece with its layer."""
    invocation = request.invocation
    tools, messages = request.options.tools, request.messages
    if invocation is None:  # a call made outside a run: nothing says who added what
        yield from (_Piece("agent", "tools", tool) for tool in tools)
        yield from (_Piece("request", "request", message) for message in messages)
        return
    agent = invocation.agent
    own_tools = len(agent.tools) if agent is not None else 0
    tool_layers = ("agent",) * own_tools + invocation.tool_sources
    for index, tool in enumerate(tools):
        yield _Piece(tool_layers[index] if index < len(tool_layers) else "agent", "tools", tool)
    at = 0
    own = agent.instructions if agent is not None else None
    texts = ((("agent", own),) if own else ()) + tuple(
        zip(invocation.instruction_sources, invocation.instructions, strict=False)
    )
    if texts and at < len(messages):
        yield from _texts(texts, messages[at], at, "system")
        at += 1
    end = at + len(invocation.messages)
    yield from _runs(invocation.message_sources, messages[at:end], "history")
    at = end
    tail = tuple(zip(invocation.tail_sources, invocation.tail_instructions, strict=False))
    if tail and at < len(messages):
        yield from _texts(tail, messages[at], at, "tail")
        at += 1
    end = at + len(invocation.tail_messages)
    yield from _runs(invocation.tail_message_sources, messages[at:end], "tail")
    at = end
    end = at + len(invocation.request_messages)
    yield from (_Piece("request", "request", message) for message in messages[at:end])
    yield from (_Piece("tool loop", "loop", message) for message in messages[end:])


def _texts(
    texts: Sequence[tuple[str, str]], message: ChatMessage, slot: int, region: Region
) -> Iterator[_Piece]:
    """A system message made of several contributors' texts, one piece each (a message
    that a middleware changed is the first contributor's, whole)."""
    if message.role == "system" and message.content == "\n".join(text for _, text in texts):
        yield from (_Piece(layer, region, text, slot) for layer, text in texts)
    else:
        yield _Piece(texts[0][0], region, message)


def _runs(sources: Segments, messages: Sequence[ChatMessage], region: Region) -> Iterator[_Piece]:
    """Messages by the runs of ``(provider, count)`` that contributed them."""
    at = 0
    layer = "agent"
    for layer, count in sources:
        for message in messages[at : at + count]:
            yield _Piece(layer, region, message)
        at += count
    for message in messages[at:]:  # a middleware added them: the last contributor's
        yield _Piece(layer, region, message)


def report(calls: Sequence[LedgerEntry]) -> str:
    """``calls`` as a table a person reads: one row per call, one column per layer."""
    if not calls:
        return "no model call was recorded"
    # Columns in prompt order: a layer where it first appears in the order of the regions.
    first: dict[str, int] = {}
    for entry in calls:
        for part in entry.parts:
            rank = _REGIONS.index(part.region)
            first[part.layer] = min(first.get(part.layer, rank), rank)
    layers = sorted(first, key=first.__getitem__)
    clearing = any(entry.cleared for entry in calls)
    head = ["call", "session", "input", *layers, "shared", "cached", "broken by"]
    if clearing:
        head.insert(-1, "cleared")
    rows = [head]
    for number, entry in enumerate(calls, 1):
        broken = entry.broken_by
        row = [
            str(number),
            (entry.session_id or "-")[:12],
            str(entry.input_tokens),
            *(str(entry.tokens_of(layer)) for layer in layers),
            str(entry.shared_prefix_tokens),
            "-" if entry.reported_cached_tokens is None else str(entry.reported_cached_tokens),
            "-" if broken is None else f"{broken.layer} ({broken.region})",
        ]
        if clearing:
            row.insert(-1, str(len(entry.cleared)))
        rows.append(row)
    total = [
        "all",
        "",
        str(sum(entry.input_tokens for entry in calls)),
        *(str(sum(entry.tokens_of(layer) for entry in calls)) for layer in layers),
        str(sum(entry.shared_prefix_tokens for entry in calls)),
        _cached_total(calls),
        f"{sum(entry.broken_by is not None for entry in calls)} broken",
    ]
    if clearing:
        total.insert(-1, "")
    rows.append(total)
    widths = [max(len(row[column]) for row in rows) for column in range(len(head))]
    lines = [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    counted = ", ".join(sorted({entry.counted_by for entry in calls}))
    lines.append(
        f"tokens counted by {counted}; shared: the prefix the session's previous call sent"
    )
    lines += _batches(calls)
    return "\n".join(lines)


def _batches(calls: Sequence[LedgerEntry]) -> list[str]:
    """A line per call that sent more results as a placeholder than its session's last."""
    lines: list[str] = []
    before: dict[str | None, set[str]] = {}
    for number, entry in enumerate(calls, 1):
        new = [name for name in entry.cleared if name not in before.get(entry.session_id, set())]
        before[entry.session_id] = set(entry.cleared)
        if new:
            lines.append(f"call {number} cleared {len(new)} tool results: {', '.join(new)}")
    return lines


def _cached_total(calls: Sequence[LedgerEntry]) -> str:
    reported = [entry.reported_cached_tokens for entry in calls]
    return "-" if all(value is None for value in reported) else str(sum(v or 0 for v in reported))
