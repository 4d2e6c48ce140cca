"""The built-in context providers, one module per kind."""

from raf._builtin.compression import (
    CompressionProvider,
    CompressionStrategy,
    SummaryStrategy,
    TokenBudgetStrategy,
    TruncationStrategy,
    approximate_tokens,
    check_tool_pairing,
    message_units,
)
from raf._builtin.history import HistoryProvider, InMemoryHistoryProvider
from raf._builtin.knowledge import (
    FolderRetriever,
    KnowledgeProvider,
    Passage,
    Retriever,
    WikiRetriever,
)
from raf._builtin.mcp import McpToolsProvider
from raf._builtin.skills import AgentSkillsProvider
from raf._builtin.workspace import WorkspaceContextProvider

__all__ = [
    "AgentSkillsProvider",
    "CompressionProvider",
    "CompressionStrategy",
    "FolderRetriever",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "KnowledgeProvider",
    "McpToolsProvider",
    "Passage",
    "Retriever",
    "SummaryStrategy",
    "TokenBudgetStrategy",
    "TruncationStrategy",
    "WikiRetriever",
    "WorkspaceContextProvider",
    "approximate_tokens",
    "check_tool_pairing",
    "message_units",
]
