"""raf: the context pipeline of LLM agents, built as an ASGI-style onion."""

from raf.agent import Agent, ChatClient
from raf.clients import EchoChatClient, ScriptedChatClient
from raf.context import EMPTY_RESULT, ContextResult, Invocation, merge
from raf.errors import (
    AgentError,
    ChatClientError,
    ConfigError,
    ProviderError,
    ToolArgumentsError,
    ToolConflictError,
    ToolLoopError,
)
from raf.messages import AgentResponse, ChatMessage, Messages, ToolCall, Usage
from raf.options import AgentRunOptions, ChatOptions
from raf.parallel import ProviderGroup, parallel
from raf.pipeline import ChatRequest, Complete, Middleware, compose
from raf.providers import ContextProvider
from raf.sessions import InMemorySession, Session
from raf.tools import FunctionTool, Tool, tool

__all__ = [
    "EMPTY_RESULT",
    "Agent",
    "AgentError",
    "AgentResponse",
    "AgentRunOptions",
    "ChatClient",
    "ChatClientError",
    "ChatMessage",
    "ChatOptions",
    "ChatRequest",
    "Complete",
    "ConfigError",
    "ContextProvider",
    "ContextResult",
    "EchoChatClient",
    "FunctionTool",
    "InMemorySession",
    "Invocation",
    "Messages",
    "Middleware",
    "ProviderError",
    "ProviderGroup",
    "ScriptedChatClient",
    "Session",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolConflictError",
    "ToolLoopError",
    "Usage",
    "compose",
    "merge",
    "parallel",
    "tool",
]
