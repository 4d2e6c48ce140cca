"""ChatClient: the protocol every model client implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from raf.messages import AgentResponse, ChatMessage
from raf.options import ChatOptions

__all__ = ["ChatClient"]


@runtime_checkable
class ChatClient(Protocol):
    """A chat model: messages and options in, the model's turn out.

    The response's ``messages`` hold the assistant turn (text, tool calls or
    both); failures are :class:`raf.errors.ChatClientError` subclasses.
    """

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse: ...
