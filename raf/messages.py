"""The messages a model reads and writes: ChatMessage, ToolCall, Usage, AgentResponse."""

from __future__ import annotations

import json
import operator
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import accumulate, chain
from typing import Any, Final, Literal, overload

import attrs

__all__ = [
    "AgentResponse",
    "ChatMessage",
    "Messages",
    "Role",
    "ToolCall",
    "Usage",
]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: Final = frozenset({"system", "user", "assistant", "tool"})


def _check_role(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in ROLES:
        raise ValueError(f"ChatMessage.role must be one of {sorted(ROLES)}, got {value!r}")


def _check_optional_str(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and type(value) is not str:
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str or None, "
            f"got {type(value).__name__}"
        )


def _check_str(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not str:
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str, got {type(value).__name__}"
        )


@attrs.frozen(slots=True)
class ToolCall:
    """One tool call the model asked for.

    ``arguments`` is the raw JSON text the model sent, kept verbatim so a
    transcript round-trips exactly; :attr:`parsed_arguments` is the decoded
    view.

    >>> ToolCall("call_1", "add", '{"a": 1}').parsed_arguments
    {'a': 1}
    """

    id: str = attrs.field(validator=_check_str)
    name: str = attrs.field(validator=_check_str)
    arguments: str = attrs.field(default="{}", validator=_check_str)

    @property
    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (raises ``ValueError`` if they are not JSON)."""
        return json.loads(self.arguments) if self.arguments.strip() else {}

    def to_dict(self) -> dict[str, str]:
        """A plain-JSON form, used for hashing and storage."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        """The inverse of :meth:`to_dict`."""
        return cls(data["id"], data["name"], data.get("arguments", "{}"))


def _to_tool_calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    calls = tuple(value)
    for index, call in enumerate(calls):
        if type(call) is not ToolCall:
            raise TypeError(
                f"ChatMessage.tool_calls[{index}] must be a ToolCall, got {type(call).__name__}"
            )
    return calls


@attrs.frozen(slots=True)
class ChatMessage:
    """One message of a conversation.

    Build them with the role constructors:

    >>> ChatMessage.user("hi")
    ChatMessage(role='user', content='hi', name=None, tool_calls=(), tool_call_id=None)
    """

    role: Role = attrs.field(validator=_check_role)
    content: str | None = attrs.field(default=None, validator=_check_optional_str)
    name: str | None = attrs.field(default=None, validator=_check_optional_str, kw_only=True)
    tool_calls: tuple[ToolCall, ...] = attrs.field(
        default=(), converter=_to_tool_calls, kw_only=True
    )
    tool_call_id: str | None = attrs.field(
        default=None, validator=_check_optional_str, kw_only=True
    )

    @classmethod
    def user(cls, text: str, *, name: str | None = None) -> ChatMessage:
        """A message from the user."""
        return cls("user", text, name=name)

    @classmethod
    def system(cls, text: str) -> ChatMessage:
        """A system (instructions) message."""
        return cls("system", text)

    @classmethod
    def assistant(
        cls, text: str | None = None, *, tool_calls: Iterable[ToolCall] = ()
    ) -> ChatMessage:
        """A model turn: text, tool calls, or both."""
        return cls("assistant", text, tool_calls=tuple(tool_calls))

    @classmethod
    def tool(cls, call_id: str, content: str, *, name: str | None = None) -> ChatMessage:
        """The result of the tool call ``call_id``."""
        return cls("tool", content, tool_call_id=call_id, name=name)

    def to_dict(self) -> dict[str, Any]:
        """A plain-JSON form with only the fields that are set; stable key order."""
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            data["name"] = self.name
        if self.tool_calls:
            data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            data["tool_call_id"] = self.tool_call_id
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatMessage:
        """The inverse of :meth:`to_dict`; a missing ``role`` is a ``ValueError``."""
        if "role" not in data:
            raise ValueError(f"ChatMessage.from_dict: no 'role' in {sorted(data)!r}")
        return cls(
            data["role"],
            data.get("content"),
            name=data.get("name"),
            tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("tool_calls", ())),
            tool_call_id=data.get("tool_call_id"),
        )


_Chunk = tuple[ChatMessage, ...]


def checked_messages(items: Iterable[ChatMessage], where: str) -> tuple[ChatMessage, ...]:
    """``items`` as a tuple, each checked to be a ``ChatMessage``; a ``TypeError`` names
    the first that is not, as ``where[index]``."""
    chunk = items if type(items) is tuple else tuple(items)
    for index, item in enumerate(chunk):
        if type(item) is not ChatMessage:
            raise TypeError(f"{where}[{index}] must be a ChatMessage, got {type(item).__name__}")
    return chunk


class Messages(Sequence[ChatMessage]):
    """An immutable sequence whose items are known to be ``ChatMessage``.

    Building one checks every item once; after that raf trusts it, so a
    session's history of ten thousand messages is passed through a run
    without being looked at again. Sessions return ``Messages``.

    Appending does not copy what is already there: a ``Messages`` is a short
    list of shared immutable chunks (about log2(n) of them, small ones
    merged as they come), so ``history + new_turn`` costs the new
    turn, and what the model sees, ``system + history + request``, is built
    without copying the history. Indexing, slicing and iterating work as on
    a tuple, and a ``Messages`` equals the tuple of the same messages.

    >>> history = Messages([ChatMessage.user("hi")])
    >>> longer = history + (ChatMessage.assistant("hello"),)
    >>> [m.content for m in longer], len(history)
    (['hi', 'hello'], 1)
    """

    __slots__ = ("_chunks", "_ends", "_len")

    _chunks: tuple[_Chunk, ...]
    _ends: tuple[int, ...]
    _len: int

    def __init__(self, items: Iterable[ChatMessage] = ()) -> None:
        chunk = checked_messages(items, "Messages")
        self._chunks = (chunk,) if chunk else ()
        self._ends = (len(chunk),) if chunk else ()
        self._len = len(chunk)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[ChatMessage]:
        return chain.from_iterable(self._chunks)

    def __reversed__(self) -> Iterator[ChatMessage]:
        return chain.from_iterable(map(reversed, reversed(self._chunks)))

    @overload
    def __getitem__(self, index: int) -> ChatMessage: ...
    @overload
    def __getitem__(self, index: slice) -> Messages: ...
    def __getitem__(self, index: int | slice) -> ChatMessage | Messages:
        if isinstance(index, slice):
            return self._slice(index)
        position = operator.index(index)
        if position < 0:
            position += self._len
        if not 0 <= position < self._len:
            raise IndexError("Messages index out of range")
        chunks = self._chunks
        if len(chunks) == 1:
            return chunks[0][position]
        found = bisect_right(self._ends, position)
        return chunks[found][position - (self._ends[found - 1] if found else 0)]

    def _slice(self, index: slice) -> Messages:
        start, stop, step = index.indices(self._len)
        if step != 1:
            part = tuple(self)[index]
            return _from_chunks((part,)) if part else EMPTY_MESSAGES
        if start >= stop:
            return EMPTY_MESSAGES
        parts: list[_Chunk] = []
        found = bisect_right(self._ends, start)
        chunk_start = self._ends[found - 1] if found else 0
        while chunk_start < stop:
            chunk = self._chunks[found]
            part = chunk[max(start - chunk_start, 0) : stop - chunk_start]
            if part:
                parts.append(part)
            chunk_start = self._ends[found]
            found += 1
        return _from_chunks(tuple(parts))

    def __add__(self, other: object) -> Messages:
        if isinstance(other, Messages):
            return join_messages(self, other)
        if isinstance(other, (tuple, list)):
            return join_messages(self, Messages(other))
        return NotImplemented

    def __radd__(self, other: object) -> Messages:
        if isinstance(other, (tuple, list)):
            return join_messages(Messages(other), self)
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Messages):
            return self._len == other._len and (
                self._chunks == other._chunks or all(map(operator.eq, self, other))
            )
        if isinstance(other, tuple):
            return self._len == len(other) and all(map(operator.eq, self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Messages, (tuple(self),))

    def __repr__(self) -> str:
        return f"Messages({list(self)!r})"


def _from_chunks(chunks: tuple[_Chunk, ...]) -> Messages:
    """A Messages over non-empty, already checked chunks (no copy)."""
    self = object.__new__(Messages)
    self._chunks = chunks
    self._ends = tuple(accumulate(map(len, chunks)))
    self._len = self._ends[-1] if chunks else 0
    return self


EMPTY_MESSAGES: Final = _from_chunks(())


def trusted_messages(items: Iterable[ChatMessage]) -> Messages:
    """Wrap items that raf itself built or checked, without checking again."""
    if type(items) is Messages:
        return items
    chunk = tuple(items)
    return _from_chunks((chunk,)) if chunk else EMPTY_MESSAGES


def join_messages(*parts: Sequence[ChatMessage]) -> Messages:
    """Concatenate checked sequences (``Messages`` or tuples raf built) without copying them.

    Small chunks at the end are merged as they come, so repeated appends
    keep the chunk count near log2(n) and copy each message about log2(n)
    times in all, never the whole history per append.
    """
    chunks: list[_Chunk] = []
    for part in parts:
        if type(part) is Messages:
            chunks.extend(part._chunks)
        elif part:
            chunks.append(part if type(part) is tuple else tuple(part))
    # Keep chunk sizes falling by more than half towards the end; but never copy a last
    # chunk that holds most of the messages (a history after a few injected ones) just
    # to absorb small ones before it: that costs one chunk more, and only when n doubles.
    total = -1
    while len(chunks) >= 2 and len(chunks[-2]) <= 2 * len(chunks[-1]):
        if total < 0:
            total = sum(map(len, chunks))  # only when a merge is due: merging keeps it
        if 2 * len(chunks[-1]) > total:
            break
        last = chunks.pop()
        chunks[-1] = chunks[-1] + last
    return _from_chunks(tuple(chunks))


# One encoder for every call: json.dumps with options builds a new one each time.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def messages_to_json(messages: Iterable[ChatMessage]) -> str:
    """Canonical JSON of messages: sorted keys, no spaces, UTF-8 kept."""
    return _CANONICAL.encode([m.to_dict() for m in messages])


def _message_tuple(messages: Iterable[ChatMessage]) -> tuple[ChatMessage, ...]:
    return checked_messages(messages, "AgentResponse.messages")


@attrs.frozen(slots=True)
class Usage:
    """Token counts of one or more model calls; ``+`` adds them up."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )


@attrs.frozen(slots=True)
class AgentResponse:
    """What a model call, or a whole run, produced.

    ``messages`` holds every message the run added: assistant turns with
    tool calls, tool results, and the final answer. ``usage`` sums the
    calls; ``raw`` is the last call's raw response, when the client has one.
    """

    messages: tuple[ChatMessage, ...] = attrs.field(default=(), converter=_message_tuple)
    usage: Usage | None = None
    raw: Any = attrs.field(default=None, eq=False, repr=False)

    @property
    def text(self) -> str:
        """The last assistant message's text; ``""`` if there is none."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.content or ""
        return ""

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls the model asked for in these messages, in order."""
        calls: tuple[ToolCall, ...] = ()
        for message in self.messages:
            if message.tool_calls:
                calls += message.tool_calls
        return calls
