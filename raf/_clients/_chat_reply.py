"""The chat completions reply: a completion's body, or a stream's chunks, as raf's
response and updates."""

from __future__ import annotations

import contextlib
from typing import Any, Final

from raf._clients._reply import built, field, json_object, objects, tokens
from raf._values.messages import AgentResponse, ChatMessage, ToolCall, Update, Usage
from raf.errors import (
    ChatConnectionError,
    ChatProtocolError,
    IncompleteResponseError,
    OutputRefusedError,
)

__all__: list[str] = []

#: The finish reasons of an answer the model did not finish (an IncompleteResponseError),
#: and what they mean.
INCOMPLETE: Final = {
    "length": "the model reached max_tokens - raise max_tokens",
    "content_filter": "a content filter stopped it",
}


def call_name(model: str) -> str:
    """How errors name a call of ``model``."""
    return f"OpenAI chat completion (model {model!r})"


def response_from_reply(
    data: bytes, content_type: str, model: str, *, refuse: bool = False
) -> AgentResponse:
    """The assistant turn, usage and raw ``ChatCompletion`` of a 200 reply's body.

    Anything that is not a chat completion raf can read is a
    :class:`raf.errors.ChatProtocolError` that names the problem. A refusal is the
    text, or with ``refuse`` (structured output asked for) a
    :class:`raf.errors.OutputRefusedError`.
    """
    from openai.types.chat import ChatCompletion

    where = call_name(model)
    reply = json_object(data, content_type, where, "the reply")
    if reply.get("error") is not None:
        raise ChatProtocolError(f"{where}: the server answered 200 with an error: {reply['error']}")
    choices = objects(reply, "choices", where)
    if not choices:
        raise ChatProtocolError(f"{where}: the model returned no choices")
    at = "choices[0].message"
    message = field(choices[0], "message", dict, where, "choices[0]")
    calls = objects(message, "tool_calls", where, at, optional=True)
    turn = _assistant(
        field(message, "content", str, where, at, optional=True),
        field(message, "refusal", str, where, at, optional=True),
        [_tool_call(c, f"{at}.tool_calls[{n}]", where) for n, c in enumerate(calls)],
        model if refuse else None,
    )
    response = AgentResponse((turn,), _usage(reply, where), built(ChatCompletion, reply, where))
    reason = field(choices[0], "finish_reason", str, where, "choices[0]", optional=True)
    if reason in INCOMPLETE:
        raise incomplete(where, reason, response)
    return response


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
    return IncompleteResponseError(
        f"{where}: the answer is incomplete (finish_reason {reason!r}: {INCOMPLETE[reason]}); "
        f"it said {len(partial.text)} characters",
        reason=reason,
        partial=partial,
    )


def _function_only(kind: Any, where: str, path: str) -> None:
    if kind is not None and kind != "function":
        raise ChatProtocolError(
            f"{where}: {path} is a {kind!r} tool call; raf supports function tool calls only"
        )


def _tool_call(call: dict[str, Any], at: str, where: str) -> ToolCall:
    _function_only(call.get("type"), where, at)
    function = field(call, "function", dict, where, at)
    name = field(function, "name", str, where, f"{at}.function")
    arguments = field(function, "arguments", str, where, f"{at}.function", optional=True)
    call_id = field(call, "id", str, where, at)
    return ToolCall(call_id, name, "{}" if arguments is None else arguments)


def _usage(parent: dict[str, Any], where: str) -> Usage | None:
    usage = field(parent, "usage", dict, where, optional=True)
    if usage is None:
        return None
    return Usage(
        tokens(usage, "prompt_tokens", where),
        tokens(usage, "completion_tokens", where),
        cached_input_tokens=tokens(usage, "prompt_tokens_details.cached_tokens", where),
        cache_write_tokens=tokens(usage, "prompt_tokens_details.cache_write_tokens", where),
    )


class StreamedTurn:
    """The updates of one streamed chat completion, from its chunks' JSON (checked where
    raf reads it): text deltas as they come; the rest once the model finished, read as
    :func:`response_from_reply` reads a completion."""

    def __init__(self, model: str, *, refuse: bool = False) -> None:
        self.model = model
        self.refused_by = model if refuse else None
        self.where = f"OpenAI chat completion stream (model {model!r})"
        # The pieces of the text ("content") and of the refusal, once one came: no text
        # is not an empty text.
        self.said: dict[str, list[str]] = {}
        # Each tool call by the server's index: its id, name and argument pieces. A server
        # may repeat the id and name in every delta: they name the call, once.
        self.calls: dict[int, tuple[list[str], list[str], list[str]]] = {}
        self.finished: str | None = None
        self.sent_rest = False
        self.usage: Usage | None = None
        self.usage_chunk: Any = None

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
        if self.finished is not None:  # [DONE] too: it is no JSON object
            with contextlib.suppress(ChatProtocolError):
                return self._usage(json_object(data, None, where, "a chunk"))
            return []
        if data == "[DONE]":
            raise ChatConnectionError(
                f"{where} ended ([DONE]) before the model finished its answer "
                "(no finish_reason): the answer is incomplete"
            )
        chunk = json_object(data, None, where, "a chunk")
        if chunk.get("error") is not None:
            raise ChatProtocolError(
                f"{where}: the server sent an error mid-stream: {chunk['error']}"
            )
        updates: list[Update] = []
        for n, choice in enumerate(objects(chunk, "choices", where)):
            if choice.get("index", 0) == 0:  # raf asks for one choice: others are not its
                self._choice(choice, f"choices[{n}]", chunk, updates)
        return updates + self._usage(chunk)

    def _usage(self, chunk: dict[str, Any]) -> list[Update]:
        # Held to the end, the last one kept: a server may send the call's usage so far in
        # every chunk (vLLM's continuous usage stats), and a run adds up usage updates.
        if chunk.get("usage"):
            self.usage, self.usage_chunk = _usage(chunk, self.where), chunk
        return []

    def _choice(self, choice: dict[str, Any], at: str, chunk: Any, updates: list[Update]) -> None:
        where = self.where
        reason = field(choice, "finish_reason", str, where, at, optional=True)
        delta = field(choice, "delta", dict, where, at, optional=True) or {}
        at += ".delta"
        for key in ("content", "refusal"):
            piece = field(delta, key, str, where, at, optional=True)
            if piece is not None:
                # Appended in place: a list copied for each delta is quadratic in their number.
                self.said.setdefault(key, []).append(piece)
                if piece and key == "content":
                    updates.append(Update("text", piece, raw=chunk))
        for position, piece in enumerate(objects(delta, "tool_calls", where, at, optional=True)):
            here = f"{at}.tool_calls[{position}]"
            _function_only(piece.get("type"), where, here)
            index = field(piece, "index", int, where, here, optional=True)
            function = field(piece, "function", dict, where, here, optional=True) or {}
            call_id, name, pieces = self.calls.setdefault(
                position if index is None else index, ([], [], [])
            )
            for kept, value in (
                (call_id, field(piece, "id", str, where, here, optional=True)),
                (name, field(function, "name", str, where, f"{here}.function", optional=True)),
            ):
                if value and not kept:
                    kept.append(value)
            arguments = field(function, "arguments", str, where, f"{here}.function", optional=True)
            if arguments is not None:
                pieces.append(arguments)
        if reason is not None:  # last: an error in this chunk is no error after the finish
            self.finished = reason

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
        said = {key: "".join(pieces) for key, pieces in self.said.items()}
        text, refusal = said.get("content"), said.get("refusal")
        if partial:
            return ChatMessage.assistant(text or (None if calls else ""), tool_calls=calls)
        return _assistant(text, refusal, calls, self.refused_by)

    def _rest(self, chunk: Any) -> list[Update]:
        """The updates held until the model finished: tool calls (complete only then),
        and the text of an answer that had no text delta (an empty one, a refusal).
        An answer the model did not finish sends no tool calls: they go in the error."""
        if self.finished is None or self.finished in INCOMPLETE or self.sent_rest:
            return []
        # Marked sent once joined: a call that cannot be (no id) raises again at the end,
        # where no error is taken for one after the finish.
        message = self._joined()
        self.sent_rest = True
        updates: list[Update] = []
        if not any(self.said.get("content", ())) and message.content is not None:
            updates.append(Update("text", message.content, raw=chunk))
        return updates + [Update("tool_call", tool_call=c, raw=chunk) for c in message.tool_calls]

    def finish(self) -> list[Update]:
        """The updates left once the stream ended; a stream cut short is an error, and an
        answer the model did not finish an :class:`raf.errors.IncompleteResponseError`."""
        if self.finished is None:
            raise ChatConnectionError(
                f"{self.where} ended before the model finished its answer (no finish_reason): "
                "the answer is incomplete"
            )
        if self.finished in INCOMPLETE:
            partial = AgentResponse((self._joined(partial=True),), self.usage)
            raise incomplete(self.where, self.finished, partial)
        updates = self._rest(None)
        if self.usage is not None:  # the tool calls go out before it
            updates.append(Update("usage", usage=self.usage, raw=self.usage_chunk))
        return updates
