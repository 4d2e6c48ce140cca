"""EchoChatClient: an offline model that answers with the last user message."""

from __future__ import annotations

from collections.abc import Sequence

from raf.messages import AgentResponse, ChatMessage, Usage
from raf.options import ChatOptions

__all__ = ["EchoChatClient"]


class EchoChatClient:
    """Answers every call with the text of the last user message.

    Offline and deterministic: the default model of the demo and the
    command line, and a stand-in for a model in examples.

    >>> import anyio
    >>> anyio.run(EchoChatClient().complete, [ChatMessage.user("ping")], ChatOptions()).text
    'ping'
    """

    __slots__ = ("prefix",)

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """The last user message, echoed back as the assistant's answer."""
        text = ""
        for message in reversed(messages):
            if message.role == "user":
                text = message.content or ""
                break
        answer = self.prefix + text
        # A rough usage, in words: what was echoed in, what was said back.
        return AgentResponse(
            (ChatMessage("assistant", answer),), Usage(len(text.split()), len(answer.split()))
        )
