"""The built-in context providers, one module per kind."""

from raf.builtin.compression import (
    CompressionProvider,
    CompressionStrategy,
    SummaryStrategy,
    TokenBudgetStrategy,
    TruncationStrategy,
    approximate_tokens,
    check_tool_pairing,
    message_units,
)
from raf.builtin.history import HistoryProvider, InMemoryHistoryProvider
from raf.builtin.knowledge import (
    BM25Index,
    FolderRetriever,
    KnowledgeProvider,
    Passage,
    Retriever,
    WikiRetriever,
)
from raf.builtin.mcp import McpTool, McpToolsProvider
from raf.builtin.skills import AgentSkillsProvider, Skill
from raf.builtin.workspace import WorkspaceContextProvider

__all__ = [
    "AgentSkillsProvider",
    "BM25Index",
    "CompressionProvider",
    "CompressionStrategy",
    "FolderRetriever",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "KnowledgeProvider",
    "McpTool",
    "McpToolsProvider",
    "Passage",
    "Retriever",
    "Skill",
    "SummaryStrategy",
    "TokenBudgetStrategy",
    "TruncationStrategy",
    "WikiRetriever",
    "WorkspaceContextProvider",
    "approximate_tokens",
    "check_tool_pairing",
    "message_units",
]
