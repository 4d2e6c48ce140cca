"""Observers of a run: tracing, the mermaid drawing, the context ledger."""
