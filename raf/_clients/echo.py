"""EchoChatClient: an offline model that answers with the last user message."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from typing import Final

from raf._values.messages import AgentResponse, ChatMessage, Update, Usage
from raf._values.options import ChatOptions

__all__ = ["EchoChatClient"]

# A word with the spaces after it (and any spaces before the first): the chunks join
# back into the text exactly.
_WORDS: Final = re.compile(r"\s*\S+\s*|\s+")


class EchoChatClient:
    """Answers every call with the text of the last user message.

    Offline and deterministic: the default model of the demo and the
    command line, and a stand-in for a model in examples. ``stream`` sends
    the answer word by word, then the usage.

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
        text, answer = self._answer(messages)
        # A rough usage, in words: what was echoed in, what was said back.
        return AgentResponse(
            (ChatMessage("assistant", answer),), Usage(len(text.split()), len(answer.split()))
        )

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The same answer as :meth:`complete`, one word (with its spaces) per update."""
        text, answer = self._answer(messages)
        for word in _WORDS.findall(answer) or [""]:
            yield Update("text", word)
        yield Update("usage", usage=Usage(len(text.split()), len(answer.split())))

    def _answer(self, messages: Sequence[ChatMessage]) -> tuple[str, str]:
        text = ""
        for message in reversed(messages):
            if message.role == "user":
                text = message.content or ""
                break
        return text, self.prefix + text
