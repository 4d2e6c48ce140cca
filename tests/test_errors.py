"""raf's errors: what they say, and that they survive pickling."""

from __future__ import annotations

import pickle

import pytest

from raf import errors


@pytest.mark.parametrize(
    "error",
    [
        errors.ToolConflictError("search", "the agent", "provider 'docs'"),
        errors.ToolLoopError(3, ("search", "fetch")),
        errors.ContextResultError("messages", "a sequence of ChatMessage", 5),
        errors.ProviderError("history", "on_invoked", "OSError: disk full", field=None),
        errors.ProviderError("p", "on_invoking", "bad", field="tools[0]"),
        errors.RateLimitError("slow down", status_code=429),
        errors.SessionStoreError("corrupt file"),
        errors.AgentError("plain"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_every_error_survives_pickling_with_its_attributes_and_notes(
    error: errors.AgentError,
) -> None:
    error.add_note("raf: a note")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error)
    assert back.__dict__ == error.__dict__
    assert back.__notes__ == ["raf: a note"]
