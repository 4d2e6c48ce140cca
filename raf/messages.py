"""The messages a model reads and writes: ChatMessage, ToolCall, Usage, AgentResponse."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal

import attrs

__all__ = ["AgentResponse", "ChatMessage", "Role", "ToolCall", "Usage"]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: Final = frozenset({"system", "user", "assistant", "tool"})


# Python strings can hold lone surrogates (from "\ud800" in JSON, or surrogateescape'd
# argv), which no UTF-8 encoder accepts: one such reply would break every later turn.
_SURROGATES: Final = re.compile("[\ud800-\udfff]")


def clean_text(value: Any) -> Any:
    r"""``value`` with each lone surrogate replaced by U+FFFD; non-strings unchanged.

    The one rule for text entering raf: every string field of a
    :class:`ChatMessage` and :class:`ToolCall` goes through it, so whatever
    a client, a session or the command line hands over can be encoded.

    >>> clean_text("bad \udcff byte")
    'bad \ufffd byte'
    """
    if type(value) is str and not value.isascii() and _SURROGATES.search(value):
        return _SURROGATES.sub("\ufffd", value)
    return value


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

    id: str = attrs.field(converter=clean_text, validator=_check_str)
    name: str = attrs.field(converter=clean_text, validator=_check_str)
    arguments: str = attrs.field(default="{}", converter=clean_text, validator=_check_str)

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
    content: str | None = attrs.field(
        default=None, converter=clean_text, validator=_check_optional_str
    )
    name: str | None = attrs.field(
        default=None, converter=clean_text, validator=_check_optional_str, kw_only=True
    )
    tool_calls: tuple[ToolCall, ...] = attrs.field(
        default=(), converter=_to_tool_calls, kw_only=True
    )
    tool_call_id: str | None = attrs.field(
        default=None, converter=clean_text, validator=_check_optional_str, kw_only=True
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


def checked_messages(items: Iterable[ChatMessage], where: str) -> tuple[ChatMessage, ...]:
    """``items`` as a tuple, each checked to be a ``ChatMessage``; a ``TypeError`` names
    the first that is not, as ``where[index]``."""
    chunk = items if type(items) is tuple else tuple(items)
    for index, item in enumerate(chunk):
        if type(item) is not ChatMessage:
            raise TypeError(f"{where}[{index}] must be a ChatMessage, got {type(item).__name__}")
    return chunk


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
