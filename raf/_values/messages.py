"""The messages a model reads and writes (ChatMessage, ToolCall, Usage, AgentResponse,
Update); the ChatClient protocol of what reads and writes them is in ``client``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, Literal

import attrs

from raf._values.carried import Compaction, Reasoning
from raf._values.text import check_optional_str, check_str, clean_text
from raf._values.usage import Usage

__all__ = [
    "AgentResponse",
    "ChatMessage",
    "PendingCall",
    "Reasoning",
    "ToolCall",
    "Update",
    "Usage",
    "request_hash",
]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: Final = frozenset({"system", "user", "assistant", "tool"})


def _check_role(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in ROLES:
        raise ValueError(f"ChatMessage.role must be one of {sorted(ROLES)}, got {value!r}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict, refusing a key named twice."""
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r:.60}")
            seen.add(key)
    return result


@attrs.frozen(slots=True)
class ToolCall:
    """One tool call the model asked for.

    ``arguments`` is the raw JSON text the model sent, kept verbatim so a
    transcript round-trips exactly; :attr:`parsed_arguments` is the decoded
    view.

    >>> ToolCall("call_1", "add", '{"a": 1}').parsed_arguments
    {'a': 1}
    """

    id: str = attrs.field(converter=clean_text, validator=check_str)
    name: str = attrs.field(converter=clean_text, validator=check_str)
    arguments: str = attrs.field(default="{}", converter=clean_text, validator=check_str)

    @property
    def parsed_arguments(self) -> Any:
        """The arguments decoded from JSON (raises ``ValueError`` if they are not JSON, or
        if an object names a key twice: what a person approves must be what runs, and
        JSON readers disagree on which of two values wins).

        >>> ToolCall("c", "rm", '{"path": "a", "path": "/"}').parsed_arguments
        Traceback (most recent call last):
        ...
        ValueError: duplicate key 'path'
        """
        if not self.arguments.strip():
            return {}
        return json.loads(self.arguments, object_pairs_hook=_unique_keys)

    def to_dict(self) -> dict[str, str]:
        """A plain-JSON form, used for hashing and storage."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        """The inverse of :meth:`to_dict`."""
        return cls(data["id"], data["name"], data.get("arguments", "{}"))


@attrs.frozen(slots=True)
class PendingCall:
    """A tool call that waits for a person's decision (see ``docs/approvals.md``).

    ``call`` is the model's call, exactly as it will run if approved;
    ``token`` binds a :class:`raf.Decision` to it: derived from the session
    id, the call id, the tool name and the canonical arguments, so a
    decision applies to exactly what was shown.
    ``AgentResponse.pending`` holds one per waiting call. ``run_id``: the
    durable run (DBOS workflow id) that waits for the decision, if one does
    (where it waits, not what it is: equality ignores it).
    """

    call: ToolCall = attrs.field()
    token: str = attrs.field(validator=check_str)
    run_id: str | None = attrs.field(default=None, kw_only=True, eq=False)

    @call.validator
    def _check_call(self, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not ToolCall:
            raise TypeError(f"PendingCall.call must be a ToolCall, got {type(value).__name__}")

    def to_dict(self) -> dict[str, Any]:
        """A plain-JSON form, what a session store keeps."""
        data: dict[str, Any] = {"token": self.token, "call": self.call.to_dict()}
        if self.run_id is not None:
            data["run_id"] = self.run_id
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PendingCall:
        """The inverse of :meth:`to_dict`."""
        return cls(ToolCall.from_dict(data["call"]), data["token"], run_id=data.get("run_id"))


def _to_tool_calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    calls = tuple(value)
    for index, call in enumerate(calls):
        if type(call) is not ToolCall:
            raise TypeError(
                f"ChatMessage.tool_calls[{index}] must be a ToolCall, got {type(call).__name__}"
            )
    return calls


def _checks(kind: type) -> Any:
    """The validator of a field that holds a ``kind`` or ``None``."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is not None and type(value) is not kind:
            raise TypeError(
                f"ChatMessage.{attribute.name} must be a {kind.__name__} or None, "
                f"got {type(value).__name__}"
            )

    return check


@attrs.frozen(slots=True)
class ChatMessage:
    """One message of a conversation.

    Build them with the role constructors:

    >>> ChatMessage.user("hi")
    ChatMessage(role='user', content='hi', name=None, tool_calls=(), tool_call_id=None)
    """

    role: Role = attrs.field(validator=_check_role)
    content: str | None = attrs.field(
        default=None, converter=clean_text, validator=check_optional_str
    )
    name: str | None = attrs.field(
        default=None, converter=clean_text, validator=check_optional_str, kw_only=True
    )
    tool_calls: tuple[ToolCall, ...] = attrs.field(
        default=(), converter=_to_tool_calls, kw_only=True
    )
    tool_call_id: str | None = attrs.field(
        default=None, converter=clean_text, validator=check_optional_str, kw_only=True
    )
    #: The reasoning that came with an assistant turn (see :class:`Reasoning`); left out of
    #: the repr, as it is large and opaque.
    reasoning: Reasoning | None = attrs.field(
        default=None, validator=_checks(Reasoning), kw_only=True, repr=False
    )
    #: The server's compaction that came with an assistant turn (see :class:`Compaction`);
    #: left out of the repr, as it is large and opaque.
    compaction: Compaction | None = attrs.field(
        default=None, validator=_checks(Compaction), kw_only=True, repr=False
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
        cls,
        text: str | None = None,
        *,
        tool_calls: Iterable[ToolCall] = (),
        reasoning: Reasoning | None = None,
        compaction: Compaction | None = None,
    ) -> ChatMessage:
        """A model turn: text, tool calls, or both (and the reasoning and compaction that
        came with it)."""
        return cls(
            "assistant",
            text,
            tool_calls=tuple(tool_calls),
            reasoning=reasoning,
            compaction=compaction,
        )

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
        if self.reasoning is not None:
            data["reasoning"] = self.reasoning.to_dict()
        if self.compaction is not None:
            data["compaction"] = self.compaction.to_dict()
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
            reasoning=Reasoning.from_dict(data["reasoning"]) if "reasoning" in data else None,
            compaction=Compaction.from_dict(data["compaction"]) if "compaction" in data else None,
        )


_MESSAGE_TYPE: Final = frozenset({ChatMessage})


def checked_messages(items: Iterable[ChatMessage], where: str) -> tuple[ChatMessage, ...]:
    """``items`` as a tuple, each checked to be a ``ChatMessage``; a ``TypeError`` names
    the first that is not, as ``where[index]``."""
    chunk = items if type(items) is tuple else tuple(items)
    if len(chunk) > 8 and {*map(type, chunk)} <= _MESSAGE_TYPE:
        return chunk  # a long input checked in C: half the time of the loop below
    for index, item in enumerate(chunk):
        if type(item) is not ChatMessage:
            raise TypeError(f"{where}[{index}] must be a ChatMessage, got {type(item).__name__}")
    return chunk


# One encoder for every call: json.dumps with options builds a new one each time.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def messages_to_json(messages: Iterable[ChatMessage]) -> str:
    """Canonical JSON of messages: sorted keys, no spaces, UTF-8 kept."""
    return _CANONICAL.encode([m.to_dict() for m in messages])


def request_hash(messages: Iterable[ChatMessage]) -> str:
    """SHA-256 hex digest of the messages' canonical JSON (stable across processes).

    >>> request_hash([]) == request_hash(())
    True
    """
    import hashlib  # a stdlib module, not raf's: here, not at import, as it loads OpenSSL (~2 ms)

    batch = tuple(messages)
    for index, message in enumerate(batch):
        if type(message) is not ChatMessage:
            raise TypeError(
                f"request_hash(messages): messages[{index}] must be a ChatMessage, "
                f"got {type(message).__name__}"
            )
    return hashlib.sha256(messages_to_json(batch).encode()).hexdigest()


def _message_tuple(messages: Iterable[ChatMessage]) -> tuple[ChatMessage, ...]:
    return checked_messages(messages, "AgentResponse.messages")


def _pending(calls: Iterable[PendingCall]) -> tuple[PendingCall, ...]:
    pending = tuple(calls)
    for index, call in enumerate(pending):
        if type(call) is not PendingCall:
            raise TypeError(
                f"AgentResponse.pending[{index}] must be a PendingCall, got {type(call).__name__}"
            )
    return pending


@attrs.frozen(slots=True)
class AgentResponse:
    """What a model call, or a whole run, produced.

    ``messages`` holds every message the run added: assistant turns with
    tool calls, tool results, and the final answer. ``usage`` sums the
    calls; ``raw`` is the last call's raw response, when the client has one.
    ``output`` is the final answer validated into the run's ``output_type``
    (``None`` when the run asked for none); ``model`` names the model that
    answered when a client or middleware says (:class:`raf.FallbackMiddleware`
    does), else ``None``.
    ``pending`` holds the tool calls that wait for a person's decision
    (:class:`PendingCall`); the run stopped before them (see
    ``docs/approvals.md``).
    """

    messages: tuple[ChatMessage, ...] = attrs.field(default=(), converter=_message_tuple)
    usage: Usage | None = None
    raw: Any = attrs.field(default=None, eq=False, repr=False)
    output: Any = attrs.field(default=None, kw_only=True, repr=False)
    model: str | None = attrs.field(default=None, kw_only=True, eq=False, repr=False)
    pending: tuple[PendingCall, ...] = attrs.field(default=(), kw_only=True, converter=_pending)

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

    @classmethod
    def from_updates(cls, updates: Iterable[Update]) -> AgentResponse:
        """The response that a stream of updates amounts to.

        Text deltas, tool calls, reasoning and compaction make up an assistant turn (``content``
        is ``None`` when the turn had no text update); a ``"tool_result"``
        update closes the turn and adds its tool message; usages are summed
        (``None`` when there was none). ``raw`` is ``None``: the chunks stay on
        the updates. For one client, the assembled response equals what its
        ``complete`` returns for the same answer.

        >>> AgentResponse.from_updates([Update.of_text("Hel"), Update.of_text("lo")]).text
        'Hello'
        """
        messages: list[ChatMessage] = []
        text: list[str] | None = None
        calls: list[ToolCall] = []
        reasoning: Reasoning | None = None
        compaction: Compaction | None = None
        usage: Usage | None = None
        pending: list[PendingCall] = []
        for update in updates:
            kind = update.kind
            if kind == "text":
                if text is None:
                    text = [update.text]
                else:
                    text.append(update.text)
            elif kind == "tool_call":
                calls.append(update.tool_call)  # type: ignore[arg-type]
            elif kind == "tool_result":
                if text is not None or calls or reasoning or compaction:
                    messages.append(_turn(text, calls, reasoning, compaction))
                    text, calls, reasoning, compaction = None, [], None, None
                messages.append(update.message)  # type: ignore[arg-type]
            elif kind == "reasoning":
                reasoning = update.reasoning
            elif kind == "compaction":
                compaction = update.compaction
            elif kind == "usage":
                assert update.usage is not None
                usage = update.usage if usage is None else usage + update.usage
            elif kind == "approval":
                pending.append(update.pending)  # type: ignore[arg-type]
        if text is not None or calls or reasoning or compaction:
            messages.append(_turn(text, calls, reasoning, compaction))
        return cls(tuple(messages), usage, pending=tuple(pending))

    def to_updates(self) -> tuple[Update, ...]:
        """The updates a stream of this response sends: the inverse of :meth:`from_updates`.

        Each assistant turn is its text (one update, when it has text), its
        tool calls, its reasoning and its compaction (if any); each tool message a
        ``"tool_result"``; the usage last.
        Other messages (user, system) have no update. raf streams the answer
        of a client without ``stream`` this way.

        >>> answer = AgentResponse((ChatMessage.assistant("hi"),), Usage(1, 1))
        >>> [update.kind for update in answer.to_updates()]
        ['text', 'usage']
        """
        updates: list[Update] = []
        for message in self.messages:
            if message.role == "assistant":
                if message.content is not None:
                    updates.append(Update("text", message.content))
                updates.extend(Update("tool_call", tool_call=call) for call in message.tool_calls)
                if message.reasoning is not None:
                    updates.append(Update("reasoning", reasoning=message.reasoning))
                if message.compaction is not None:
                    updates.append(Update("compaction", compaction=message.compaction))
            elif message.role == "tool":
                updates.append(Update("tool_result", message=message))
        if self.usage is not None:
            updates.append(Update("usage", usage=self.usage))
        updates.extend(Update("approval", pending=pending) for pending in self.pending)
        return tuple(updates)


def _turn(
    text: list[str] | None,
    calls: Sequence[ToolCall],
    reasoning: Reasoning | None,
    compaction: Compaction | None,
) -> ChatMessage:
    content = None if text is None else "".join(text)
    return ChatMessage(
        "assistant", content, tool_calls=tuple(calls), reasoning=reasoning, compaction=compaction
    )


UpdateKind = Literal[
    "text", "tool_call", "tool_result", "usage", "approval", "reasoning", "compaction", "agent"
]
#: Each kind's field, the type it holds, and how to make one (for the error).
_NEEDS: Final[dict[str, tuple[str, type, str]]] = {
    "text": ("text", str, "str"),
    "tool_call": ("tool_call", ToolCall, "ToolCall"),
    "tool_result": ("message", ChatMessage, "ChatMessage.tool"),
    "usage": ("usage", Usage, "Usage"),
    "approval": ("pending", PendingCall, "PendingCall"),
    "reasoning": ("reasoning", Reasoning, "Reasoning"),
    "compaction": ("compaction", Compaction, "Compaction"),
    "agent": ("tool_call", ToolCall, "ToolCall"),  # and update=Update(...): the child's
}


@attrs.frozen(slots=True, repr=False)
class Update:
    """One event of a streamed run (see ``docs/streaming.md``).

    ``kind`` says which field carries it: ``"text"`` a delta of the
    assistant's text in ``text``; ``"tool_call"`` a complete call in
    ``tool_call`` (sent once its arguments are complete); ``"tool_result"``
    the tool message of a call in ``message``; ``"usage"`` the token counts
    of a model call in ``usage``; ``"approval"`` a call that waits for a
    person's decision in ``pending`` (sent before the stream ends);
    ``"reasoning"`` the :class:`Reasoning` of the assistant turn under way in
    ``reasoning`` (sent by a client once the turn is complete); ``"compaction"``
    the server's :class:`Compaction` of the conversation that came with that turn,
    in ``compaction``; ``"agent"``
    an update of an agent this run called as a tool (``agent.as_tool()``):
    the child's own update in ``update``, tagged with the call that runs it
    in ``tool_call``. ``raw``
    is the client's own chunk, if any (not part of equality). Build them
    with the ``of_*`` constructors.

    >>> Update.of_text("Hel")
    Update(kind='text', text='Hel')
    >>> Update.of_tool_call(ToolCall("c1", "now")).kind
    'tool_call'
    """

    kind: UpdateKind
    text: str = ""
    tool_call: ToolCall | None = None
    message: ChatMessage | None = None
    usage: Usage | None = None
    raw: Any = attrs.field(default=None, eq=False, repr=False)
    pending: PendingCall | None = attrs.field(default=None, kw_only=True)
    reasoning: Reasoning | None = attrs.field(default=None, kw_only=True)
    compaction: Compaction | None = attrs.field(default=None, kw_only=True)
    update: Update | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        # One check per kind, in one place: a malformed update is refused where it is
        # built (in the client), not when the run assembles the answer.
        kind = self.kind
        if type(self.text) is not str:
            raise TypeError(f"Update.text must be a str, got {type(self.text).__name__}")
        if kind == "text":
            return
        if self.text:
            raise ValueError(f"Update.text is for 'text' updates, not {kind!r} ones: {self!r}")
        if kind not in _NEEDS:
            raise ValueError(f"Update.kind must be one of {list(_NEEDS)}, got {kind!r}")
        field, needed, made = _NEEDS[kind]
        value = getattr(self, field)
        if type(value) is not needed or getattr(value, "role", "tool") != "tool":
            raise TypeError(f"a {kind!r} Update needs {field}={made}(...), got {value!r}")
        if kind == "agent" and type(self.update) is not Update:
            raise TypeError(f"an 'agent' Update needs update=Update(...), got {self.update!r}")

    def __repr__(self) -> str:
        # Only the field the kind uses: a stream of updates reads as one line each.
        field = _NEEDS[self.kind][0]
        child = f", update={self.update!r}" if self.kind == "agent" else ""
        return f"Update(kind={self.kind!r}, {field}={getattr(self, field)!r}{child})"

    @classmethod
    def of_text(cls, text: str, *, raw: Any = None) -> Update:
        """A delta of the assistant's text."""
        return cls("text", text, raw=raw)

    @classmethod
    def of_tool_call(cls, call: ToolCall, *, raw: Any = None) -> Update:
        """A tool call, complete with its arguments."""
        return cls("tool_call", tool_call=call, raw=raw)

    @classmethod
    def of_tool_result(cls, message: ChatMessage) -> Update:
        """The tool message that answers a call."""
        return cls("tool_result", message=message)

    @classmethod
    def of_usage(cls, usage: Usage, *, raw: Any = None) -> Update:
        """The token counts of one model call."""
        return cls("usage", usage=usage, raw=raw)

    @classmethod
    def of_agent(cls, call: ToolCall, update: Update) -> Update:
        """``update`` of the agent that ``call`` runs as a tool, tagged with the call."""
        return cls("agent", tool_call=call, update=update)

    @classmethod
    def of_reasoning(cls, reasoning: Reasoning, *, raw: Any = None) -> Update:
        """The reasoning of the assistant turn under way, kept on its message."""
        return cls("reasoning", reasoning=reasoning, raw=raw)

    @classmethod
    def of_compaction(cls, compaction: Compaction, *, raw: Any = None) -> Update:
        """The server's compaction that came with the turn under way, kept on its message."""
        return cls("compaction", compaction=compaction, raw=raw)


#: Where a streamed run sends its updates: ``async (Update) -> None`` (ASGI's ``send``).
OnUpdate = Callable[[Update], Awaitable[None]]
