"""raf: the context pipeline of LLM agents, built as an ASGI-style onion."""

from raf.agent import Agent
from raf.builtin import (
    AgentSkillsProvider,
    CompressionProvider,
    CompressionStrategy,
    FolderRetriever,
    InMemoryHistoryProvider,
    KnowledgeProvider,
    McpToolsProvider,
    Passage,
    Retriever,
    SummaryStrategy,
    TokenBudgetStrategy,
    TruncationStrategy,
    WikiRetriever,
    WorkspaceContextProvider,
)
from raf.clients import EchoChatClient, OpenAIChatClient, ScriptedChatClient
from raf.clients.base import ChatClient
from raf.config import (
    ContextProviderDecl,
    build_provider,
    build_providers,
    load_provider_decls,
    register_provider_kind,
)
from raf.context import EMPTY_RESULT, ContextResult, Invocation, merge
from raf.errors import (
    AgentError,
    ChatClientError,
    CompressionError,
    ConfigError,
    McpError,
    PathError,
    ProviderError,
    ToolArgumentsError,
    ToolConflictError,
    ToolError,
    ToolLoopError,
)
from raf.messages import AgentResponse, ChatMessage, ToolCall, Usage
from raf.middleware import LoggingMiddleware, RetryMiddleware
from raf.options import AgentRunOptions, ChatOptions
from raf.parallel import ProviderGroup, parallel
from raf.pipeline import ChatRequest, Complete, Middleware, compose
from raf.providers import ContextProvider
from raf.sessions import InMemorySession, Session, SqliteSessionStore
from raf.tools import FunctionTool, Tool, tool

__all__ = [
    "EMPTY_RESULT",
    "Agent",
    "AgentError",
    "AgentResponse",
    "AgentRunOptions",
    "AgentSkillsProvider",
    "ChatClient",
    "ChatClientError",
    "ChatMessage",
    "ChatOptions",
    "ChatRequest",
    "Complete",
    "CompressionError",
    "CompressionProvider",
    "CompressionStrategy",
    "ConfigError",
    "ContextProvider",
    "ContextProviderDecl",
    "ContextResult",
    "EchoChatClient",
    "FolderRetriever",
    "FunctionTool",
    "InMemoryHistoryProvider",
    "InMemorySession",
    "Invocation",
    "KnowledgeProvider",
    "LoggingMiddleware",
    "McpError",
    "McpToolsProvider",
    "Middleware",
    "OpenAIChatClient",
    "Passage",
    "PathError",
    "ProviderError",
    "Retriever",
    "RetryMiddleware",
    "ProviderGroup",
    "ScriptedChatClient",
    "Session",
    "SqliteSessionStore",
    "SummaryStrategy",
    "TokenBudgetStrategy",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolConflictError",
    "ToolError",
    "ToolLoopError",
    "TruncationStrategy",
    "Usage",
    "WikiRetriever",
    "WorkspaceContextProvider",
    "build_provider",
    "build_providers",
    "compose",
    "load_provider_decls",
    "merge",
    "register_provider_kind",
    "parallel",
    "tool",
]
