"""The Session protocol and the request hash every session records."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol, runtime_checkable

import attrs

from raf._clients._wire import WireCache
from raf._errors import BadRequestError
from raf._values.messages import ChatMessage, PendingCall, checked_messages, messages_to_json

__all__ = ["REQUEST_HASH_LIMIT", "RequestHash", "Session", "request_hash"]

#: What ``Session.claim_pending`` returns: the calls it claimed, and those still pending.
Claimed = tuple[tuple[PendingCall, ...], tuple[PendingCall, ...]]

#: How many request digests a session keeps: the most recent ones, never more.
REQUEST_HASH_LIMIT: Final = 64
#: How much canonical message JSON :func:`request_hash` keeps, process-wide.
HASH_CACHE_BYTES: Final = 16 * 1024 * 1024


@attrs.frozen(slots=True)
class RequestHash:
    """What :meth:`Session.touch_request_hash` returns.

    ``digest`` is :func:`request_hash` of the request messages; ``repeated``
    is true when this session had already recorded the same digest (among
    its last :data:`REQUEST_HASH_LIMIT`) before this call: a client's retried
    duplicate turn, for example.

    >>> RequestHash("ab" * 32, repeated=False).repeated
    False
    """

    digest: str
    repeated: bool


@runtime_checkable
class Session(Protocol):
    """Where a conversation lives between runs.

    ``get_messages`` returns the stored history, oldest first, as a tuple;
    ``add_messages`` appends messages in one step, all or nothing;
    ``touch_request_hash`` records the hash of a run's request messages with
    the time (checked and recorded in one atomic step), keeping the last
    :data:`REQUEST_HASH_LIMIT`, and says whether it was already there;
    ``request_hashes`` returns those records, digest to the time last seen
    (unix seconds), oldest first.

    Five operations keep tool calls that wait for approval (see
    ``docs/approvals.md`` and ``docs/sessions.md``), each atomic:
    ``record_pending(messages, pending)`` appends a turn's messages and
    records its pending calls in one step; ``list_pending()`` returns the
    calls that wait, in the order recorded; ``claim_pending(tokens)`` removes
    the calls with those tokens and returns ``(claimed, still_pending)``, all
    or nothing: when one token is not pending, nothing is claimed and it
    returns ``None``, so of two callers claiming one token, one wins;
    ``claim_all_pending()`` removes and returns every pending call;
    ``add_once(key, messages, pending=())`` does what ``record_pending``
    does unless ``key`` was written to this session before, and says whether
    it wrote (a replayed durable run stores its turn once).
    """

    @property
    def id(self) -> str: ...

    async def get_messages(self) -> tuple[ChatMessage, ...]: ...

    async def add_messages(self, messages: Iterable[ChatMessage]) -> None: ...

    async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash: ...

    async def request_hashes(self) -> dict[str, float]: ...

    async def record_pending(
        self, messages: Iterable[ChatMessage], pending: Iterable[PendingCall]
    ) -> None: ...

    async def list_pending(self) -> tuple[PendingCall, ...]: ...

    async def claim_pending(self, tokens: Sequence[str]) -> Claimed | None: ...

    async def claim_all_pending(self) -> tuple[PendingCall, ...]: ...

    async def add_once(
        self, key: str, messages: Iterable[ChatMessage], pending: Iterable[PendingCall] = ()
    ) -> bool: ...


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


#: Session classes of raf's own stores: their ``get_messages`` and ``get_last_messages``
#: return snapshots built from checked or decoded messages only, which the history
#: provider passes on without a second per-message check. Exact types: a subclass may
#: override the reads, so it is checked as any other session is.
CHECKED_SESSION_TYPES: set[type] = set()


def _canonical(message: ChatMessage, index: int) -> bytes:
    return messages_to_json((message,))[1:-1].encode()


#: Each message's canonical JSON by identity, so that hashing a long input again (a
#: conversation passed whole on every turn) encodes only its new messages.
_ENCODED = WireCache(_canonical, max_bytes=HASH_CACHE_BYTES)
#: Inputs of more messages than this go through the cache.
_ENCODED_FROM = 8


def request_hash(messages: Iterable[ChatMessage]) -> str:
    """SHA-256 hex digest of the messages' canonical JSON (stable across processes).

    The digest of :func:`raf._values.messages.messages_to_json`'s text, built from
    each message's own JSON, cached by identity: a message seen before costs
    a lookup, not an encoding.

    >>> request_hash([]) == request_hash(())
    True
    """
    import hashlib  # here, not at import: it loads OpenSSL, some 2 ms

    batch = messages if type(messages) is tuple or type(messages) is list else tuple(messages)
    if len(batch) <= _ENCODED_FROM and all(type(m) is ChatMessage for m in batch):
        # A short request (most turns send one message) costs less to encode whole than
        # to cache: the same text, so the same digest.
        return hashlib.sha256(messages_to_json(batch).encode()).hexdigest()
    try:
        encoded = _ENCODED.many(batch)
    except BadRequestError as exc:  # an item that is not a ChatMessage
        raise TypeError(f"request_hash(messages): {exc}") from None
    return hashlib.sha256(b"[" + b",".join(encoded) + b"]").hexdigest()


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
    try:
        session_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"a session id must be text UTF-8 can encode; {session_id!r} holds a lone "
            f"surrogate (U+{ord(session_id[exc.start]):04X} at {exc.start})"
        ) from None
    return session_id


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
    """``add_once``'s key, checked: a non-empty str."""
    if type(key) is not str or not key:
        raise ValueError(f"an idempotency key must be a non-empty str, got {key!r}")
    return key
