"""ContextLedger: what each layer put in each model call's prompt, and which one broke the cache.

Providers bill a prompt prefix they have already seen at a fraction of the
price, so a call's cost depends on how far it extends the previous one. The
ledger cuts each prompt into the parts raf assembled (tools, system message,
history, tail, request, the tool loop's turns, each by the layer that
contributed it), counts their tokens, and compares the prompt with the
previous call of the same session. A prompt the core repairs before sending
(``raf._agent.repair``) is recorded as sent, each repair a part of its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any, Literal

import attrs

from raf._agent.repair import repair
from raf._observers.ledger_cost import split_bill
from raf._onion.observe import Observer
from raf._values.context import ChatRequest, Invocation, Segments
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.placeholders import is_cleared
from raf._values.prices import Prices, model_of
from raf._values.protocols import Tool
from raf._values.spill import CutResult, parse_cut
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

    ``layer`` is a provider's name, ``"agent"``, ``"request"``,
    ``"tool loop"`` or ``"repair"``; ``region`` one of ``"tools"``,
    ``"system"``, ``"history"``, ``"tail"``, ``"request"``, ``"loop"``.
    A ``"repair"`` part is what the core's transcript repair changed where it
    sits: the results it made for calls that had none (their tokens), or a
    result it left out (0 tokens: it is not sent). ``cost`` is its
    share of the call's input bill in USD (its cached tokens at the cached
    price, its cache writes at the write price): ``None`` when the model's
    price is unknown or the call reported no usage.
    """

    layer: str
    region: Region
    tokens: int
    cost: Decimal | None = attrs.field(default=None, kw_only=True)


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
    ``cost`` is the call's whole bill in USD (the parts' shares of its input,
    and its output), priced for ``model``, the model that answered: ``None``
    when its price is unknown or the call reported no usage.
    ``agent_tool`` names the agent tool whose run made the call (an agent
    called as another's tool, ``agent.as_tool()``: ``"researcher"``, or
    ``"researcher/searcher"`` for a tool of that agent's), ``None`` for the
    agent's own calls; the prompt of a forked one begins with parts of the
    layer ``"parent"``: the caller's last prompt.
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
    cost: Decimal | None = attrs.field(default=None, kw_only=True)
    model: str | None = attrs.field(default=None, kw_only=True)
    agent_tool: str | None = attrs.field(default=None, kw_only=True)
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
    content: Any  # a Tool, a ChatMessage, a str of a system message, or a _LeftOut
    slot: int = -1  # the message a text belongs to; -1: a tool or a whole message

    def key(self) -> Any:
        if isinstance(self.content, (ChatMessage, str, _LeftOut)):
            return self.content
        tool = self.content
        return ("tool", tool.name, tool.description, repr(tool.parameters))


@attrs.frozen(slots=True)
class _LeftOut:
    """A message the repair left out: a piece of the ledger, none of the prompt."""

    message: ChatMessage


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
    one, else :func:`raf.compression.approximate_tokens`. Each call is priced
    with ``prices`` (a :class:`raf.Prices`; default genai-prices' data) for
    the model that answered (the response's ``model``, else the call's, else
    the agent's client's). An agent without a ledger pays
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

    __slots__ = ("_count_tokens", "_cut", "_seen", "calls", "prices")

    #: The calls of the agents the agent calls as tools are recorded too (``agent_tool``).
    watches_agent_tools = True

    def __init__(
        self, *, count_tokens: PromptCounter | None = None, prices: Prices | None = None
    ) -> None:
        if count_tokens is not None and not callable(count_tokens):
            raise TypeError(f"count_tokens must be callable(messages, tools), got {count_tokens!r}")
        if prices is not None and not isinstance(prices, Prices):
            raise TypeError(f"ContextLedger: prices must be a raf.Prices, got {prices!r}")
        self._count_tokens = count_tokens
        #: What the ledger prices each call with.
        self.prices = Prices() if prices is None else prices
        #: One entry per model call, in order.
        self.calls: list[LedgerEntry] = []
        # By session and the calls that started the run (an agent called as a tool): a
        # child is compared with its own previous call, a forked one first with its parent's.
        self._seen: dict[tuple[str | None, tuple[str, ...]], _Seen] = {}
        # Tool call id -> (the model call that first sent it, its tool, what its marker says).
        self._cut: dict[str, tuple[int, str | None, CutResult]] = {}

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
        the provider reported, and the part that broke the cache; then the tool results
        that were cut (``raf.ToolOutputLimit``) and whether their full text was kept."""
        return report(self.calls) + _cut_lines(self._cut)

    def _record(self, request: ChatRequest, response: AgentResponse | None) -> None:
        pieces = _repaired(list(_pieces(request)), request.messages)
        count, counted_by = self._counter(request.invocation)
        session = request.options.session_id
        run = None if request.invocation is None else request.invocation.run
        lineage = () if run is None else run.lineage
        key = (session, tuple(call.id for call in lineage))
        previous = self._seen.get(key)
        if previous is None and run is not None and run.fork is not None:
            previous = self._seen.get((session, key[1][:-1]))  # the parent's last call
        keys = tuple(piece.key() for piece in pieces)
        shared = 0 if previous is None else _common_prefix(previous.keys, keys)
        marks, parts = _parts(pieces, count)
        broken_at = None
        if previous is not None and shared < previous.stable_end and parts:
            broken_at = _part_at(marks, shared) if shared < len(pieces) else len(parts) - 1
        stable_end = next((i for i, p in enumerate(pieces) if p.region in _MOVING), len(pieces))
        self._seen[key] = _Seen(keys, stable_end)
        usage = response.usage if response is not None else None
        for message in request.messages:
            if message.role == "tool" and message.tool_call_id not in self._cut:
                cut = parse_cut(message.content)
                if cut is not None and message.tool_call_id is not None:
                    self._cut[message.tool_call_id] = (len(self.calls) + 1, message.name, cut)
        model = model_of(request, response)
        cost = None
        rates = None if usage is None else self.prices.rates(model, usage.input_tokens)
        if usage is not None and rates is not None:
            cost = rates.cost(usage)
            shares = split_bill([part.tokens for part in parts], usage, rates)
            parts = tuple(
                attrs.evolve(part, cost=share) for part, share in zip(parts, shares, strict=True)
            )
        self.calls.append(
            LedgerEntry(
                session,
                sum(part.tokens for part in parts),
                counted_by,
                parts,
                count(*_prompt(pieces[:shared])) if shared else 0,
                None if broken_at is None else parts[broken_at],
                None if usage is None else usage.cached_input_tokens,
                cost=cost,
                model=model,
                agent_tool="/".join(call.name for call in lineage) or None,
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
    to the prompt (so the parts add up to the whole count); the runs' starting pieces.
    Each repair is a run of its own."""
    marks: list[int] = []
    for index, piece in enumerate(pieces):
        if (
            not marks
            or piece.layer == "repair"
            or (piece.layer, piece.region)
            != (
                pieces[index - 1].layer,
                pieces[index - 1].region,
            )
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
        elif isinstance(piece.content, _LeftOut):
            continue  # not sent
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
    fork = invocation.run.fork
    if fork is None:
        yield from _own_pieces(invocation, tools, messages)
        return
    # A forked child's prompt: its parent's last prompt first, then its own.
    parent_tools, parent_messages = len(fork.options.tools), len(fork.messages)
    for piece in _pieces(fork):
        yield attrs.evolve(piece, layer="parent")
    yield from _own_pieces(invocation, tools[parent_tools:], messages[parent_messages:])


def _own_pieces(
    invocation: Invocation, tools: Sequence[Tool], messages: Sequence[ChatMessage]
) -> Iterator[_Piece]:
    """A prompt assembled by one run's agent: its tools and messages, by layer."""
    agent = invocation.agent
    layers = {tool.name: "agent" for tool in agent.tools} if agent is not None else {}
    layers.update(zip((t.name for t in invocation.tools), invocation.tool_sources, strict=False))
    for tool in tools:
        yield _Piece(layers.get(tool.name, "agent"), "tools", tool)
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


def _repaired(pieces: list[_Piece], messages: Sequence[ChatMessage]) -> list[_Piece]:
    """``pieces`` of the prompt the core sends: as they are when ``messages`` need no
    repair, else each message's pieces in its repaired place, and a ``"repair"`` piece for
    each result the repair made (where its call is) and each message it left out (where
    it was); see :mod:`raf._agent.repair`."""
    fixed = repair(messages)
    if fixed is None:
        return pieces
    tools = [piece for piece in pieces if piece.region == "tools"]
    # Each message's pieces (a system message of several contributors is several).
    of_message: list[list[_Piece]] = [[] for _ in messages]
    at = -1
    for piece in pieces[len(tools) :]:
        at = piece.slot if piece.slot >= 0 else at + 1
        of_message[at].append(piece)
    for index, message in enumerate(messages):  # a message no region claimed: the request's
        of_message[index] = of_message[index] or [_Piece("request", "request", message)]
    repaired = tools
    left = list(fixed.left_out)
    region: Region = "history"
    for message, source in zip(fixed.messages, fixed.sources, strict=True):
        if source < 0:  # a result the repair made, in its call's region
            repaired.append(_Piece("repair", region, message))
            continue
        while left and left[0] < source:
            repaired.append(_left_out(of_message[left[0]][0], messages[left.pop(0)]))
        repaired += of_message[source]
        region = of_message[source][-1].region
    repaired += (_left_out(of_message[index][0], messages[index]) for index in left)
    return repaired


def _left_out(piece: _Piece, message: ChatMessage) -> _Piece:
    return _Piece("repair", piece.region, _LeftOut(message))


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
    priced = any(entry.cost is not None for entry in calls)
    tools = any(entry.agent_tool is not None for entry in calls)
    clearing = any(entry.cleared for entry in calls)
    head = ["call", "session", *(["agent tool"] if tools else []), "input", *layers]
    head += ["shared", "cached", *(["cleared"] if clearing else []), "broken by"]
    head += ["cost"] if priced else []
    rows = [head]
    for number, entry in enumerate(calls, 1):
        broken = entry.broken_by
        rows.append(
            [
                str(number),
                (entry.session_id or "-")[:12],
                *([entry.agent_tool or "-"] if tools else []),
                str(entry.input_tokens),
                *(str(entry.tokens_of(layer)) for layer in layers),
                str(entry.shared_prefix_tokens),
                "-" if entry.reported_cached_tokens is None else str(entry.reported_cached_tokens),
                *([str(len(entry.cleared))] if clearing else []),
                "-" if broken is None else f"{broken.layer} ({broken.region})",
                *([usd(entry.cost)] if priced else []),
            ]
        )
    rows.append(
        [
            "all",
            "",
            *([""] if tools else []),
            str(sum(entry.input_tokens for entry in calls)),
            *(str(sum(entry.tokens_of(layer) for entry in calls)) for layer in layers),
            str(sum(entry.shared_prefix_tokens for entry in calls)),
            _cached_total(calls),
            *([""] if clearing else []),
            f"{sum(entry.broken_by is not None for entry in calls)} broken",
            *([_cost_total(calls)] if priced else []),
        ]
    )
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
    if priced:
        lines.extend(_cost_by_layer(calls, layers))
    return "\n".join(lines)


def _cut_lines(cut: dict[str, tuple[int, str | None, CutResult]]) -> str:
    """The tool results the calls sent cut, one line each (nothing when none was)."""
    lines = []
    for call_id, (number, tool, result) in cut.items():
        kept = (
            "spilled: kept with the session, read_tool_result reads it"
            if result.call_id is not None
            else "not kept"
        )
        lines.append(
            f"  {call_id} ({tool or 'a tool'}), from call {number}: {result.total:,} characters, "
            f"{result.left_out:,} left out; {kept}"
        )
    return "\ncut tool results:\n" + "\n".join(lines) if lines else ""


def usd(cost: Decimal | None) -> str:
    """``cost`` as a person reads it: ``$0.000123`` (to the millionth), ``-`` when unknown."""
    return "-" if cost is None else f"${cost:.6f}"


def _cost_total(calls: Sequence[LedgerEntry]) -> str:
    costs = [entry.cost for entry in calls if entry.cost is not None]
    total = usd(sum(costs, Decimal(0)))
    return total if len(costs) == len(calls) else f"{total}+"  # "+": some calls unpriced


def _cost_by_layer(calls: Sequence[LedgerEntry], layers: Sequence[str]) -> list[str]:
    """What each layer's input cost over every priced call, and what the output cost."""
    priced = [entry for entry in calls if entry.cost is not None]
    by_layer = {
        layer: sum(
            (p.cost or Decimal(0) for e in priced for p in e.parts if p.layer == layer),
            Decimal(0),
        )
        for layer in layers
    }
    inputs = sum(by_layer.values(), Decimal(0))
    output = sum((e.cost or Decimal(0) for e in priced), Decimal(0)) - inputs
    rows = [(layer, usd(cost)) for layer, cost in by_layer.items()] + [("output", usd(output))]
    width = max(len(name) for name, _ in rows)
    models = ", ".join(sorted({e.model or "-" for e in priced}))
    lines = [f"cost by layer ({len(priced)} priced calls; {models}):"]
    lines.extend(f"  {name.ljust(width)}  {cost}" for name, cost in rows)
    unpriced = len(calls) - len(priced)
    if unpriced:
        lines.append(f"  {unpriced} calls unpriced (a model of no known price, or no usage)")
    return lines


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
