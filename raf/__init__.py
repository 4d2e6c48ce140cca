"""raf: the context pipeline of LLM agents, built as an ASGI-style onion.

``raf`` holds the names a user writes in an agent; the rest live in small public
modules: :mod:`raf.errors` (every exception; the common ones also here),
:mod:`raf.observe` (observers, the ledger and their records), :mod:`raf.config`
(declarations and the registry of provider kinds) and :mod:`raf.compression`
(strategies and token helpers). Each name is defined once below and listed once in
``__all__``; a name that moved says where it lives now.
"""

import importlib
import typing

from raf._agent.agent import Agent
from raf._agent.as_tool import AgentTool
from raf._agent.streaming import AgentStream
from raf._agent.tools import FunctionTool, check_tool_arguments, check_tool_schema, tool
from raf._onion.compose import CallNext, ContextProvider, compose
from raf._onion.parallel import ProviderGroup, parallel
from raf._public import say_home as _say_home
from raf._sessions.base import REQUEST_HASH_LIMIT
from raf._sessions.history import HistoryProvider
from raf._sessions.memory import InMemorySession, InMemorySessionStore
from raf._values.carried import Compaction
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
from raf._values.run import Run
from raf._values.verdict import GuardrailCheck, GuardrailContext, Verdict
from raf.errors import (
    AgentError,
    BudgetExceeded,
    ChatClientError,
    ContextOverflowError,
    GuardrailError,
    OutputError,
    ProviderError,
    StreamClosedError,
    ToolError,
    UsageLimitExceeded,
)

if typing.TYPE_CHECKING:
    # What loads late (_LATE below), for type checkers and the docs: each module's
    # __all__ is the names _LATE gives it, no more.
    from raf import compression as compression
    from raf import config as config
    from raf import observe as observe
    from raf._clients.anthropic import *
    from raf._clients.echo import *
    from raf._clients.embeddings import *
    from raf._clients.gemini import *
    from raf._clients.openai import *
    from raf._clients.responses import *
    from raf._clients.scripted import *
    from raf._middleware.compaction import *
    from raf._middleware.fallback import *
    from raf._middleware.guardrails import *
    from raf._middleware.limits import *
    from raf._middleware.logging import *
    from raf._middleware.pii import *
    from raf._middleware.retry import *
    from raf._middleware.spend import *
    from raf._middleware.tool_outputs import *
    from raf._observers.replay import *
    from raf._providers.a2a import *
    from raf._providers.clearing import *

    # Its module also holds the strategies, which are raf.compression's.
    from raf._providers.compression import CompressionProvider as CompressionProvider
    from raf._providers.knowledge import *
    from raf._providers.mcp import *
    from raf._providers.memory import *
    from raf._providers.skills import *
    from raf._providers.workspace import *
    from raf._sessions.memories import *
    from raf._sessions.postgres import *
    from raf._sessions.redis import *
    from raf._sessions.sqlite import *
    from raf._values.prices import *

__all__ = [
    "A2AAgentTool",
    "Agent",
    "AgentError",
    "AgentLike",
    "AgentResponse",
    "AgentRunOptions",
    "AgentSkillsProvider",
    "AgentStream",
    "AgentTool",
    "AnthropicChatClient",
    "Budget",
    "BudgetExceeded",
    "CallNext",
    "ChatClient",
    "ChatClientError",
    "ChatMessage",
    "ChatOptions",
    "ChatRequest",
    "ClearToolResults",
    "Compaction",
    "CompactionMiddleware",
    "CompressionProvider",
    "ContextOverflowError",
    "ContextProvider",
    "ContextProviderLike",
    "ContextResult",
    "Decision",
    "EchoChatClient",
    "FallbackMiddleware",
    "FolderRetriever",
    "FunctionTool",
    "GuardrailCheck",
    "GuardrailContext",
    "GuardrailError",
    "HistoryProvider",
    "InMemoryMemories",
    "InMemorySession",
    "InMemorySessionStore",
    "InputGuardrail",
    "Invocation",
    "KnowledgeProvider",
    "LoggingMiddleware",
    "LongTermMemory",
    "McpToolsProvider",
    "Middleware",
    "OpenAIChatClient",
    "OpenAIEmbedder",
    "OpenAIResponsesClient",
    "OutputError",
    "OutputGuardrail",
    "Passage",
    "PendingCall",
    "Prices",
    "ProviderError",
    "ProviderGroup",
    "REQUEST_HASH_LIMIT",
    "Reasoning",
    "RequestHash",
    "Retriever",
    "RetryMiddleware",
    "Run",
    "ScriptedChatClient",
    "Session",
    "SpendLimits",
    "SqliteSessionStore",
    "StreamClosedError",
    "StreamingChatClient",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolGuardrail",
    "ToolOutputLimit",
    "ToolRequest",
    "Update",
    "Usage",
    "UsageLimitExceeded",
    "UsageLimits",
    "Verdict",
    "WikiRetriever",
    "WorkspaceContextProvider",
    "check_tool_arguments",
    "check_tool_schema",
    "compose",
    "merge",
    "parallel",
    "pii_redactor",
    "replay",
    "request_hash",
    "tool",
]

#: The installed version of raf-agents (from the package metadata; see __getattr__).
__version__: str

#: What `import raf` leaves out, loaded on first use: name -> the module that defines it.
#: The core (agent, run, pipeline, tools, sessions' base) is imported above; the built-in
#: providers, the stores, the clients and the middleware are here, so that a program pays
#: for what it touches: the OpenAI clients import the SDK's stack (openai, httpx,
#: pydantic), AnthropicChatClient the optional extra raf-agents[anthropic] (once a client
#: is built), SqliteSessionStore sqlite3. RedisSessionStore (raf-agents[redis]),
#: PostgresSessionStore (raf-agents[postgres]) and GeminiChatClient (raf-agents[gemini])
#: import their extra with their module: they are not in __all__, so that
#: `from raf import *` works without the extras.
_LATE = {
    "A2AAgentTool": "raf._providers.a2a",
    "AgentSkillsProvider": "raf._providers.skills",
    "AnthropicChatClient": "raf._clients.anthropic",
    "ClearToolResults": "raf._providers.clearing",
    "CompactionMiddleware": "raf._middleware.compaction",
    "CompressionProvider": "raf._providers.compression",
    "EchoChatClient": "raf._clients.echo",
    "FallbackMiddleware": "raf._middleware.fallback",
    "FolderRetriever": "raf._providers.knowledge",
    "GeminiChatClient": "raf._clients.gemini",
    "InMemoryMemories": "raf._sessions.memories",
    "InputGuardrail": "raf._middleware.guardrails",
    "KnowledgeProvider": "raf._providers.knowledge",
    "LoggingMiddleware": "raf._middleware.logging",
    "LongTermMemory": "raf._providers.memory",
    "McpToolsProvider": "raf._providers.mcp",
    "OpenAIChatClient": "raf._clients.openai",
    "OpenAIEmbedder": "raf._clients.embeddings",
    "OpenAIResponsesClient": "raf._clients.responses",
    "OutputGuardrail": "raf._middleware.guardrails",
    "Passage": "raf._providers.knowledge",
    "PostgresSessionStore": "raf._sessions.postgres",
    "Prices": "raf._values.prices",
    "RedisSessionStore": "raf._sessions.redis",
    "Budget": "raf._middleware.spend",
    "Retriever": "raf._providers.knowledge",
    "RetryMiddleware": "raf._middleware.retry",
    "ScriptedChatClient": "raf._clients.scripted",
    "SpendLimits": "raf._middleware.spend",
    "SqliteSessionStore": "raf._sessions.sqlite",
    "ToolGuardrail": "raf._middleware.guardrails",
    "ToolOutputLimit": "raf._middleware.tool_outputs",
    "UsageLimits": "raf._middleware.limits",
    "WikiRetriever": "raf._providers.knowledge",
    "WorkspaceContextProvider": "raf._providers.workspace",
    "pii_redactor": "raf._middleware.pii",
    "replay": "raf._observers.replay",
}

#: The public modules reached as attributes of raf (`raf.observe.TraceObserver`),
#: imported on first use like the names above. raf.errors is imported with raf.
_MODULES = ("compression", "config", "observe")

#: Names that left the top of raf, and the public module that holds each now
#: (see CHANGELOG.md); raf.X raises an AttributeError that says so.
_MOVED = {
    **dict.fromkeys(
        (
            "ApprovalError",
            "AuthenticationError",
            "BadRequestError",
            "ChatConnectionError",
            "ChatProtocolError",
            "ChatTimeoutError",
            "CompressionError",
            "ConfigError",
            "ContextResultError",
            "DurableError",
            "IncompleteResponseError",
            "McpError",
            "OfflineError",
            "OutputRefusedError",
            "OutputValidationError",
            "PathError",
            "RateLimitError",
            "ServerError",
            "SessionStoreError",
            "ToolArgumentsError",
            "ToolConflictError",
            "ToolLoopError",
            "ToolSchemaError",
        ),
        "raf.errors",
    ),
    **dict.fromkeys(
        (
            "ContextLedger",
            "LedgerEntry",
            "LedgerPart",
            "MermaidObserver",
            "Observer",
            "ProviderStage",
            "StageEvent",
            "TraceObserver",
        ),
        "raf.observe",
    ),
    **dict.fromkeys(
        (
            "PROVIDER_KINDS",
            "ContextProviderDecl",
            "ProviderOptions",
            "build_provider",
            "build_providers",
            "load_provider_decls",
            "register_provider_kind",
        ),
        "raf.config",
    ),
    **dict.fromkeys(
        (
            "CompressionStrategy",
            "SummaryStrategy",
            "TokenBudgetStrategy",
            "TruncationStrategy",
            "approximate_tokens",
            "check_tool_pairing",
            "message_units",
        ),
        "raf.compression",
    ),
}

#: Names removed from the public surface, and what to write instead.
_REMOVED = {
    "InMemoryHistoryProvider": "it was another name for raf.HistoryProvider; use that",
}


def __getattr__(name: str) -> object:
    if name == "__version__":
        # The installed version, from the package metadata (read on first use: importing
        # importlib.metadata is not free, and most programs never ask).
        from raf._metadata import installed_version

        return installed_version()
    module = _LATE.get(name)
    if module is not None:
        value: object = getattr(importlib.import_module(module), name)
        _say_home("raf", (value,))
        if name in __all__:
            globals()[name] = value  # public like the rest: vars(raf) has it from now on
        return value
    if name in _MODULES:
        return importlib.import_module(f"raf.{name}")  # the import makes it raf's attribute
    if name in _MOVED:
        home = _MOVED[name]
        raise AttributeError(
            f"raf.{name} moved to {home}.{name} (from {home} import {name})", name=name
        )
    if name in _REMOVED:
        raise AttributeError(f"raf.{name} was removed: {_REMOVED[name]}", name=name)
    raise AttributeError(f"module 'raf' has no attribute {name!r}", name=name)


def __dir__() -> list[str]:
    # The names loaded late and the public modules too, loaded or not, as for the rest.
    return sorted({*globals(), *_LATE, *_MODULES})


_say_home(__name__, (globals()[name] for name in __all__ if name not in _LATE))
