"""What a history is measured and cut in: the tokens of a message, the units of a history.

A window (:mod:`raf._sessions.window`) and a compression strategy
(:mod:`raf._providers.compression`) both keep or drop whole units, and count
tokens the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from raf._values.messages import ChatMessage
from raf._values.tokens import approximate_tokens

__all__ = ["approximate_tokens", "message_units"]

#: Messages kept or dropped together: one message, or a calling turn and its results.
Unit = tuple[ChatMessage, ...]


def message_units(messages: Sequence[ChatMessage]) -> list[Unit]:
    """The history as units that must be kept or dropped whole.

    An assistant turn with tool calls and the tool results right after it
    form one unit; every other message is a unit of its own. Pieces that
    could not be sent to a model are left out: a tool result with no
    calling turn before it, and a calling turn whose results are incomplete
    (with the results it has).

    >>> from raf import ChatMessage, ToolCall
    >>> call = ChatMessage.assistant(tool_calls=[ToolCall("1", "now")])
    >>> units = message_units([ChatMessage.user("hi"), call, ChatMessage.tool("1", "noon")])
    >>> [len(unit) for unit in units]
    [1, 2]
    """
    if not isinstance(messages, (list, tuple)):
        messages = list(messages)  # one pass at C speed; indexing a chunked history costs more
    units: list[Unit] = []
    index, count = 0, len(messages)
    while index < count:
        message = messages[index]
        index += 1
        if message.role == "tool":
            continue  # an orphan result: its calling turn is not before it
        if message.role != "assistant" or not message.tool_calls:
            units.append((message,))
            continue
        wanted = {call.id for call in message.tool_calls}
        results: list[ChatMessage] = []
        while index < count and messages[index].role == "tool":
            if messages[index].tool_call_id in wanted:
                results.append(messages[index])
            index += 1
        if wanted <= {result.tool_call_id for result in results}:
            units.append((message, *results))
    return units
