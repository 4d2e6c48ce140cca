"""CompactionMiddleware: keep each model call under a size, by the model server's own
compaction where it has one, by a compression strategy elsewhere, portably across wires,
and compact and retry once when the server says the prompt is too long."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import attrs

from raf._agent.streamed import Onward
from raf._log import log as _log
from raf._values.carried import Compaction
from raf._values.compacted import SUMMARY_NOTE, for_wire, standing_prompt
from raf._values.context import ChatRequest
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.tokens import approximate_tokens
from raf.errors import ChatClientError, CompressionError, ContextOverflowError

__all__ = ["CompactionMiddleware"]

#: How many summaries of opaque compaction items one middleware remembers.
_SUMMARIES: Final = 64


class CompactionMiddleware:
    """Chat middleware: a conversation longer than any window stays within one.

    ``Agent(client, chat_stack=[CompactionMiddleware(100_000, fallback=...)])``:

    - **Native.** With a client whose server compacts the conversation itself
      (:class:`raf.OpenAIResponsesClient`: ``context_management``;
      :class:`raf.AnthropicChatClient`: the ``compact_20260112`` edit, at
      Anthropic's minimum trigger of 50,000 input tokens or above), each call asks
      that server to compact past ``threshold_tokens``
      (``ChatOptions.compact_threshold``). The server's item comes back on the
      assistant turn (:attr:`raf.ChatMessage.compaction`), is stored with it,
      and from then on the client sends the conversation from that turn on.
      The compaction is part of the call itself, so it reads the call's cache.
    - **Fallback.** With another client, or ``native=False``, a call whose
      prompt would pass ``threshold_tokens`` (the client's ``count_tokens``, else
      :func:`raf.compression.approximate_tokens`) goes with its history
      compressed by ``fallback`` (a compression strategy, e.g.
      :class:`raf.compression.SummaryStrategy`); the standing prompt (the
      opening system messages) is kept as it is. The session keeps everything.
    - **Portable.** A call to another wire than a compaction item's (a
      :class:`raf.FallbackMiddleware` client, a switched client) never gets the
      item: it gets the item's summary in place of what it replaced, or, for an
      item with none (OpenAI's are encrypted), ``fallback`` run over what came
      before it, once per item, so a model with a smaller window still fits.
    - **Overflow.** When the server says the prompt is too long
      (:class:`raf.ContextOverflowError`), the call is compacted (natively with a
      client that can compact on demand, ``OpenAIResponsesClient.compact``; else
      with ``fallback``) and made once more; if it still does not fit, a
      ``ContextOverflowError`` says so. A streamed call is retried only while it
      sent nothing onward. The session is never left wedged: the next turn
      starts from what is stored.

    The agent's client is the one it compacts for (``invocation.agent.chat_client``);
    list it before a :class:`raf.FallbackMiddleware`, so the fallback's calls
    are kept portable too.

    >>> from raf import Agent, ScriptedChatClient
    >>> from raf.compression import TruncationStrategy
    >>> middleware = CompactionMiddleware(8_000, fallback=TruncationStrategy(20))
    >>> agent = Agent(ScriptedChatClient(), chat_stack=[middleware])
    """

    __slots__ = ("_summaries", "fallback", "native", "threshold_tokens")

    def __init__(self, threshold_tokens: int, *, fallback: Any = None, native: bool = True) -> None:
        if type(threshold_tokens) is not int or threshold_tokens < 1:
            raise ValueError(
                f"CompactionMiddleware: threshold_tokens must be an int >= 1, "
                f"got {threshold_tokens!r}"
            )
        if fallback is not None and not callable(getattr(fallback, "compress", None)):
            raise TypeError(
                "CompactionMiddleware: fallback must be a compression strategy (an async "
                f"compress(messages) method) or None, got {fallback!r}"
            )
        if type(native) is not bool:
            raise TypeError(f"CompactionMiddleware: native must be True or False, got {native!r}")
        self.threshold_tokens = threshold_tokens
        self.fallback = fallback
        self.native = native
        # The summary ``fallback`` made of what an opaque item replaced, by the item: made
        # once per item, not per call.
        self._summaries: OrderedDict[str, str] = OrderedDict()

    async def __call__(
        self, request: Any, call_next: Callable[[Any], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """The call kept under ``threshold_tokens``, portable, and retried once compacted
        when the server finds it too long."""
        if not isinstance(request, ChatRequest):
            raise TypeError(
                "CompactionMiddleware belongs in Agent(chat_stack=[...]): it compacts one "
                f"model call, and got a {type(request).__name__}"
            )
        client = _client_of(request)
        native = self.native and _source(client) is not None
        wires = _wires(request, client)
        messages = await self._portable(request.messages, wires)
        options = request.options
        if native:
            options = attrs.evolve(options, compact_threshold=self.threshold_tokens)
        elif self.fallback is not None:
            # What the client sends of it (another wire's summary for what that replaced).
            sent, end = for_wire(messages, _source(client) or "", options.history_end)
            if self._size(client, sent, options) > self.threshold_tokens:
                options = attrs.evolve(options, history_end=end)
                messages, options = await self._compressed(sent, options)
        onward = None if request.on_update is None else Onward(request.on_update)
        first = attrs.evolve(request, messages=messages, options=options, on_update=onward)
        try:
            return await call_next(first)
        except ContextOverflowError as exc:
            if onward is not None and onward.sent:
                raise  # the consumer saw this call's answer: another would contradict it
            overflow = exc
        retry, compaction = await self._recover(client, native, wires, first, overflow)
        _log.warning(
            "model.compacted",
            reason="overflow",
            how="native" if compaction is not None else "fallback",
            messages_before=len(first.messages),
            messages_after=len(retry.messages),
        )
        if compaction is not None and request.on_update is not None:
            await request.on_update(Update.of_compaction(compaction))
        try:
            response = await call_next(attrs.evolve(retry, on_update=request.on_update))
        except ContextOverflowError as exc:
            raise ContextOverflowError(
                f"{exc} (CompactionMiddleware compacted the conversation and tried once "
                "more: it still does not fit; send less, or lower threshold_tokens)",
                input_tokens=exc.input_tokens,
                max_tokens=exc.max_tokens,
                status_code=exc.status_code,
            ) from exc
        return response if compaction is None else _carrying(response, compaction)

    def _size(self, client: Any, messages: Sequence[ChatMessage], options: Any) -> int:
        """The prompt's tokens by the client's count, else the approximate one."""
        count = getattr(client, "count_tokens", None)
        if callable(count):
            return int(count(messages, options.tools))
        return sum(approximate_tokens(message) for message in messages)

    async def _compressed(
        self, messages: Sequence[ChatMessage], options: Any
    ) -> tuple[tuple[ChatMessage, ...], Any]:
        """The standing prompt, then ``fallback`` over the rest; ``history_end`` moved
        with it (the messages after it are the request's and the loop's, kept at the end
        by every strategy that keeps the newest)."""
        assert self.fallback is not None
        lead = standing_prompt(messages)
        compressed = tuple(await self.fallback.compress(tuple(messages[lead:])))
        if not all(type(message) is ChatMessage for message in compressed):
            raise CompressionError(f"{self.fallback!r} returned something else than messages")
        sent = (*messages[:lead], *compressed)
        end = options.history_end
        if end is not None:
            end = max(lead, len(sent) - (len(messages) - end))
        return sent, attrs.evolve(options, history_end=end)

    async def _portable(
        self, messages: Sequence[ChatMessage], wires: frozenset[str | None]
    ) -> Sequence[ChatMessage]:
        """``messages`` with a summary on each compaction item that has none and may go to
        another wire than its own (made with ``fallback``, once per item)."""
        if self.fallback is None:
            return messages
        found: list[ChatMessage] = list(messages)
        changed = False
        for index, message in enumerate(messages):
            compaction = message.compaction
            if compaction is None or compaction.summary is not None:
                continue
            if wires == {compaction.source}:
                continue  # every client this call may reach reads the item itself
            summary = await self._summary(compaction, messages[:index])
            if summary:
                found[index] = attrs.evolve(
                    message, compaction=attrs.evolve(compaction, summary=summary)
                )
                changed = True
        return found if changed else messages

    async def _summary(self, compaction: Compaction, before: Sequence[ChatMessage]) -> str:
        """What ``fallback`` makes of the messages ``compaction`` replaced, as text."""
        known = self._summaries.get(compaction.data)
        if known is not None:
            self._summaries.move_to_end(compaction.data)
            return known
        assert self.fallback is not None
        kept = await self.fallback.compress(tuple(before[standing_prompt(before) :]))
        text = _as_text(kept)
        self._summaries[compaction.data] = text
        while len(self._summaries) > _SUMMARIES:
            self._summaries.popitem(last=False)
        return text

    async def _recover(
        self,
        client: Any,
        native: bool,
        wires: frozenset[str | None],
        request: ChatRequest,
        overflow: ContextOverflowError,
    ) -> tuple[ChatRequest, Compaction | None]:
        """The call once more, compacted: by the server when it compacts on demand (the
        standing prompt, the item, and the last user turn on), else by ``fallback``."""
        messages, options = request.messages, request.options
        compact = getattr(client, "compact", None)
        compaction: Compaction | None = None
        if native and callable(compact):
            try:
                compaction = await compact(messages, options)
            except ChatClientError as exc:
                if self.fallback is None:
                    raise
                # The server cannot compact now (down, or refusing): the strategy can.
                _log.warning(
                    "model.compaction_failed", error_type=type(exc).__name__, error=str(exc)
                )
        if compaction is not None:
            lead = standing_prompt(messages)
            tail = _last_turn(messages, lead)
            if self.fallback is not None and wires != {compaction.source}:
                # Portable from the start: stored with the summary another wire reads.
                summary = await self._summary(compaction, messages[:tail])
                compaction = attrs.evolve(compaction, summary=summary or None)
            item = ChatMessage.assistant(compaction=compaction)
            sent = (*messages[:lead], item, *messages[tail:])
            end = options.history_end
            options = attrs.evolve(options, history_end=None if end is None else lead + 1)
            return attrs.evolve(request, messages=sent, options=options), compaction
        if self.fallback is None:
            overflow.add_note(
                "raf: CompactionMiddleware could not compact: the client cannot compact on "
                "its server, and no fallback strategy was given"
            )
            raise overflow
        sent, options = await self._compressed(messages, options)
        return attrs.evolve(request, messages=sent, options=options), None

    def __repr__(self) -> str:
        return (
            f"CompactionMiddleware(threshold_tokens={self.threshold_tokens}, "
            f"fallback={self.fallback!r}, native={self.native})"
        )


def _client_of(request: ChatRequest) -> Any:
    """The agent's chat client: the one the call goes to unless a fallback takes it."""
    invocation = request.invocation
    return None if invocation is None else getattr(invocation.agent, "chat_client", None)


def _wires(request: ChatRequest, client: Any) -> frozenset[str | None]:
    """The compaction sources of the clients this call may reach (``None`` for a client
    with none): the agent's, and those of a fallback in the agent's chat stack."""
    clients = [client]
    invocation = request.invocation
    for item in getattr(getattr(invocation, "agent", None), "chat_stack", ()):
        clients += list(getattr(item, "chat_clients", ()))
    return frozenset(_source(c) for c in clients)


def _source(client: Any) -> str | None:
    source = getattr(client, "compaction_source", None)
    return source if isinstance(source, str) else None


def _last_turn(messages: Sequence[ChatMessage], lead: int) -> int:
    """Where the last user turn starts (the request being answered), past ``lead``; the
    end when there is none."""
    for index in range(len(messages) - 1, lead - 1, -1):
        if messages[index].role == "user":
            return index
    return len(messages)


def _as_text(messages: Sequence[ChatMessage]) -> str:
    """What a compression strategy kept, as one plain text (a summary note as its text)."""
    lines: list[str] = []
    for message in messages:
        content = message.content or ""
        if message.role == "system":
            lines.append(content.removeprefix(SUMMARY_NOTE))
            continue
        if content:
            lines.append(f"{message.role}: {content}")
        lines += [
            f"{message.role} called {call.name}({call.arguments})" for call in message.tool_calls
        ]
    return "\n".join(line for line in lines if line)


def _carrying(response: AgentResponse, compaction: Compaction) -> AgentResponse:
    """``response`` with ``compaction`` on its first assistant turn (where a server's own
    compaction comes), so the session stores it with that turn."""
    messages = list(response.messages)
    for index, message in enumerate(messages):
        if message.role == "assistant":
            if message.compaction is None:
                messages[index] = attrs.evolve(message, compaction=compaction)
            break
    else:
        messages.insert(0, ChatMessage.assistant(compaction=compaction))
    return attrs.evolve(response, messages=tuple(messages))
