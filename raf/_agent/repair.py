"""Transcript repair: what a model call sends obeys every wire's rules, whatever the history holds.

A history can be broken in ways no vendor accepts: a crash between a tool
call and its result, an import, a store written by an older version. Every
vendor refuses a tool call without its result right after it, and a result
without its call (OpenAI, the Responses API, Anthropic, Gemini each in its
own words), so one such history would poison every later call of the
session. The core repairs what it sends, as the last step before each model
call (:func:`repaired`); nothing stored changes:

- a tool call without a result gets a result that says it has none
  (:data:`INTERRUPTED`: it may or may not have run); it is never run again,
  as the tool loop runs only the calls of the model's new turns;
- a result whose call is earlier in the history but not right before it
  joins its call's results; a result without a call before it is left out;
- what is left out is a whole message: anything carried on it (an assistant
  turn's ``reasoning``, or ``compaction``) goes with it. Repair leaves out
  tool results only, so a turn's reasoning always goes with its turn.

A whole history (the hot path) is checked in one pass that allocates nothing,
and is sent as it is. A provider or strategy that itself splits a call from
its result is still an error that names it (:func:`split_by`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from raf._agent.deferred import INTERRUPTED, refusal
from raf._values.messages import ChatMessage, ToolCall

__all__: list[str] = []


def whole(messages: Sequence[ChatMessage]) -> bool:
    """Whether ``messages`` need no repair: every assistant turn's tool calls are answered by
    the tool messages right after it, one each, in any order, and no other tool message is
    there. ``False`` may be said of a history that repair leaves as it is (a user message
    with tool calls): :func:`repair` then says so."""
    # One pass that allocates nothing while the results come in call order: a whole
    # history of 10,000 messages costs some ten copies of it, not a repair.
    calls: tuple[ToolCall, ...] = ()
    owed = 0  # results the current turn still waits for
    unordered: set[str | None] | None = None  # their ids, once they leave the calls' order
    for message in messages:
        if message.role == "tool":
            if not owed:
                return False  # a result with no call of the turn before it left to answer
            call_id = message.tool_call_id
            if unordered is None:
                if calls[len(calls) - owed].id == call_id:  # in call order: no set
                    owed -= 1
                    continue
                unordered = {call.id for call in calls[: len(calls) - owed]}
            if call_id in unordered or all(call.id != call_id for call in calls):
                return False
            unordered.add(call_id)
            owed -= 1
            continue
        if owed:
            return False  # the turn before has a call without its result
        calls = message.tool_calls
        if calls:
            if message.role != "assistant":
                return False  # no wire sends them; repair says whether that matters
            owed = len(calls)
            unordered = None
    return not owed


@attrs.frozen(slots=True)
class Repair:
    """A repaired history: the ``messages`` to send, and where each came from.

    ``sources[i]`` is the index in the history given of ``messages[i]``,
    or ``-1`` for a result the repair made; ``left_out`` are the indexes of
    the history's messages that are not sent.
    """

    messages: tuple[ChatMessage, ...]
    sources: tuple[int, ...]
    left_out: tuple[int, ...]

    @property
    def made(self) -> tuple[ChatMessage, ...]:
        """The results the repair made, one per call that had none."""
        return tuple(m for m, source in zip(self.messages, self.sources, strict=True) if source < 0)


def repair(messages: Sequence[ChatMessage]) -> Repair | None:
    """``messages`` repaired (see the module's docstring); ``None`` when they need nothing.

    >>> from raf import ChatMessage, ToolCall
    >>> turn = ChatMessage.assistant(tool_calls=[ToolCall("1", "now")])
    >>> fixed = repair([ChatMessage.tool("0", "late"), turn, ChatMessage.user("hi")])
    >>> [(m.role, m.tool_call_id) for m in fixed.messages], fixed.left_out
    ([('assistant', None), ('tool', '1'), ('user', None)], (0,))
    """
    if whole(messages):
        return None
    # Each result answers the latest call of its id still waiting for one, if any.
    waiting: dict[str, int] = {}  # call id -> the turn whose call it is
    results: dict[int, dict[str, int]] = {}  # turn -> its calls' ids -> their results
    for index, message in enumerate(messages):
        if message.role == "tool":
            turn = waiting.pop(message.tool_call_id or "", None)
            if turn is not None:
                results[turn][message.tool_call_id or ""] = index
        elif message.role == "assistant" and message.tool_calls:
            results[index] = {}
            waiting.update((call.id, index) for call in message.tool_calls)
    sent: list[ChatMessage] = []
    sources: list[int] = []
    for index, message in enumerate(messages):
        if message.role == "tool":
            continue  # sent with its turn's results, or left out
        sent.append(message)
        sources.append(index)
        found = results.get(index)
        if found is None:
            continue
        # The results in the order the history has them (a whole block is unchanged),
        # then one for each call that has none.
        for result in sorted(found.values()):
            sent.append(messages[result])
            sources.append(result)
        for call in message.tool_calls:
            if call.id not in found:
                sent.append(interrupted(call))
                sources.append(-1)
                found[call.id] = -1  # a call id named twice in a turn gets one result
    if len(sent) == len(messages) and all(s == i for i, s in enumerate(sources)):
        return None  # nothing to repair after all (a user message with tool calls)
    kept = set(sources)
    left_out = tuple(i for i in range(len(messages)) if i not in kept)
    return Repair(tuple(sent), tuple(sources), left_out)


def repaired(messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
    """What a model call sends for ``messages``: ``messages`` themselves when whole (no
    copy), else their repair (see :func:`repair`)."""
    fixed = repair(messages)
    return messages if fixed is None else fixed.messages


class Repairs:
    """The transcript repair of one agent's model calls (:func:`repaired`), which keeps the
    last whole transcript it let through: a call whose messages extend it (the tool
    loop's next call, the session's next turn) checks only what is new, after one
    comparison of the rest at C speed (a tenth of a check of it)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[ChatMessage, ...] = ()

    def __call__(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
        """What a model call sends for ``messages`` (see :func:`repaired`)."""
        last = self._last
        size = len(last)
        if size and type(messages) is tuple and len(messages) >= size and messages[:size] == last:
            # A whole transcript ends with every call answered: what follows it is whole
            # on its own terms or not at all.
            fine = whole(messages[size:])
        else:
            fine = whole(messages)
        if not fine:
            return repaired(messages)
        if type(messages) is tuple:
            self._last = messages
        return messages


def interrupted(call: ToolCall) -> ChatMessage:
    """The result a repair makes for ``call``, which has none: it may or may not have run."""
    return refusal(call, INTERRUPTED)


def split_by(before: Sequence[ChatMessage], after: Sequence[ChatMessage]) -> str | None:
    """What a step that turned ``before`` into ``after`` split itself (a tool call from its
    result), or ``None``: what was broken in ``before`` already is repair's to mend.

    >>> from raf import ChatMessage, ToolCall
    >>> turn = ChatMessage.assistant(tool_calls=[ToolCall("1", "now")])
    >>> split_by([turn, ChatMessage.tool("1", "noon")], [ChatMessage.tool("1", "noon")])
    "the result of call '1' without its call"
    >>> split_by([turn], [turn]) is None
    True
    """
    problems = _problems(after) - _problems(before)
    if not problems:
        return None
    kind, call_id = sorted(problems)[0]
    if kind == "call":
        return f"call {call_id!r} without its result"
    return f"the result of call {call_id!r} without its call"


def _problems(messages: Sequence[ChatMessage]) -> set[tuple[str, str]]:
    """What the repair of ``messages`` mends: ``("call", id)`` for a call it answers,
    ``("result", id)`` for a result it leaves out."""
    fixed = repair(messages)
    if fixed is None:
        return set()
    problems = {("call", m.tool_call_id or "") for m in fixed.made}
    problems |= {("result", messages[i].tool_call_id or "") for i in fixed.left_out}
    return problems
