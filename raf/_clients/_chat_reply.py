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
_JSON_TEXT: Final = "a string of JSON"


def call_name(model: str) -> str:
    """How errors name a call of ``model``."""
    return f"OpenAI chat completion (model {model!r})"


# What raf reads of a completion and of a chunk: checked (see parse).
_CALL: Final = ("", ".*", ".*.id", ".*.function", ".*.function.name", ".*.function.arguments?")
_USAGE: Final = ("usage", "usage.prompt_tokens?", "usage.completion_tokens?")
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
    message = choice.message
    calls = [_tool_call(call, n, where) for n, call in enumerate(message.tool_calls or ())]
    text = message.content
    if text is None and not calls:
        # A refusal is what the user should read when there is no answer.
        text = message.refusal
        if refuse and text is not None:
            raise OutputRefusedError(text, model=model)
    usage = _usage(completion.usage, where)
    response = AgentResponse((ChatMessage.assistant(text, tool_calls=calls),), usage, completion)
    reason = getattr(choice, "finish_reason", None)
    if reason in INCOMPLETE:
        raise incomplete(where, reason, response)
    return response


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


def _tool_call(call: Any, n: int, where: str) -> ToolCall:
    _function_only(getattr(call, "type", None), where, f"choices[0].message.tool_calls[{n}]")
    arguments = getattr(call.function, "arguments", None)
    return ToolCall(call.id, call.function.name, "{}" if arguments is None else arguments)


def _usage(usage: Any, where: str) -> Usage | None:
    if usage is None:
        return None
    return Usage(tokens(usage, "prompt_tokens", where), tokens(usage, "completion_tokens", where))


class StreamedTurn:
    """The updates of one streamed chat completion, from its chunks' JSON."""

    def __init__(self, model: str, *, refuse: bool = False) -> None:
        self.model = model
        self.refuse = refuse  # a refusal is an OutputRefusedError, not the text
        self.where = f"OpenAI chat completion stream (model {model!r})"
        # index -> [id, name, argument pieces or None when no arguments came, last chunk]
        self.calls: dict[int, list[Any]] = {}
        self.finished: str | None = None
        self.text_sent = False
        self.empty_text = False
        self.refusal: list[str] = []
        # What an incomplete answer's error carries as its partial response.
        self.text: list[str] = []
        self.usage: Usage | None = None

    @property
    def done(self) -> bool:
        """Whether the model finished its answer (a ``finish_reason`` came)."""
        return self.finished is not None

    def plain(self, data: bytes, content_type: str) -> list[Update]:
        """The updates of a server that ignored "stream": one chat completion."""
        answer = response_from_reply(data, content_type, self.model, refuse=self.refuse)
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
        return [*self._finish_updates(chunk), Update("usage", usage=usage, raw=chunk)]

    def _choice(self, choice: Any, chunk: Any, updates: list[Update]) -> None:
        delta: Any = getattr(choice, "delta", None)
        content = getattr(delta, "content", None)
        if content:
            self.text_sent = True
            self.text.append(content)
            updates.append(Update("text", content, raw=chunk))
        elif content is not None:
            self.empty_text = True
        if getattr(delta, "refusal", None) is not None:
            self.refusal.append(delta.refusal)
        for position, piece in enumerate(getattr(delta, "tool_calls", None) or ()):
            path = f"choices[0].delta.tool_calls[{position}]"
            self._tool_call_delta(piece, path, position, chunk)
        reason = getattr(choice, "finish_reason", None)
        if reason is not None:
            self.finished = str(reason)

    def _tool_call_delta(self, piece: Any, path: str, position: int, chunk: Any) -> None:
        index = getattr(piece, "index", None)
        _function_only(getattr(piece, "type", None), self.where, path)
        call = self.calls.setdefault(
            position if index is None else index, [None, None, None, chunk]
        )
        call[3] = chunk
        if call[0] is None:
            call[0] = piece.id
        function = piece.function
        name = getattr(function, "name", None)
        if name is not None and not call[1]:
            call[1] = name
        arguments = getattr(function, "arguments", None)
        if arguments is not None:
            call[2] = [*(call[2] or ()), arguments]

    def _finish_updates(self, chunk: Any) -> list[Update]:
        """The updates held until the model finished: tool calls (complete only then),
        and the text of an answer that had no text delta (an empty one, a refusal).
        An answer the model did not finish sends no tool calls: they go in the error."""
        if self.finished is None or self.finished in INCOMPLETE:
            return []
        updates: list[Update] = []
        if not self.text_sent and not self.calls:
            if self.refuse and self.refusal:
                raise OutputRefusedError("".join(self.refusal), model=self.model)
            if self.empty_text:
                updates.append(Update("text", "", raw=chunk))
            elif self.refusal:
                updates.append(Update("text", "".join(self.refusal), raw=chunk))
            self.text_sent = True
        for index in sorted(self.calls):
            call_id, name, arguments, last = self.calls[index]
            path = f"the tool call of index {index}"
            if call_id is None:
                raise ChatProtocolError(f"{self.where}: {path} has no id")
            if name is None:
                raise ChatProtocolError(f"{self.where}: {path} has no function name")
            text = "{}" if arguments is None else "".join(arguments)
            updates.append(Update("tool_call", tool_call=ToolCall(call_id, name, text), raw=last))
        self.calls = {}
        return updates

    def finish(self) -> list[Update]:
        """The updates left once the stream ended; a stream cut short is an error, and an
        answer the model did not finish an :class:`raf.IncompleteResponseError`."""
        if self.finished is None:
            raise ChatConnectionError(
                f"{self.where} ended before the model finished its answer (no finish_reason): "
                "the answer is incomplete"
            )
        if self.finished in INCOMPLETE:
            raise incomplete(self.where, self.finished, self._partial())
        return self._finish_updates(None)

    def _partial(self) -> AgentResponse:
        """What the model said before it stopped: its text and its tool calls that have
        an id and a name (their arguments may be cut), and the usage."""
        calls = [
            ToolCall(call_id, name, "{}" if arguments is None else "".join(arguments))
            for call_id, name, arguments, _ in (self.calls[i] for i in sorted(self.calls))
            if call_id is not None and name is not None
        ]
        text = "".join(self.text) if self.text_sent or not calls else None
        return AgentResponse((ChatMessage.assistant(text, tool_calls=calls),), self.usage)
