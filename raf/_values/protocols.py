"""The protocols: Tool, Session (and what it returns, RequestHash), Middleware, HistoryKeeper.

They live with the values so that a value can name a tool or a session
without importing the code that makes tools or keeps sessions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs

from raf._values.messages import AgentResponse, ChatMessage, PendingCall

__all__ = ["CallNext", "Middleware", "RequestHash", "Session", "Tool"]

Request = TypeVar("Request")
Request_contra = TypeVar("Request_contra", contravariant=True)

#: The inner rest of a stack: ``await call_next(request)`` runs it.
CallNext = Callable[[Request], Awaitable[AgentResponse]]


class Middleware(Protocol[Request_contra]):
    """``async (request, call_next) -> AgentResponse``.

    In the run stack the request is an :class:`raf.Invocation`; in the chat
    stack it is a :class:`raf.ChatRequest`. Call ``call_next`` once to go on
    inward, more than once to retry, or not at all to answer yourself.
    """

    async def __call__(
        self, request: Request_contra, call_next: CallNext[Any], /
    ) -> AgentResponse: ...


#: What ``Session.claim_pending`` returns: the calls it claimed, and those still pending.
Claimed = tuple[tuple[PendingCall, ...], tuple[PendingCall, ...]]


class HistoryKeeper(Protocol):
    """A stack item that stores each run's turns in the session, deferred calls included.

    Deferred calls need one (a waiting call is kept with its turn); the agent
    looks for this mark on its stack items (and their groups' members), so
    :class:`raf.HistoryProvider`, or any provider of a user's that stores the
    same way, makes approvals possible, and the agent imports neither.
    """

    #: True: the item stores every turn (its calls that wait with ``record_pending``).
    keeps_history: bool


def keeps_history(item: object) -> bool:
    """Whether ``item`` is a :class:`HistoryKeeper` (its ``keeps_history`` is ``True``)."""
    return getattr(item, "keeps_history", False) is True


@runtime_checkable
class Tool(Protocol):
    """Something the model can call.

    ``parameters`` is the JSON Schema of the arguments object. raf checks the
    model's arguments against it (with jsonschema, see :func:`check_tool_arguments`)
    before ``invoke`` is called, so ``invoke`` gets a mapping that fits; a
    :class:`FunctionTool` checks its own. The result is sent back to the
    model: a ``str`` as it is, anything else as JSON.
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...

    async def invoke(self, arguments: Mapping[str, Any]) -> Any: ...


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
