"""What a wire is sent of a history that holds compactions: from its own compaction on,
or another wire's summary in place of what that one replaced; never a foreign item."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

import attrs

from raf._values.messages import ChatMessage
from raf.errors import BadRequestError

__all__: list[str] = []

#: How a summary stands in for what a compaction replaced (as SummaryStrategy's note).
SUMMARY_NOTE: Final = "Summary of the earlier conversation: "


def own_compaction(
    message: ChatMessage, index: int, source: str, what: str
) -> dict[str, Any] | None:
    """The JSON object of the compaction ``message`` carries for the wire ``source``
    (``None`` for another wire's, or none at all); a
    :class:`~raf.errors.BadRequestError` naming ``messages[index]`` when its data is not
    that wire's ``what`` ("compaction block", "compaction item")."""
    compaction = message.compaction
    if compaction is None or compaction.source != source:
        return None
    try:
        found = json.loads(compaction.data)
    except ValueError:
        found = None
    if not isinstance(found, dict) or found.get("type") != "compaction":
        raise BadRequestError(
            f"messages[{index}]: the compaction (source {source!r}) is not the JSON object "
            f"of a {what}: {compaction.data[:80]!r}"
        )
    return found


def standing_prompt(messages: Sequence[ChatMessage]) -> int:
    """How many system messages open ``messages``: the standing prompt, kept in front of
    any compaction."""
    for index, message in enumerate(messages):
        if message.role != "system":
            return index
    return len(messages)


def for_wire(
    messages: Sequence[ChatMessage], source: str, history_end: int | None
) -> tuple[Sequence[ChatMessage], int | None]:
    """``messages`` as the wire ``source`` is to get them, and ``history_end`` moved with them.

    The last compaction the wire can use rules: its own (``Compaction.source ==
    source``), or another's that has a summary. With its own, the standing prompt
    (the opening system messages) and the history from that message on, the item
    on it; with another's, the standing prompt, the summary as one system message,
    then the history from that message on. Any other compaction item is taken off
    its message (a message left with nothing is left out). A history with no
    compaction is returned as it is.

    >>> from raf._values.carried import Compaction
    >>> old = [ChatMessage.system("Be brief."), ChatMessage.user("a long talk")]
    >>> done = ChatMessage.assistant("ok", compaction=Compaction("anthropic", "{}", "talked"))
    >>> [m.content for m in for_wire([*old, done], "anthropic", None)[0]]
    ['Be brief.', 'ok']
    >>> [m.content for m in for_wire([*old, done], "gemini", None)[0]]
    ['Be brief.', 'Summary of the earlier conversation: talked', 'ok']
    """
    # getattr: what is not a message goes on as it is, for the client to refuse by index.
    marks = [i for i, m in enumerate(messages) if getattr(m, "compaction", None) is not None]
    if not marks:
        return messages, history_end
    start, note = 0, None
    for index in reversed(marks):
        compaction = messages[index].compaction
        assert compaction is not None
        if compaction.source == source or compaction.summary is not None:
            start = index
            if compaction.source != source:
                note = ChatMessage.system(SUMMARY_NOTE + str(compaction.summary))
            break
    lead = standing_prompt(messages) if start else 0
    sent: list[ChatMessage] = list(messages[:lead])
    origins: list[float] = list(range(lead))  # where each sent message was (for history_end)
    if note is not None:
        sent.append(note)
        origins.append(start - 0.5)
    for index in range(start, len(messages)):
        message = messages[index]
        compaction = getattr(message, "compaction", None)
        if compaction is not None and not (index == start and compaction.source == source):
            message = attrs.evolve(message, compaction=None)
            if message.content is None and not message.tool_calls and message.reasoning is None:
                continue  # a compaction and nothing else: nothing of it for this wire
        sent.append(message)
        origins.append(index)
    if history_end is not None:
        history_end = sum(1 for origin in origins if origin < history_end)
    return sent, history_end
