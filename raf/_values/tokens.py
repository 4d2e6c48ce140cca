"""Rough token counts, for when no tokenizer is at hand: of one message, of a whole prompt.

They live with the values because every layer counts: the windows, the clients (a model
whose encoding they do not know) and the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from raf._values.messages import ChatMessage
from raf._values.protocols import Tool

__all__ = ["approximate_tokens"]


def approximate_tokens(message: ChatMessage) -> int:
    """A rough token count: about four characters a token, plus a little per message.

    >>> from raf import ChatMessage
    >>> approximate_tokens(ChatMessage.user("x" * 40))
    14
    """
    chars = len(message.content or "")
    for call in message.tool_calls:
        chars += len(call.name) + len(call.arguments) + 8
    return 4 + (chars + 3) // 4


def approximate_tool_tokens(tool: Tool) -> int:
    """A rough token count of one tool's declaration (name, description, schema)."""
    schema = json.dumps(tool.parameters, separators=(",", ":"), sort_keys=True, default=str)
    return 4 + (len(tool.name) + len(tool.description or "") + len(schema) + 3) // 4


def approximate_prompt_tokens(messages: Sequence[ChatMessage], tools: Sequence[Tool] = ()) -> int:
    """A rough token count of a whole prompt: its tools' declarations and its messages.

    >>> approximate_prompt_tokens([ChatMessage.user("x" * 40)])
    14
    """
    return sum(map(approximate_tokens, messages)) + sum(map(approximate_tool_tokens, tools))
