"""Chat clients: the real OpenAI one and the offline ones."""

from raf.clients.echo import EchoChatClient
from raf.clients.scripted import ScriptedCall, ScriptedChatClient, ScriptStep

__all__ = ["EchoChatClient", "ScriptStep", "ScriptedCall", "ScriptedChatClient"]
