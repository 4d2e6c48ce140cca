"""Observers of a run: tracing, the mermaid drawing, the context ledger, and replays measured
by it (the context lab)."""
