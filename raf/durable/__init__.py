"""Durable runs on DBOS Transact (extra ``raf-agents[dbos]``; asyncio only).

``dbos_agent(agent)`` wraps ``agent``: its run is one DBOS workflow, its
model calls and tool calls DBOS steps (``raf.model``, ``raf.tool.NAME``),
its updates a DBOS stream: a worker that dies in the middle of a tool loop is
recovered by the next worker that launches DBOS, without repeating what
completed. A run whose calls wait for approval waits for the decisions
inside DBOS (``DBOS.recv``), and a decision reaches it from any process.
raf never configures or launches DBOS: the application does, after
building its durable agents. See ``docs/durable.md``.
"""

from __future__ import annotations

from raf.durable._agent import DurableAgent, dbos_agent
from raf.durable._sessions import SessionRef
from raf.durable._workflow import idempotency_key

__all__ = ["DurableAgent", "SessionRef", "dbos_agent", "idempotency_key"]
