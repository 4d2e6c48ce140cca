"""AnthropicChatClient: a chat model behind Anthropic's Messages API (``POST /v1/messages``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Self

from raf._clients._anthropic_reply import (
    SOURCE,
    THINKING,
    StreamState,
    call_name,
    response_from_reply,
)
from raf._clients._reply import replayed, stream_updates
from raf._clients._sdk import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_TIMEOUT,
    RequestOptions,
    call,
    checked,
    new_body,
    plain,
    sdk_client,
)
from raf._values.compacted import for_wire, own_compaction
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions
from raf._values.protocols import Tool
from raf._values.schema import strict_schema
from raf.errors import BadRequestError

if TYPE_CHECKING:
    import anthropic

__all__ = ["AnthropicChatClient"]

# How many tool-call turns a client remembers the thinking blocks of.
# Keys of the body that are the run's own, never an option's.
_OWN_KEYS: Final = frozenset({"messages", "stream"})
_EPHEMERAL: Final = {"type": "ephemeral"}
_WORDS: Final = {"auto": "auto", "none": "none", "required": "any"}


class AnthropicChatClient:
    """A :class:`raf.StreamingChatClient` on Anthropic's Messages API (the ``anthropic``
    SDK, extra ``raf-agents[anthropic]``).

    ``model`` is used unless a run's ``AgentRunOptions.model`` names another.
    ``api_key`` defaults to ``ANTHROPIC_API_KEY`` and ``base_url`` to
    ``ANTHROPIC_BASE_URL``, as with the SDK itself. ``max_tokens`` is sent
    when a run sets none (the API requires it). ``max_retries``, ``timeout``,
    ``idle_timeout``, ``client`` (an ``anthropic.AsyncAnthropic`` you built,
    closed by you) and the errors, with their ``retryable``, are those of
    :class:`raf.OpenAIChatClient`; Anthropic's 529 ``overloaded_error`` is a
    retryable :class:`raf.errors.ServerError`.

    System messages before ``ChatOptions.history_end`` (or, with no history,
    the leading ones) are the ``system`` field; a later one (the volatile
    tail) is text at the start of the following user turn, so the cached
    prefix stays the same. Tool calls and results are ``tool_use`` and
    ``tool_result`` blocks. A reply's thinking blocks (``extra={"thinking": ...}``),
    signatures included, are kept on its assistant message
    (``ChatMessage.reasoning``, source ``"anthropic"``, in their order among the
    text and the calls) and sent back unchanged with that turn, as the API
    requires in a tool loop, also when the history comes back from a session
    store.

    With ``cache=True`` (the default) the body carries at most four
    ``cache_control`` breakpoints: the last tool, the end of the system
    prompt, the last history message before the tail, and the last message.

        async with AnthropicChatClient("claude-sonnet-4-5") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    #: The provider, as OpenTelemetry's ``gen_ai.provider.name`` names it.
    provider_name: Final = "anthropic"
    #: The source of the compaction blocks its server makes (see :class:`raf.Compaction`).
    compaction_source: Final = SOURCE

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_tokens: int = 4096,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        idle_timeout: float | None = DEFAULT_TIMEOUT,
        cache: bool = True,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        client: anthropic.AsyncAnthropic | None = None,
    ) -> None:
        if type(max_tokens) is not int or max_tokens < 1:
            raise ValueError(
                f"AnthropicChatClient: max_tokens must be an int >= 1, got {max_tokens!r}"
            )
        if type(cache) is not bool:
            raise ValueError(f"AnthropicChatClient: cache must be True or False, got {cache!r}")
        import anthropic

        self.model, self.timeout, self.idle_timeout = model, timeout, idle_timeout
        self.max_response_bytes, self.max_tokens, self.cache = max_response_bytes, max_tokens, cache
        self._owns_client = client is None
        self.client = sdk_client(
            self, anthropic, "AsyncAnthropic", base_url, api_key, max_retries, client
        )

    # --- complete and stream ------------------------------------------------------------

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one Messages API request and return the model's turn.

        A ``max_tokens`` stop (or the context window's, or a paused turn) is an
        :class:`raf.errors.IncompleteResponseError` with ``.partial``; a ``refusal``
        a :class:`raf.ChatClientError` that names it (not retryable).
        """
        import anthropic

        model, body, request_options = self.request_body(messages, options)
        where = call_name(model)
        data, content_type = await call(
            self, anthropic, "/v1/messages", body, request_options, where
        )
        return response_from_reply(data, content_type, model)

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The model's turn as it comes (``"stream": true``), update by update.

        Text deltas as they come; the tool calls and the usage at
        ``message_stop``. A stream that ends before ``message_stop`` is a
        :class:`raf.errors.ChatConnectionError` (the SDK itself would take it for a
        whole answer); an ``error`` event the error it names (``overloaded_error``
        retryable); the endings as for :meth:`complete`.
        """
        import anthropic

        model, body, request_options = self.request_body(messages, options, stream=True)
        state, where = StreamState(model), call_name(model)
        updates = stream_updates(
            self, anthropic, "/v1/messages", body, request_options, state, where
        )
        # Closed here, not left to the garbage collector, when the consumer stops early.
        async with contextlib.aclosing(updates):
            async for update in updates:
                yield update

    # --- the request --------------------------------------------------------------------

    def request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions, *, stream: bool = False
    ) -> tuple[str, dict[str, Any], RequestOptions]:
        """The model, the body (plain dicts and lists) and the SDK request options of one
        call, the breakpoints placed (with ``cache``).

        ``options.extra`` is applied last: ``timeout``, ``extra_headers``,
        ``extra_query`` and ``extra_body`` as the SDK understands them, any
        other key (``thinking``, ``top_k``, ``stop_sequences``, ...) into the body.
        A history that holds this wire's compaction is sent from it on; with
        ``options.compact_threshold`` the body asks the server to compact (see
        :func:`compacting`).
        """
        where = "AnthropicChatClient"
        schema = options.output_schema
        messages, history_end = for_wire(messages, SOURCE, options.history_end)
        system, turns, ends = wire_messages(messages, history_end)
        tools = [tool_to_wire(t) for t in options.tools]
        fields = {
            "max_tokens": options.max_tokens or self.max_tokens,
            "system": system or None,
            "messages": turns,
            "tools": tools or None,
            "tool_choice": tool_choice(options.tool_choice),
            # Not a named argument of recent SDKs; the API takes it all the same.
            "temperature": options.temperature,
            "output_config": None
            if schema is None
            else {"format": {"type": "json_schema", "schema": strict_schema(schema)}},
        }
        if self.cache:
            place_breakpoints(tools, system, turns, ends, history_end)
        model = options.model or self.model
        body, request_options, extra = new_body(where, model, fields, options.extra)
        for key, value in extra.items():
            if key in _OWN_KEYS:
                raise BadRequestError(
                    f"{where}: extra option {key!r} is not allowed; "
                    "the messages are the run's, and stream() is how to stream"
                )
            body[key] = value
        compacting(body, request_options, options.compact_threshold, messages)
        if stream:
            body["stream"] = True
        return body["model"], body, request_options

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"AnthropicChatClient(model={self.model!r}, "
            f"base_url={str(self.client.base_url)!r}, cache={self.cache})"
        )


# --- Messages to the wire ---------------------------------------------------------------


def wire_messages(
    messages: Sequence[ChatMessage], history_end: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[int, int] | None]]:
    """The ``system`` blocks and the ``messages`` turns of a conversation, and where each
    message ended up (``(turn, block)`` of its last block; ``None`` for the system
    field's, or a message with no block).

    System messages before ``history_end`` (with none, the leading ones) are the
    system field; any other is text in the following user turn. Consecutive
    turns of one role are one turn: the results of parallel calls share one.

    >>> wire_messages([ChatMessage.system("Be brief."), ChatMessage.user("hi")], None)[:2]
    ([{'type': 'text', 'text': 'Be brief.'}],
     [{'role': 'user', 'content': [{'type': 'text', 'text': 'hi'}]}])
    """
    system: list[dict[str, Any]] = []
    wire: list[dict[str, Any]] = []
    ends: list[tuple[int, int] | None] = []
    renamed = tool_use_ids(messages)
    leading = True
    for index, message in enumerate(messages):
        checked(message, index)
        leading = leading and message.role == "system"
        stable = leading if history_end is None else index < history_end
        if message.role == "system" and stable:
            if message.content:
                system.append({"type": "text", "text": message.content})
            ends.append(None)
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message, index, renamed)
        if not blocks:
            ends.append(None)
            continue
        if not wire or wire[-1]["role"] != role:
            wire.append({"role": role, "content": []})
        wire[-1]["content"] += blocks
        ends.append((len(wire) - 1, len(wire[-1]["content"]) - 1))
    return system, wire, ends


def _text(text: str | None) -> list[dict[str, Any]]:
    # The API refuses an empty text block.
    return [{"type": "text", "text": text}] if text else []


def _blocks(
    message: ChatMessage, index: int, renamed: Mapping[tuple[int, int], str]
) -> list[dict[str, Any]]:
    """The content blocks of one message (a system message here is a tail's: text); an
    assistant turn's thinking blocks (its ``reasoning`` of source ``"anthropic"``) go back
    unchanged in their place, while the turn has the calls they came with. ``renamed``
    holds the ids sent in place of the history's (see :func:`tool_use_ids`)."""
    if message.role == "tool":
        return [
            {
                "type": "tool_result",
                "tool_use_id": renamed.get((index, 0), message.tool_call_id),
                "content": message.content or "",
            }
        ]
    if message.role != "assistant":
        return _text(message.content)
    calls = {}
    for number, made in enumerate(message.tool_calls):
        sent = renamed.get((index, number), made.id)
        calls[sent] = _tool_use(sent, made.name, made.arguments, index)
    return _compaction_block(message, index) + replayed(
        message, index, SOURCE, ("text", "tool_use", "id"), _text(message.content), calls
    )


def _compaction_block(message: ChatMessage, index: int) -> list[dict[str, Any]]:
    """The compaction block an assistant turn carries for this wire, first in its content,
    as it came (none for another wire's, or none at all)."""
    block = own_compaction(message, index, SOURCE, "compaction block")
    return [] if block is None else [block]


#: Anthropic's server-side compaction: its edit, the beta that turns it on, and the
#: smallest trigger the server takes (input tokens).
COMPACT_EDIT: Final = "compact_20260112"
COMPACT_BETA: Final = "compact-2026-01-12"
MIN_COMPACT_TRIGGER: Final = 50_000


def compacting(
    body: dict[str, Any],
    request_options: RequestOptions,
    threshold: int | None,
    messages: Sequence[ChatMessage],
) -> None:
    """Ask the server to compact past ``threshold`` input tokens (the ``compact_20260112``
    edit, its trigger at least Anthropic's minimum of 50,000), and turn on the beta that
    a compaction needs, also when the messages only send back one of this wire's
    (then with the edit at its default trigger, unless ``context_management`` was given).
    A ``context_management`` in ``options.extra`` is the caller's, kept as it is."""
    ours = any(m.compaction is not None and m.compaction.source == SOURCE for m in messages)
    if threshold is None and not ours:
        return
    if "context_management" not in body:
        edit: dict[str, Any] = {"type": COMPACT_EDIT}
        if threshold is not None:
            trigger = max(threshold, MIN_COMPACT_TRIGGER)
            edit["trigger"] = {"type": "input_tokens", "value": trigger}
        body["context_management"] = {"edits": [edit]}
    headers = request_options.setdefault("headers", {})
    named = next((key for key in headers if key.lower() == "anthropic-beta"), "anthropic-beta")
    betas = [b.strip() for b in str(headers.get(named) or "").split(",") if b.strip()]
    if COMPACT_BETA not in betas:
        headers[named] = ",".join([*betas, COMPACT_BETA])


#: What Anthropic takes as a ``tool_use`` id, and the characters it does not.
_TOOL_USE_ID: Final = re.compile(r"[a-zA-Z0-9_-]+")
_NOT_TOOL_USE_ID: Final = re.compile(r"[^a-zA-Z0-9_-]")


def tool_use_ids(messages: Sequence[ChatMessage]) -> dict[tuple[int, int], str]:
    """The ids sent in place of the history's, by ``(message, call)`` (a result: call 0);
    none when every id is one Anthropic takes.

    Anthropic takes a ``tool_use`` id of ``[a-zA-Z0-9_-]`` only, once in a request. A
    history made with other models holds others (``functions.add:0``; ``call_0`` in
    every turn, from servers that number each answer's calls from zero), so such an id
    is sent with the characters it refuses as ``_`` and, once taken, a ``_2``, ``_3``
    suffix; a result goes with the earliest call of its id still waiting for one. Each
    id depends only on the history before it, so a longer history sends the same prefix.

    >>> from raf import ToolCall
    >>> calls = [ChatMessage.assistant(tool_calls=[ToolCall(i, "f")]) for i in ("a:0", "a_0")]
    >>> tool_use_ids(calls)
    {(0, 0): 'a_0', (1, 0): 'a_0_2'}
    """
    ids = [made.id for message in messages for made in message.tool_calls]
    if len(set(ids)) == len(ids) and all(_TOOL_USE_ID.fullmatch(made) for made in ids):
        return {}  # the common case: nothing renamed
    renamed: dict[tuple[int, int], str] = {}
    taken: set[str] = set()
    waiting: dict[str, list[str]] = {}  # a history id -> the ids sent for it, not yet answered
    for index, message in enumerate(messages):
        for number, made in enumerate(message.tool_calls):
            base = _NOT_TOOL_USE_ID.sub("_", made.id) or "call"
            sent = base
            for again in itertools.count(2):
                if sent not in taken:
                    break
                sent = f"{base}_{again}"
            taken.add(sent)
            waiting.setdefault(made.id, []).append(sent)
            if sent != made.id:
                renamed[(index, number)] = sent
        if message.role == "tool" and message.tool_call_id is not None:
            pending = waiting.get(message.tool_call_id)
            sent = pending.pop(0) if pending else _NOT_TOOL_USE_ID.sub("_", message.tool_call_id)
            if sent != message.tool_call_id:
                renamed[(index, 0)] = sent
    return renamed


def _tool_use(call_id: str, name: str, arguments: str, index: int) -> dict[str, Any]:
    try:
        tool_input = json.loads(arguments)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to send
        tool_input = None
    if not isinstance(tool_input, dict):
        raise BadRequestError(
            f"messages[{index}]: the arguments of tool call {call_id!r} are not a JSON "
            f"object, which Anthropic's tool_use input must be: {arguments[:80]!r}"
        )
    return {"type": "tool_use", "id": call_id, "name": name, "input": tool_input}


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """A raf :class:`raf.Tool` as an Anthropic tool declaration."""
    wire: dict[str, Any] = {"name": tool.name}
    if tool.description:
        wire["description"] = tool.description
    wire["input_schema"] = plain(tool.parameters)
    return wire


def tool_choice(choice: str | Mapping[str, Any] | None) -> Any:
    """``options.tool_choice`` on the wire: ``"auto"``, ``"none"``, ``"required"``
    (Anthropic's ``any``), a tool's name, or a mapping as given."""
    if choice is None or not isinstance(choice, str):
        return None if choice is None else plain(choice)
    if choice in _WORDS:
        return {"type": _WORDS[choice]}
    return {"type": "tool", "name": choice}


def place_breakpoints(
    tools: list[dict[str, Any]],
    system: list[dict[str, Any]],
    turns: list[dict[str, Any]],
    ends: list[tuple[int, int] | None],
    history_end: int | None,
) -> None:
    """Mark at most four blocks ``cache_control: ephemeral``: the last tool, the end of
    the system prompt, the last history message before the tail (``history_end - 1``)
    and the last message, so the next call reads what this one wrote."""
    places: list[dict[str, Any]] = []
    if tools:
        places.append(tools[-1])
    if system:
        places.append(system[-1])
    found = [end for end in ends[:history_end] if end is not None] if history_end else []
    last = [end for end in ends if end is not None]
    for end in found[-1:] + last[-1:]:
        block = turns[end[0]]["content"][end[1]]
        if block["type"] not in THINKING and all(block is not p for p in places):
            places.append(block)
    for block in places:
        block["cache_control"] = dict(_EPHEMERAL)
