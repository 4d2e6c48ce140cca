"""The chat completions reply: a completion's body, or a stream's chunks, as raf's
response and updates."""

from __future__ import annotations

from typing import Any, Final

from raf._clients._reply import json_object, parse, tokens
from raf._errors import (
    ChatConnectionError,
    ChatProtocolError,
    IncompleteResponseError,
    OutputRefusedError,
)
from raf._values.messages import AgentResponse, ChatMessage, ToolCall, Update, Usage

__all__: list[str] = []

#: The finish reasons of an answer the model did not finish: an IncompleteResponseError.
INCOMPLETE: Final = frozenset({"length", "content_filter"})


def call_name(model: str) -> str:
    """How errors name a call of ``model``."""
    return f"OpenAI chat completion (model {model!r})"


# What raf reads of a completion and of a chunk: checked (see parse).
_CALL: Final = ("", ".*", ".*.id", ".*.function", ".*.function.name", ".*.function.arguments?")
_CACHED: Final = ("prompt_tokens_details.cached_tokens", "prompt_tokens_details.cache_write_tokens")
_USAGE: Final = ("usage", "usage.prompt_tokens?", "usage.completion_tokens?") + tuple(
    f"usage.{path}?" for path in _CACHED
)
_READS: Final = frozenset(
    {"choices", "choices.*", "choices.*.message"}
    | {f"choices.*.message.{key}" for key in ("content", "refusal")}
    | {f"choices.*.message.tool_calls{tail}" for tail in _CALL}
    | set(_USAGE)
)
_CHUNK_READS: Final = frozenset(
    {"choices", "choices.*", "choices.*.delta?"}
    | {f"choices.*.delta.{key}" for key in ("content", "refusal")}
    | {f"choices.*.delta.tool_calls{tail}" for tail in (*_CALL, ".*.index?")}
    | set(_USAGE)
)


def response_from_reply(
    data: bytes, content_type: str, model: str, *, refuse: bool = False
) -> AgentResponse:
    """The assistant turn, usage and raw ``ChatCompletion`` of a 200 reply's body.

    Anything that is not a chat completion raf can read is a
    :class:`raf.ChatProtocolError` that names the problem. A refusal is the
    text, or with ``refuse`` (structured output asked for) a
    :class:`raf.OutputRefusedError`.
    """
    from openai.types.chat import ChatCompletion

    where = call_name(model)
    reply = json_object(data, content_type, where, "the reply")
    if reply.get("error") is not None:
        raise ChatProtocolError(f"{where}: the server answered 200 with an error: {reply['error']}")
    completion = parse(ChatCompletion, reply, where, _READS)
    if not completion.choices:
        raise ChatProtocolError(f"{where}: the model returned no choices")
    choice = completion.choices[0]
    message = _message(choice.message, where, model if refuse else None)
    response = AgentResponse((message,), _usage(completion.usage, where), completion)
    reason = getattr(choice, "finish_reason", None)
    if reason in INCOMPLETE:
        raise incomplete(where, reason, response)
    return response


def _message(message: Any, where: str, refused_by: str | None) -> ChatMessage:
    """A completion's message as raf's."""
    at = "choices[0].message.tool_calls"
    calls = [_tool_call(c, f"{at}[{n}]", where) for n, c in enumerate(message.tool_calls or ())]
    return _assistant(message.content, message.refusal, calls, refused_by)


def _assistant(
    text: str | None, refusal: str | None, calls: list[ToolCall], refused_by: str | None
) -> ChatMessage:
    """The assistant turn; with no text and no calls, a refusal is what the user should
    read (``refused_by``, a model: a refusal raises)."""
    if text is None and not calls:
        text = refusal
        if refused_by is not None and text is not None:
            raise OutputRefusedError(text, model=refused_by)
    return ChatMessage.assistant(text, tool_calls=calls)


def incomplete(where: str, reason: str, partial: AgentResponse) -> IncompleteResponseError:
    """The error of an answer that ended with the finish reason ``reason`` (in INCOMPLETE)."""
    why = (
        "the model reached max_tokens - raise max_tokens"
        if reason == "length"
        else "a content filter stopped it"
    )
    return IncompleteResponseError(
        f"{where}: the answer is incomplete (finish_reason {reason!r}: {why}); "
        f"it said {len(partial.text)} characters",
        reason=reason,
        partial=partial,
    )


def _function_only(kind: Any, where: str, path: str) -> None:
    if kind is not None and kind != "function":
        raise ChatProtocolError(
            f"{where}: {path} is a {kind!r} tool call; raf supports function tool calls only"
        )


def _tool_call(call: Any, path: str, where: str) -> ToolCall:
    _function_only(getattr(call, "type", None), where, path)
    function: Any = getattr(call, "function", None)
    if getattr(call, "id", None) is None:
        raise ChatProtocolError(f"{where}: {path} has no id")
    if getattr(function, "name", None) is None:
        raise ChatProtocolError(f"{where}: {path} has no function name")
    arguments = getattr(function, "arguments", None)
    return ToolCall(call.id, function.name, "{}" if arguments is None else arguments)


def _usage(usage: Any, where: str) -> Usage | None:
    if usage is None:
        return None
    return Usage(
        tokens(usage, "prompt_tokens", where),
        tokens(usage, "completion_tokens", where),
        cached_input_tokens=tokens(usage, _CACHED[0], where),
        cache_write_tokens=tokens(usage, _CACHED[1], where),
    )


class StreamedTurn:
    """The updates of one streamed chat completion, from its chunks' JSON (each checked
    as the SDK's ``ChatCompletionChunk``): text deltas as they come; the rest once the
    model finished, read as :func:`response_from_reply` reads a completion."""

    def __init__(self, model: str, *, refuse: bool = False) -> None:
        self.model = model
        self.refused_by = model if refuse else None
        self.where = f"OpenAI chat completion stream (model {model!r})"
        self.texts: list[str] | None = None
        self.refusals: list[str] | None = None
        # Each tool call by the server's index: its id, name and argument pieces. A server
        # may repeat the id and name in every delta: they name the call, once.
        self.calls: dict[int, tuple[list[str], list[str], list[str]]] = {}
        self.finished: str | None = None
        self.text_sent = False
        self.sent_rest = False
        self.usage: Usage | None = None

    @property
    def done(self) -> bool:
        """Whether the model finished its answer (a ``finish_reason`` came)."""
        return self.finished is not None

    def plain(self, data: bytes, content_type: str) -> list[Update]:
        """The updates of a server that ignored "stream": one chat completion."""
        answer = response_from_reply(
            data, content_type, self.model, refuse=self.refused_by is not None
        )
        return list(answer.to_updates())

    def feed(self, data: str) -> list[Update]:
        """The updates one event's data makes (``[DONE]`` and usage-only chunks included).

        Once the model finished (a ``finish_reason`` came), the answer is
        decided: only the usage is still read; text, tool calls, an error or a
        chunk that is not JSON after it change nothing and raise nothing.
        """
        where = self.where
        if data == "[DONE]":
            if self.finished is None:
                raise ChatConnectionError(
                    f"{where} ended ([DONE]) before the model finished its answer "
                    "(no finish_reason): the answer is incomplete"
                )
            return []
        try:
            chunk = json_object(data, None, where, "a chunk")
            if self.finished is not None:  # after the finish: its usage if readable; no more
                return self._usage(chunk)
        except ChatProtocolError:
            if self.finished is not None:
                return []
            raise
        if chunk.get("error") is not None:
            raise ChatProtocolError(
                f"{where}: the server sent an error mid-stream: {chunk['error']}"
            )
        updates: list[Update] = []
        for choice in self._parse(chunk).choices or ():
            if getattr(choice, "index", 0) == 0:  # raf asks for one choice: others are not its
                self._choice(choice, chunk, updates)
        return updates + self._usage(chunk)

    def _parse(self, chunk: dict[str, Any]) -> Any:
        from openai.types.chat import ChatCompletionChunk

        return parse(ChatCompletionChunk, chunk, self.where, _CHUNK_READS)

    def _usage(self, chunk: dict[str, Any]) -> list[Update]:
        usage = _usage(self._parse(chunk).usage, self.where) if chunk.get("usage") else None
        if usage is None:
            return []
        self.usage = usage
        # The usage comes after the finish: the tool calls go out before it.
        return [*self._rest(chunk), Update("usage", usage=usage, raw=chunk)]

    def _choice(self, choice: Any, chunk: Any, updates: list[Update]) -> None:
        delta: Any = getattr(choice, "delta", None)
        content, refusal = getattr(delta, "content", None), getattr(delta, "refusal", None)
        if content is not None:
            # Appended in place: a list copied for each delta is quadratic in their number.
            self.texts = self.texts if self.texts is not None else []
            self.texts.append(content)
            if content:
                self.text_sent = True
                updates.append(Update("text", content, raw=chunk))
        if refusal is not None:
            self.refusals = self.refusals if self.refusals is not None else []
            self.refusals.append(refusal)
        for position, piece in enumerate(getattr(delta, "tool_calls", None) or ()):
            at = f"choices[0].delta.tool_calls[{position}]"
            _function_only(getattr(piece, "type", None), self.where, at)
            index = getattr(piece, "index", None)
            call_id, name, pieces = self.calls.setdefault(
                position if index is None else index, ([], [], [])
            )
            function: Any = getattr(piece, "function", None)
            for kept, value in ((call_id, piece.id), (name, getattr(function, "name", None))):
                if value and not kept:
                    kept.append(value)
            if getattr(function, "arguments", None) is not None:
                pieces.append(function.arguments)
        reason = getattr(choice, "finish_reason", None)
        if reason is not None:
            self.finished = str(reason)

    def _joined(self, *, partial: bool = False) -> ChatMessage:
        """The message the chunks joined; ``partial``: what can be read of it (the calls
        with an id and a name, their arguments maybe cut), no error."""
        calls: list[ToolCall] = []
        for index, (call_id, name, pieces) in self.calls.items():
            if not (call_id and name):
                if partial:
                    continue
                missing = "function name" if call_id else "id"
                raise ChatProtocolError(
                    f"{self.where}: the tool call of index {index} has no {missing}"
                )
            calls.append(ToolCall(call_id[0], name[0], "".join(pieces) if pieces else "{}"))
        text = None if self.texts is None else "".join(self.texts)
        if partial:
            return ChatMessage.assistant(text or (None if calls else ""), tool_calls=calls)
        refusal = None if self.refusals is None else "".join(self.refusals)
        return _assistant(text, refusal, calls, self.refused_by)

    def _rest(self, chunk: Any) -> list[Update]:
        """The updates held until the model finished: tool calls (complete only then),
        and the text of an answer that had no text delta (an empty one, a refusal).
        An answer the model did not finish sends no tool calls: they go in the error."""
        if self.finished is None or self.finished in INCOMPLETE or self.sent_rest:
            return []
        self.sent_rest = True
        message = self._joined()
        updates: list[Update] = []
        if not self.text_sent and message.content is not None:
            updates.append(Update("text", message.content, raw=chunk))
        return updates + [Update("tool_call", tool_call=c, raw=chunk) for c in message.tool_calls]

    def finish(self) -> list[Update]:
        """The updates left once the stream ended; a stream cut short is an error, and an
        answer the model did not finish an :class:`raf.IncompleteResponseError`."""
        if self.finished is None:
            raise ChatConnectionError(
                f"{self.where} ended before the model finished its answer (no finish_reason): "
                "the answer is incomplete"
            )
        if self.finished in INCOMPLETE:
            partial = AgentResponse((self._joined(partial=True),), self.usage)
            raise incomplete(self.where, self.finished, partial)
        return self._rest(None)
