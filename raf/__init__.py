"""raf: the context pipeline of LLM agents, built as an ASGI-style onion."""

import importlib
import types
import typing

from raf._agent import Agent
from raf._approvals import Decision
from raf._builtin import (
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
    approximate_tokens,
    check_tool_pairing,
    message_units,
)
from raf._clients import EchoChatClient, ScriptedChatClient
from raf._config import (
    PROVIDER_KINDS,
    ContextProviderDecl,
    ProviderOptions,
    build_provider,
    build_providers,
    load_provider_decls,
    register_provider_kind,
)
from raf._context import AgentLike, ContextResult, Invocation, merge
from raf._errors import (
    AgentError,
    ApprovalError,
    AuthenticationError,
    BadRequestError,
    ChatClientError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    CompressionError,
    ConfigError,
    ContextResultError,
    DurableError,
    IncompleteResponseError,
    McpError,
    OfflineError,
    OutputError,
    OutputRefusedError,
    OutputValidationError,
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
from raf._mermaid import MermaidObserver
from raf._messages import (
    AgentResponse,
    ChatClient,
    ChatMessage,
    PendingCall,
    StreamingChatClient,
    ToolCall,
    Update,
    Usage,
)
from raf._middleware import FallbackMiddleware, LoggingMiddleware, RetryMiddleware
from raf._observe import Observer, ProviderStage
from raf._options import AgentRunOptions, ChatOptions
from raf._parallel import ProviderGroup, parallel
from raf._pipeline import CallNext, ChatRequest, Middleware, compose
from raf._providers import ContextProvider, ContextProviderLike
from raf._sessions import InMemorySession, Session, SqliteSessionStore
from raf._sessions.base import REQUEST_HASH_LIMIT, RequestHash, request_hash
from raf._streaming import AgentStream
from raf._tool_loop import ToolRequest
from raf._tools import FunctionTool, Tool, check_tool_arguments, check_tool_schema, tool
from raf._tracing import StageEvent, TraceObserver

if typing.TYPE_CHECKING:
    from raf._clients.openai import OpenAIChatClient as OpenAIChatClient
    from raf._clients.responses import OpenAIResponsesClient as OpenAIResponsesClient
    from raf._sessions.redis import RedisSessionStore as RedisSessionStore

__all__ = [
    "Agent",
    "AgentError",
    "AgentLike",
    "AgentResponse",
    "AgentRunOptions",
    "AgentSkillsProvider",
    "AgentStream",
    "ApprovalError",
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
    "Decision",
    "DurableError",
    "EchoChatClient",
    "FallbackMiddleware",
    "FolderRetriever",
    "FunctionTool",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "InMemorySession",
    "IncompleteResponseError",
    "Invocation",
    "KnowledgeProvider",
    "LoggingMiddleware",
    "McpError",
    "McpToolsProvider",
    "MermaidObserver",
    "Middleware",
    "Observer",
    "OfflineError",
    "OpenAIChatClient",
    "OpenAIResponsesClient",
    "OutputError",
    "OutputRefusedError",
    "OutputValidationError",
    "PROVIDER_KINDS",
    "Passage",
    "PathError",
    "PendingCall",
    "ProviderError",
    "ProviderGroup",
    "ProviderOptions",
    "ProviderStage",
    "REQUEST_HASH_LIMIT",
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
    "approximate_tokens",
    "build_provider",
    "build_providers",
    "check_tool_arguments",
    "check_tool_pairing",
    "check_tool_schema",
    "compose",
    "load_provider_decls",
    "merge",
    "message_units",
    "parallel",
    "register_provider_kind",
    "request_hash",
    "tool",
]

#: The installed version of raf-agents (from the package metadata; see __getattr__).
__version__: str

_LAZY = {
    "OpenAIChatClient": "raf._clients.openai",
    "OpenAIResponsesClient": "raf._clients.responses",
    "RedisSessionStore": "raf._sessions.redis",
}


def __getattr__(name: str) -> object:
    if name == "__version__":
        # The installed version, from the package metadata (read on first use: importing
        # importlib.metadata is not free, and most programs never ask).
        from raf._metadata import installed_version

        return installed_version()
    # Imported on first use: the OpenAI clients, so that `import raf` imports none of the
    # SDK's stack (openai, httpx, pydantic) and an offline agent never pays for it; and
    # RedisSessionStore, which needs the optional extra raf-agents[redis] (coredis). The
    # latter is not in __all__, so that `from raf import *` works without the extra.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raf' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module), name)
    value.__module__ = "raf"
    if name in __all__:
        globals()[name] = value  # public like the rest: vars(raf) has it from now on
    return value


# As httpx does: every public name says it is raf's, wherever it is defined.
for _name in __all__:
    _value = globals().get(_name)
    if isinstance(_value, (type, types.FunctionType)):
        _value.__module__ = "raf"
del _name, _value, types
