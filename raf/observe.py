"""Observers that watch every run, the context ledger, and the records they hand out.

``Agent(..., observers=[TraceObserver(print)])``: an observer's hooks wrap each run,
provider stage, model call, tool call and guardrail check (see :class:`Observer`).
"""

from raf._observers.ledger import ContextLedger, LedgerEntry, LedgerPart
from raf._observers.mermaid import MermaidObserver
from raf._observers.replay_report import ReplayCall, ReplayDivergence, ReplayReport
from raf._observers.tracing import StageEvent, TraceObserver
from raf._onion.observe import Observer, ProviderStage
from raf._public import say_home as _say_home

__all__ = [
    "ContextLedger",
    "LedgerEntry",
    "LedgerPart",
    "MermaidObserver",
    "Observer",
    "ProviderStage",
    "ReplayCall",
    "ReplayDivergence",
    "ReplayReport",
    "StageEvent",
    "TraceObserver",
]

_say_home(__name__, (globals()[name] for name in __all__))
