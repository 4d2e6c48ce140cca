"""raf: the context pipeline of LLM agents, built as an ASGI-style onion."""

import importlib
import types
import typing

from raf._agent.agent import Agent
from raf._agent.streaming import AgentStream
from raf._agent.tools import FunctionTool, check_tool_arguments, check_tool_schema, tool
from raf._onion.compose import CallNext, ContextProvider, compose
from raf._onion.observe import Observer, ProviderStage
from raf._onion.parallel import ProviderGroup, parallel
from raf._sessions.base import REQUEST_HASH_LIMIT
from raf._sessions.memory import InMemorySession
from raf._values.client import ChatClient, StreamingChatClient
from raf._values.context import (
    AgentLike,
    ChatRequest,
    ContextProviderLike,
    ContextResult,
    Invocation,
    ToolRequest,
    merge,
)
from raf._values.decision import Decision
from raf._values.messages import (
    AgentResponse,
    ChatMessage,
    PendingCall,
    Reasoning,
    ToolCall,
    Update,
    Usage,
    request_hash,
)
from raf._values.options import AgentRunOptions, ChatOptions
from raf._values.protocols import Middleware, RequestHash, Session, Tool
from raf._values.verdict import GuardrailCheck, GuardrailContext, Verdict
from raf.errors import (
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
    GuardrailError,
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

if typing.TYPE_CHECKING:
    # Loaded on first use (see _LAZY below); imported here for type checkers and the docs.
    from raf._clients.anthropic import AnthropicChatClient as AnthropicChatClient
    from raf._clients.echo import EchoChatClient as EchoChatClient
    from raf._clients.gemini import GeminiChatClient as GeminiChatClient
    from raf._clients.openai import OpenAIChatClient as OpenAIChatClient
    from raf._clients.responses import OpenAIResponsesClient as OpenAIResponsesClient
    from raf._clients.scripted import ScriptedChatClient as ScriptedChatClient
    from raf._config.declarations import PROVIDER_KINDS as PROVIDER_KINDS
    from raf._config.declarations import ContextProviderDecl as ContextProviderDecl
    from raf._config.declarations import ProviderOptions as ProviderOptions
    from raf._config.declarations import build_provider as build_provider
    from raf._config.declarations import build_providers as build_providers
    from raf._config.declarations import load_provider_decls as load_provider_decls
    from raf._config.declarations import register_provider_kind as register_provider_kind
    from raf._middleware.fallback import FallbackMiddleware as FallbackMiddleware
    from raf._middleware.guardrails import InputGuardrail as InputGuardrail
    from raf._middleware.guardrails import OutputGuardrail as OutputGuardrail
    from raf._middleware.guardrails import ToolGuardrail as ToolGuardrail
    from raf._middleware.logging import LoggingMiddleware as LoggingMiddleware
    from raf._middleware.pii import pii_redactor as pii_redactor
    from raf._middleware.retry import RetryMiddleware as RetryMiddleware
    from raf._observers.ledger import ContextLedger as ContextLedger
    from raf._observers.ledger import LedgerEntry as LedgerEntry
    from raf._observers.ledger import LedgerPart as LedgerPart
    from raf._observers.mermaid import MermaidObserver as MermaidObserver
    from raf._observers.tracing import StageEvent as StageEvent
    from raf._observers.tracing import TraceObserver as TraceObserver
    from raf._providers.a2a import A2AAgentTool as A2AAgentTool
    from raf._providers.compression import CompressionProvider as CompressionProvider
    from raf._providers.compression import CompressionStrategy as CompressionStrategy
    from raf._providers.compression import SummaryStrategy as SummaryStrategy
    from raf._providers.compression import TokenBudgetStrategy as TokenBudgetStrategy
    from raf._providers.compression import TruncationStrategy as TruncationStrategy
    from raf._providers.compression import approximate_tokens as approximate_tokens
    from raf._providers.compression import check_tool_pairing as check_tool_pairing
    from raf._providers.compression import message_units as message_units
    from raf._providers.knowledge import FolderRetriever as FolderRetriever
    from raf._providers.knowledge import KnowledgeProvider as KnowledgeProvider
    from raf._providers.knowledge import Passage as Passage
    from raf._providers.knowledge import Retriever as Retriever
    from raf._providers.knowledge import WikiRetriever as WikiRetriever
    from raf._providers.mcp import McpToolsProvider as McpToolsProvider
    from raf._providers.skills import AgentSkillsProvider as AgentSkillsProvider
    from raf._providers.workspace import WorkspaceContextProvider as WorkspaceContextProvider
    from raf._sessions.history import HistoryProvider as HistoryProvider
    from raf._sessions.history import InMemoryHistoryProvider as InMemoryHistoryProvider
    from raf._sessions.postgres import PostgresSessionStore as PostgresSessionStore
    from raf._sessions.redis import RedisSessionStore as RedisSessionStore
    from raf._sessions.sqlite import SqliteSessionStore as SqliteSessionStore

__all__ = [
    "A2AAgentTool",
    "Agent",
    "AgentError",
    "AgentLike",
    "AgentResponse",
    "AgentRunOptions",
    "AgentSkillsProvider",
    "AgentStream",
    "AnthropicChatClient",
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
    "ContextLedger",
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
    "GuardrailCheck",
    "GuardrailContext",
    "GuardrailError",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "InMemorySession",
    "IncompleteResponseError",
    "InputGuardrail",
    "Invocation",
    "KnowledgeProvider",
    "LedgerEntry",
    "LedgerPart",
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
    "OutputGuardrail",
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
    "Reasoning",
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
    "ToolGuardrail",
    "ToolLoopError",
    "ToolRequest",
    "ToolSchemaError",
    "TraceObserver",
    "TruncationStrategy",
    "Update",
    "Usage",
    "Verdict",
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
    "pii_redactor",
    "register_provider_kind",
    "request_hash",
    "tool",
]

#: The installed version of raf-agents (from the package metadata; see __getattr__).
__version__: str

#: What `import raf` leaves out, loaded on first use: name -> the module that defines it.
#: The core (agent, run, pipeline, tools, sessions' base) is imported above; the built-in
#: providers, the stores, the clients, the config, the observers and the middleware are
#: here, so that a program pays for what it touches: the OpenAI clients import the SDK's
#: stack (openai, httpx, pydantic), AnthropicChatClient the optional extra
#: raf-agents[anthropic] (once a client is built), SqliteSessionStore sqlite3, RedisSessionStore the
#: optional extra raf-agents[redis] (coredis), PostgresSessionStore raf-agents[postgres]
#: (psycopg) and GeminiChatClient raf-agents[gemini] (google-genai); none is in __all__,
#: so that `from raf import *` works without the extras.
_LAZY = {
    "A2AAgentTool": "raf._providers.a2a",
    "AgentSkillsProvider": "raf._providers.skills",
    "AnthropicChatClient": "raf._clients.anthropic",
    "CompressionProvider": "raf._providers.compression",
    "CompressionStrategy": "raf._providers.compression",
    "ContextProviderDecl": "raf._config.declarations",
    "EchoChatClient": "raf._clients.echo",
    "FallbackMiddleware": "raf._middleware.fallback",
    "InputGuardrail": "raf._middleware.guardrails",
    "OutputGuardrail": "raf._middleware.guardrails",
    "ToolGuardrail": "raf._middleware.guardrails",
    "pii_redactor": "raf._middleware.pii",
    "FolderRetriever": "raf._providers.knowledge",
    "GeminiChatClient": "raf._clients.gemini",
    "HistoryProvider": "raf._sessions.history",
    "InMemoryHistoryProvider": "raf._sessions.history",
    "KnowledgeProvider": "raf._providers.knowledge",
    "LoggingMiddleware": "raf._middleware.logging",
    "McpToolsProvider": "raf._providers.mcp",
    "ContextLedger": "raf._observers.ledger",
    "LedgerEntry": "raf._observers.ledger",
    "LedgerPart": "raf._observers.ledger",
    "MermaidObserver": "raf._observers.mermaid",
    "OpenAIChatClient": "raf._clients.openai",
    "OpenAIResponsesClient": "raf._clients.responses",
    "PROVIDER_KINDS": "raf._config.declarations",
    "Passage": "raf._providers.knowledge",
    "PostgresSessionStore": "raf._sessions.postgres",
    "ProviderOptions": "raf._config.declarations",
    "RedisSessionStore": "raf._sessions.redis",
    "Retriever": "raf._providers.knowledge",
    "RetryMiddleware": "raf._middleware.retry",
    "ScriptedChatClient": "raf._clients.scripted",
    "SqliteSessionStore": "raf._sessions.sqlite",
    "StageEvent": "raf._observers.tracing",
    "SummaryStrategy": "raf._providers.compression",
    "TokenBudgetStrategy": "raf._providers.compression",
    "TraceObserver": "raf._observers.tracing",
    "TruncationStrategy": "raf._providers.compression",
    "WikiRetriever": "raf._providers.knowledge",
    "WorkspaceContextProvider": "raf._providers.workspace",
    "approximate_tokens": "raf._providers.compression",
    "build_provider": "raf._config.declarations",
    "build_providers": "raf._config.declarations",
    "check_tool_pairing": "raf._providers.compression",
    "load_provider_decls": "raf._config.declarations",
    "message_units": "raf._providers.compression",
    "register_provider_kind": "raf._config.declarations",
}


def __getattr__(name: str) -> object:
    if name == "__version__":
        # The installed version, from the package metadata (read on first use: importing
        # importlib.metadata is not free, and most programs never ask).
        from raf._metadata import installed_version

        return installed_version()
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'raf' has no attribute {name!r}")
    value: object = getattr(importlib.import_module(module), name)
    _say_raf(value)
    if name in __all__:
        globals()[name] = value  # public like the rest: vars(raf) has it from now on
    return value


def __dir__() -> list[str]:
    # The lazy names too, loaded or not, as for the rest of the public surface.
    return sorted({*globals(), *_LAZY})


def _say_raf(value: object) -> None:
    # As httpx does: every public class and function says it is raf's, wherever defined.
    if isinstance(value, (type, types.FunctionType)):
        value.__module__ = "raf"


for _name in __all__:
    _say_raf(globals().get(_name))
del _name
