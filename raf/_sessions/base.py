"""What every session store shares: the checks of its arguments, the digests it keeps.

The Session protocol and the request hash are values (:mod:`raf._values`),
re-exported here for the stores.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol, TypeGuard

from raf._values.messages import ChatMessage, PendingCall, checked_messages, request_hash
from raf._values.protocols import Claimed as Claimed  # re-exported for the stores
from raf._values.protocols import RequestHash, Session

__all__ = ["REQUEST_HASH_LIMIT", "RequestHash", "Session", "request_hash"]

#: How many request digests a session keeps: the most recent ones, never more.
REQUEST_HASH_LIMIT: Final = 64


#: The methods a session needs to keep tool calls that wait for approval.
PENDING_METHODS: Final = (
    "record_pending",
    "list_pending",
    "claim_pending",
    "claim_all_pending",
    "add_once",
)
#: Session type -> the pending methods it lacks; filled once per type.
_MISSING: dict[type, tuple[str, ...]] = {}


def missing_pending(session: object) -> tuple[str, ...]:
    """The :data:`PENDING_METHODS` that ``session``'s type lacks (looked up once per type)."""
    kind = type(session)
    missing = _MISSING.get(kind)
    if missing is None:
        missing = tuple(n for n in PENDING_METHODS if not callable(getattr(session, n, None)))
        _MISSING[kind] = missing
    return missing


def require_pending(session: object, why: str) -> None:
    """A ``TypeError`` naming the pending methods ``session`` lacks, when it lacks any."""
    missing = missing_pending(session)
    if missing:
        raise TypeError(
            f"session {type(session).__name__} cannot keep tool calls that wait for approval "
            f"({why}): it has no {', '.join(m + '()' for m in missing)} (see docs/sessions.md)"
        )


def checked_count(count: object) -> int:
    """``get_last_messages(count)``'s argument, checked: a non-negative int.

    >>> checked_count(-1)
    Traceback (most recent call last):
    ValueError: get_last_messages(count) must be an int >= 0, got -1
    """
    if type(count) is not int or count < 0:
        raise ValueError(f"get_last_messages(count) must be an int >= 0, got {count!r}")
    return count


def checked_session_id(session_id: object) -> str:
    """``session_id`` if it is a non-empty str a store can write, else a ``ValueError``.

    A lone surrogate (``"\\ud800"``: JSON escapes and ``surrogateescape`` make
    them) cannot be encoded as UTF-8, so no store could write it: refused here,
    not as a raw ``UnicodeEncodeError`` from the first write.

    >>> checked_session_id("a\\ud800")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: a session id must be text UTF-8 can encode; ... (U+D800 at 1)
    """
    if type(session_id) is not str or not session_id:
        raise ValueError(f"session id must be a non-empty str, got {session_id!r}")
    return _encodable(session_id, "a session id")


def _encodable(text: str, what: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} must be text UTF-8 can encode; {text!r} holds a lone "
            f"surrogate (U+{ord(text[exc.start]):04X} at {exc.start})"
        ) from None
    return text


def checked_batch(messages: Iterable[ChatMessage]) -> tuple[ChatMessage, ...]:
    """``messages`` as a tuple, every item checked before anything is stored.

    A store calls it first in ``add_messages``, so one bad item rejects the
    whole call with a ``TypeError`` that names its index; a lone message or
    a string where a batch belongs is named as such.

    >>> checked_batch([ChatMessage.user("hi"), "oops"])
    Traceback (most recent call last):
    TypeError: add_messages(messages)[1] must be a ChatMessage, got str
    """
    if isinstance(messages, (str, bytes, ChatMessage)):
        raise TypeError(
            f"add_messages(messages) must be an iterable of ChatMessage, "
            f"got {type(messages).__name__}"
        )
    return checked_messages(messages, "add_messages(messages)")


def checked_pending(
    messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
) -> tuple[tuple[ChatMessage, ...], tuple[PendingCall, ...]]:
    """``record_pending``'s arguments as tuples, every item checked before anything is stored.

    >>> checked_pending([], ["token"])
    Traceback (most recent call last):
    TypeError: record_pending(pending)[0] must be a PendingCall, got str
    """
    batch = checked_batch(messages)
    if isinstance(pending, (str, bytes, PendingCall)):
        raise TypeError(
            f"record_pending(pending) must be an iterable of PendingCall, "
            f"got {type(pending).__name__}"
        )
    calls = tuple(pending)
    for index, call in enumerate(calls):
        if type(call) is not PendingCall:
            raise TypeError(
                f"record_pending(pending)[{index}] must be a PendingCall, got {type(call).__name__}"
            )
        # The values layer replaces lone surrogates in what a call says, not in its token.
        _encodable(call.token, f"record_pending(pending)[{index}].token")
        if type(call.run_id) is str:
            _encodable(call.run_id, f"record_pending(pending)[{index}].run_id")
    return batch, calls


def checked_tokens(tokens: Sequence[str]) -> tuple[str, ...]:
    """``claim_pending``'s tokens as a tuple, at least one, each checked to be a str.

    >>> checked_tokens(["a", 1])
    Traceback (most recent call last):
    TypeError: claim_pending(tokens)[1] must be a str, got int
    """
    if isinstance(tokens, (str, bytes)) or tokens is None:
        raise TypeError(f"claim_pending(tokens) must be a sequence of str, got {tokens!r:.40}")
    checked = tuple(tokens)
    if not checked:
        raise ValueError("claim_pending(tokens) needs a token; list_pending() lists the calls")
    for index, token in enumerate(checked):
        if type(token) is not str:
            raise TypeError(
                f"claim_pending(tokens)[{index}] must be a str, got {type(token).__name__}"
            )
    return checked


def checked_key(key: str) -> str:
    """``add_once``'s key, checked: a non-empty str UTF-8 can encode."""
    if type(key) is not str or not key:
        raise ValueError(f"an idempotency key must be a non-empty str, got {key!r}")
    return _encodable(key, "an idempotency key")


#: The methods a session needs to keep the full results that ToolOutputLimit cut.
SPILL_METHODS: Final = ("spill_tool_result", "spilled_tool_result")


class SpillKeeper(Protocol):
    """A session that keeps the full results :class:`raf.ToolOutputLimit` cut (every store
    of raf's does): ``spill_tool_result`` keeps one under its call id (replacing one kept
    before), ``spilled_tool_result`` returns it, or ``None`` when none is kept."""

    async def spill_tool_result(self, call_id: str, text: str) -> None: ...

    async def spilled_tool_result(self, call_id: str) -> str | None: ...


def keeps_spills(session: object) -> TypeGuard[SpillKeeper]:
    """Whether ``session`` can keep spilled tool results (it has :data:`SPILL_METHODS`)."""
    return all(callable(getattr(session, name, None)) for name in SPILL_METHODS)


def checked_call_id(call_id: object) -> str:
    """A spilled result's call id, checked: a non-empty str UTF-8 can encode.

    >>> checked_call_id("")
    Traceback (most recent call last):
    ValueError: a tool call id must be a non-empty str, got ''
    """
    if type(call_id) is not str or not call_id:
        raise ValueError(f"a tool call id must be a non-empty str, got {call_id!r}")
    return _encodable(call_id, "a tool call id")


def checked_spill(call_id: object, text: object) -> tuple[str, str]:
    """``spill_tool_result``'s arguments, checked: a call id and the result's text."""
    if type(text) is not str:
        raise TypeError(f"spill_tool_result(text) must be a str, got {type(text).__name__}")
    return checked_call_id(call_id), _encodable(text, "a spilled tool result")
