"""raf: the context pipeline of LLM agents, built as an ASGI-style onion."""

from typing import TYPE_CHECKING

from raf.agent import Agent, ChatClient
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
from raf.messages import AgentResponse, ChatMessage, Messages, ToolCall, Usage
from raf.middleware import LoggingMiddleware, RetryMiddleware
from raf.options import AgentRunOptions, ChatOptions
from raf.parallel import ProviderGroup, parallel
from raf.pipeline import ChatRequest, Complete, Middleware, compose
from raf.providers import ContextProvider
from raf.sessions import InMemorySession, Session, SqliteSessionStore
from raf.tools import FunctionTool, Tool, tool

if TYPE_CHECKING:
    from raf.sessions.redis import RedisSessionStore as RedisSessionStore

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
    "Messages",
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


def __getattr__(name: str) -> object:
    # RedisSessionStore needs the optional extra raf[redis] (coredis): it is imported on
    # first use, so `import raf` never imports coredis. Not in __all__ for the same
    # reason: `from raf import *` must work without the extra.
    if name == "RedisSessionStore":
        from raf.sessions.redis import RedisSessionStore

        return RedisSessionStore
    raise AttributeError(f"module 'raf' has no attribute {name!r}")
