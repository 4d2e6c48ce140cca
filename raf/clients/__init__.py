"""Chat clients: the real OpenAI ones and the offline ones."""

import typing

from raf.clients.echo import EchoChatClient
from raf.clients.scripted import ScriptedCall, ScriptedChatClient, ScriptStep

if typing.TYPE_CHECKING:
    from raf.clients.openai import OpenAIChatClient as OpenAIChatClient
    from raf.clients.responses import OpenAIResponsesClient as OpenAIResponsesClient

__all__ = [
    "EchoChatClient",
    "OpenAIChatClient",
    "OpenAIResponsesClient",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedChatClient",
]


def __getattr__(name: str) -> object:
    # Imported on first use: `import raf` must not import the OpenAI clients' modules.
    if name == "OpenAIChatClient":
        from raf.clients.openai import OpenAIChatClient

        return OpenAIChatClient
    if name == "OpenAIResponsesClient":
        from raf.clients.responses import OpenAIResponsesClient

        return OpenAIResponsesClient
    raise AttributeError(f"module 'raf.clients' has no attribute {name!r}")
