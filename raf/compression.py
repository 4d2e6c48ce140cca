"""The strategies of :class:`raf.CompressionProvider`, and the token helpers they use.

``CompressionProvider(TruncationStrategy(keep_last=20))``: a strategy decides what of a
long history the model sees; :func:`message_units` keeps a tool call with its results.
"""

from raf._providers.compression import (
    CompressionStrategy,
    SummaryStrategy,
    TokenBudgetStrategy,
    TruncationStrategy,
    check_tool_pairing,
)
from raf._public import say_home as _say_home
from raf._sessions.tokens import approximate_tokens, message_units

__all__ = [
    "CompressionStrategy",
    "SummaryStrategy",
    "TokenBudgetStrategy",
    "TruncationStrategy",
    "approximate_tokens",
    "check_tool_pairing",
    "message_units",
]

_say_home(__name__, (globals()[name] for name in __all__))
