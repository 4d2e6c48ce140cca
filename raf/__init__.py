"""raf: the context pipeline of LLM agents, built as an ASGI-style onion."""

import typing

from raf.agent import Agent
from raf.builtin import (
    AgentSkillsProvider,
    CompressionProvider,
    CompressionStrategy,
    FolderRetriever,
    HistoryProvider,
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
from raf.clients import EchoChatClient, ScriptedChatClient
from raf.config import (
    ContextProviderDecl,
    build_provider,
    build_providers,
    load_provider_decls,
    register_provider_kind,
)
from raf.context import AgentLike, ContextResult, Invocation, merge
from raf.errors import (
    AgentError,
    AuthenticationError,
    BadRequestError,
    ChatClientError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    CompressionError,
    ConfigError,
    ContextResultError,
    McpError,
    OfflineError,
    PathError,
    ProviderError,
    RateLimitError,
    ServerError,
    SessionStoreError,
    StreamClosedError,
    ToolArgumentsError,
    ToolConflictError,
    ToolError,
    ToolLoopError,
    ToolSchemaError,
)
from raf.messages import (
    AgentResponse,
    ChatClient,
    ChatMessage,
    StreamingChatClient,
    ToolCall,
    Update,
    Usage,
)
from raf.middleware import LoggingMiddleware, RetryMiddleware
from raf.observe import Observer, ProviderStage
from raf.options import AgentRunOptions, ChatOptions
from raf.parallel import ProviderGroup, parallel
from raf.pipeline import CallNext, ChatRequest, Middleware, compose
from raf.providers import ContextProvider, ContextProviderLike
from raf.sessions import InMemorySession, Session, SqliteSessionStore
from raf.sessions.base import RequestHash
from raf.streaming import AgentStream
from raf.tool_loop import ToolRequest
from raf.tools import FunctionTool, Tool, check_tool_arguments, check_tool_schema, tool
from raf.tracing import StageEvent, TraceObserver

if typing.TYPE_CHECKING:
    from raf.clients.openai import OpenAIChatClient as OpenAIChatClient
    from raf.clients.responses import OpenAIResponsesClient as OpenAIResponsesClient
    from raf.sessions.redis import RedisSessionStore as RedisSessionStore

__all__ = [
    "Agent",
    "AgentError",
    "AgentLike",
    "AgentResponse",
    "AgentRunOptions",
    "AgentSkillsProvider",
    "AgentStream",
    "AuthenticationError",
    "BadRequestError",
    "CallNext",
    "ChatClient",
    "ChatClientError",
    "ChatConnectionError",
    "ChatMessage",
    "ChatOptions",
    "ChatProtocolError",
    "ChatRequest",
    "ChatTimeoutError",
    "CompressionError",
    "CompressionProvider",
    "CompressionStrategy",
    "ConfigError",
    "ContextProvider",
    "ContextProviderDecl",
    "ContextProviderLike",
    "ContextResult",
    "ContextResultError",
    "EchoChatClient",
    "FolderRetriever",
    "FunctionTool",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "InMemorySession",
    "Invocation",
    "KnowledgeProvider",
    "LoggingMiddleware",
    "McpError",
    "McpToolsProvider",
    "Middleware",
    "Observer",
    "OfflineError",
    "OpenAIChatClient",
    "OpenAIResponsesClient",
    "Passage",
    "PathError",
    "ProviderError",
    "ProviderGroup",
    "ProviderStage",
    "RateLimitError",
    "RequestHash",
    "Retriever",
    "RetryMiddleware",
    "ScriptedChatClient",
    "ServerError",
    "Session",
    "SessionStoreError",
    "SqliteSessionStore",
    "StageEvent",
    "StreamClosedError",
    "StreamingChatClient",
    "SummaryStrategy",
    "TokenBudgetStrategy",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolConflictError",
    "ToolError",
    "ToolLoopError",
    "ToolRequest",
    "ToolSchemaError",
    "TraceObserver",
    "TruncationStrategy",
    "Update",
    "Usage",
    "WikiRetriever",
    "WorkspaceContextProvider",
    "build_provider",
    "build_providers",
    "check_tool_arguments",
    "check_tool_schema",
    "compose",
    "load_provider_decls",
    "merge",
    "parallel",
    "register_provider_kind",
    "tool",
]


def __getattr__(name: str) -> object:
    # The OpenAI clients are imported on first use, so that `import raf` imports none of
    # the SDK's stack (openai, httpx, pydantic): an offline agent never pays for it.
    if name in ("OpenAIChatClient", "OpenAIResponsesClient"):
        import raf.clients

        value: object = getattr(raf.clients, name)
        globals()[name] = value  # public like the rest: vars(raf) has it from now on
        return value
    # RedisSessionStore needs the optional extra raf[redis] (coredis): it is imported on
    # first use, so `import raf` never imports coredis. Not in __all__ for the same
    # reason: `from raf import *` must work without the extra.
    if name == "RedisSessionStore":
        from raf.sessions.redis import RedisSessionStore

        return RedisSessionStore
    raise AttributeError(f"module 'raf' has no attribute {name!r}")
