"""raf's errors: what they say, and that they survive pickling."""

from __future__ import annotations

import pickle
import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest

import raf
from raf import AgentResponse, ChatMessage, Usage
from raf import errors as errors


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
        errors.StreamClosedError(AgentResponse((ChatMessage.assistant("Hel"),))),
        errors.ChatTimeoutError("timed out", status_code=408, retry_after=1.5),
        errors.OfflineError("raf_offline: this test may not reach example.com:443"),
        errors.ToolArgumentsError("search", ("query: Field required",)),
        errors.PathError("the path '../x' uses '..'"),
        errors.IncompleteResponseError(
            "cut", reason="length", partial=AgentResponse((ChatMessage.assistant("Hel"),))
        ),
        errors.UsageLimitExceeded(
            "max_requests", "two calls", spent=Usage(3, 4), cost=Decimal("0.5"), requests=2
        ),
        errors.BudgetExceeded(
            raf.Budget("0.5", "day", "key"),
            Decimal("0.5"),
            datetime(2026, 1, 2, tzinfo=UTC),
            scope="k1",
        ),
        errors.ContextOverflowError(
            "too long", input_tokens=130_000, max_tokens=128_000, status_code=400
        ),
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


def test_the_error_tree() -> None:
    exported = {name: getattr(errors, name) for name in errors.__all__}
    for name, cls in exported.items():
        assert issubclass(cls, errors.AgentError), name
        # The common ones are also at the top; the rest live in raf.errors alone.
        assert getattr(raf, name, cls) is cls, name
    tool_errors = {name for name in exported if name.startswith("Tool")} | {"PathError"}
    assert {name for name, cls in exported.items() if issubclass(cls, errors.ToolError)} == (
        tool_errors
    )
    assert issubclass(errors.ChatTimeoutError, TimeoutError)
    assert issubclass(errors.ContextResultError, TypeError)
    assert issubclass(errors.ToolArgumentsError, ValueError)
    assert issubclass(errors.ToolSchemaError, ValueError)
    assert issubclass(errors.OfflineError, ConnectionRefusedError)
    chat = {name for name, cls in exported.items() if issubclass(cls, errors.ChatClientError)}
    assert chat == {
        "ChatClientError",
        "RateLimitError",
        "ChatTimeoutError",
        "ChatConnectionError",
        "ServerError",
        "ChatProtocolError",
        "IncompleteResponseError",
        "BadRequestError",
        "AuthenticationError",
        "ContextOverflowError",
    }


def test_the_tree_is_drawn_in_the_docstring() -> None:
    # Each drawn line is "<indent>[├└]── Name   what it is"; AgentError is the root. A name
    # ends in Error, or in Exceeded for a limit (the design's UsageLimitExceeded, BudgetExceeded).
    drawn = {
        match.group(2): len(match.group(1))
        for match in re.finditer(
            r"^( *(?:[│ ]   )*(?:[├└]── )?)(\w+(?:Error|Exceeded))\b", errors.__doc__ or "", re.M
        )
    }
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert name in drawn, name
        if cls is not errors.AgentError:
            # drawn one level (four columns) below its first parent
            assert drawn[name] == drawn[cls.__mro__[1].__name__] + 4, name


def test_a_chat_timeout_is_caught_as_a_timeout() -> None:
    with pytest.raises(TimeoutError):
        raise errors.ChatTimeoutError("the request timed out")
    assert errors.ChatTimeoutError("x").retryable
    assert str(errors.ChatTimeoutError("x", status_code=408)) == "x"
