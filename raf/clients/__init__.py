"""Chat clients: the real OpenAI one and the offline ones."""

from raf.clients.echo import EchoChatClient
from raf.clients.openai import OpenAIChatClient
from raf.clients.responses import OpenAIResponsesClient
from raf.clients.scripted import ScriptedCall, ScriptedChatClient, ScriptStep

__all__ = [
    "EchoChatClient",
    "OpenAIChatClient",
    "OpenAIResponsesClient",
    "ScriptStep",
    "ScriptedCall",
    "ScriptedChatClient",
]
