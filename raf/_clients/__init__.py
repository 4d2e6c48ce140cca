"""Chat clients: the real OpenAI ones and the offline ones."""

import typing

from raf._clients.echo import EchoChatClient
from raf._clients.scripted import ScriptedChatClient

if typing.TYPE_CHECKING:
    from raf._clients.openai import OpenAIChatClient as OpenAIChatClient
    from raf._clients.responses import OpenAIResponsesClient as OpenAIResponsesClient

__all__ = ["EchoChatClient", "OpenAIChatClient", "OpenAIResponsesClient", "ScriptedChatClient"]


def __getattr__(name: str) -> object:
    # Imported on first use: `import raf` must not import the OpenAI clients' modules.
    if name == "OpenAIChatClient":
        from raf._clients.openai import OpenAIChatClient

        return OpenAIChatClient
    if name == "OpenAIResponsesClient":
        from raf._clients.responses import OpenAIResponsesClient

        return OpenAIResponsesClient
    raise AttributeError(f"module 'raf._clients' has no attribute {name!r}")
