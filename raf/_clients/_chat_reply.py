"""The chat completions reply: a completion's body, or a stream's chunks, as raf's
response and updates."""

from __future__ import annotations

import json
from typing import Any, Final

from raf._clients._reply import MISSING, json_object, json_type, quote, sdk_object, tokens
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


def response_from_reply(
    data: bytes, content_type: str, model: str, *, refuse: bool = False
) -> AgentResponse:
    """The assistant turn, usage and raw ``ChatCompletion`` of a 200 reply's body.

    Anything that is not a chat completion raf can read is a
    :class:`raf.ChatProtocolError` that names the problem. A refusal is the
    text, or with ``refuse`` (structured output asked for) a
    :class:`raf.OutputRefusedError`.
    """
    where = call_name(model)
    reply = json_object(data, content_type, where)
    if reply.get("error") is not None:
        raise ChatProtocolError(f"{where}: the server answered 200 with an error: {reply['error']}")
    choices = reply.get("choices", MISSING)
    if not isinstance(choices, list):
        raise ChatProtocolError(f"{where}: 'choices' is {json_type(choices)}, not a list")
    if not choices:
        raise ChatProtocolError(f"{where}: the model returned no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ChatProtocolError(f"{where}: choices[0] is {json_type(choice)}, not an object")
    message = choice.get("message", MISSING)
    if not isinstance(message, dict):
        raise ChatProtocolError(
            f"{where}: choices[0].message is {json_type(message)}, not an object"
        )
    text = _optional_str(message, "content", where)
    calls = [
        _tool_call(call, f"choices[0].message.tool_calls[{n}]", where)
        for n, call in enumerate(_optional_list(message, "tool_calls", where))
    ]
    if text is None and not calls:
        # A refusal is what the user should read when there is no answer.
        text = _optional_str(message, "refusal", where)
        if refuse and text is not None:
            raise OutputRefusedError(text, model=model)
    usage = None
    raw_usage = reply.get("usage")
    if raw_usage is not None:
        if not isinstance(raw_usage, dict):
            raise ChatProtocolError(f"{where}: 'usage' is {json_type(raw_usage)}, not an object")
        usage = Usage(
            tokens(raw_usage, "prompt_tokens", where),
            tokens(raw_usage, "completion_tokens", where),
        )
    response = AgentResponse(
        (ChatMessage.assistant(text, tool_calls=calls),), usage, _completion(reply)
    )
    reason = choice.get("finish_reason")
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


def _tool_call(call: Any, path: str, where: str) -> ToolCall:
    if not isinstance(call, dict):
        raise ChatProtocolError(f"{where}: {path} is {json_type(call)}, not an object")
    kind = call.get("type", "function")
    if kind != "function":
        raise ChatProtocolError(
            f"{where}: {path} is a {kind!r} tool call; raf supports function tool calls only"
        )
    call_id = call.get("id", MISSING)
    if not isinstance(call_id, str):
        raise ChatProtocolError(f"{where}: {path}.id is {json_type(call_id)}, not a string")
    function = call.get("function", MISSING)
    if not isinstance(function, dict):
        raise ChatProtocolError(f"{where}: {path}.function is {json_type(function)}, not an object")
    name = function.get("name", MISSING)
    if not isinstance(name, str):
        raise ChatProtocolError(f"{where}: {path}.function.name is {json_type(name)}, not a string")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = "{}"
    elif not isinstance(arguments, str):
        raise ChatProtocolError(
            f"{where}: {path}.function.arguments is {json_type(arguments)}, not a string of JSON"
        )
    return ToolCall(call_id, name, arguments)


def _optional_str(data: dict[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ChatProtocolError(
            f"{where}: choices[0].message.{key} is {json_type(value)}, not a string"
        )
    return value


def _optional_list(data: dict[str, Any], key: str, where: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ChatProtocolError(
            f"{where}: choices[0].message.{key} is {json_type(value)}, not a list"
        )
    return value


def _completion(reply: dict[str, Any]) -> Any:
    """The SDK's ``ChatCompletion`` for ``raw``: validated, or built leniently."""
    from openai.types.chat import ChatCompletion

    return sdk_object(ChatCompletion, reply)


class StreamedTurn:
    """The updates of one streamed chat completion, from its chunks' JSON."""

    __slots__ = (
        "calls",
        "empty_text",
        "finished",
        "model",
        "refusal",
        "refuse",
        "text",
        "text_sent",
        "usage",
        "where",
    )

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
            chunk = json.loads(data)
        except (ValueError, RecursionError) as exc:
            if self.finished is not None:
                return []
            raise ChatProtocolError(
                f"{where}: a chunk is not JSON ({exc}): {quote(data.encode())}"
            ) from None
        if not isinstance(chunk, dict):
            if self.finished is not None:
                return []
            raise ChatProtocolError(
                f"{where}: a chunk is {json_type(chunk)}, not a JSON object: {quote(data.encode())}"
            )
        if self.finished is not None:
            return self._after_finish(chunk)
        if chunk.get("error") is not None:
            raise ChatProtocolError(
                f"{where}: the server sent an error mid-stream: {chunk['error']}"
            )
        updates: list[Update] = []
        choices = chunk.get("choices")
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            raise ChatProtocolError(
                f"{where}: a chunk's 'choices' is {json_type(choices)}, not a list"
            )
        for choice in choices:
            if not isinstance(choice, dict):
                raise ChatProtocolError(
                    f"{where}: a chunk's choice is {json_type(choice)}, not an object"
                )
            if choice.get("index", 0) != 0:
                continue  # raf asks for one choice: others are not its answer
            self._choice(choice, chunk, updates)
        updates += self._usage(chunk)
        return updates

    def _after_finish(self, chunk: dict[str, Any]) -> list[Update]:
        """A chunk after the finish: its usage, if it has a readable one; nothing else."""
        try:
            return self._usage(chunk)
        except ChatProtocolError:
            return []

    def _usage(self, chunk: dict[str, Any]) -> list[Update]:
        where = self.where
        raw_usage = chunk.get("usage")
        if raw_usage is None:
            return []
        if not isinstance(raw_usage, dict):
            raise ChatProtocolError(
                f"{where}: a chunk's 'usage' is {json_type(raw_usage)}, not an object"
            )
        usage = Usage(
            tokens(raw_usage, "prompt_tokens", where),
            tokens(raw_usage, "completion_tokens", where),
        )
        self.usage = usage
        # The usage comes after the finish: the tool calls go out before it.
        return [*self._finish_updates(chunk), Update("usage", usage=usage, raw=chunk)]

    def _choice(self, choice: dict[str, Any], chunk: Any, updates: list[Update]) -> None:
        where = self.where
        delta = choice.get("delta")
        if delta is None:
            delta = {}
        if not isinstance(delta, dict):
            raise ChatProtocolError(
                f"{where}: choices[0].delta is {json_type(delta)}, not an object"
            )
        content = delta.get("content")
        if content is not None:
            if not isinstance(content, str):
                raise ChatProtocolError(
                    f"{where}: choices[0].delta.content is {json_type(content)}, not a string"
                )
            if content:
                self.text_sent = True
                self.text.append(content)
                updates.append(Update("text", content, raw=chunk))
            else:
                self.empty_text = True
        refusal = delta.get("refusal")
        if refusal is not None:
            if not isinstance(refusal, str):
                raise ChatProtocolError(
                    f"{where}: choices[0].delta.refusal is {json_type(refusal)}, not a string"
                )
            self.refusal.append(refusal)
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise ChatProtocolError(
                    f"{where}: choices[0].delta.tool_calls is {json_type(tool_calls)}, not a list"
                )
            for position, piece in enumerate(tool_calls):
                self._tool_call_delta(piece, position, chunk)
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise ChatProtocolError(
                    f"{where}: choices[0].finish_reason is {json_type(reason)}, not a string"
                )
            self.finished = reason

    def _tool_call_delta(self, piece: Any, position: int, chunk: Any) -> None:
        where = self.where
        path = f"choices[0].delta.tool_calls[{position}]"
        if not isinstance(piece, dict):
            raise ChatProtocolError(f"{where}: {path} is {json_type(piece)}, not an object")
        index = piece.get("index", position)
        if type(index) is not int:
            raise ChatProtocolError(f"{where}: {path}.index is {json_type(index)}, not an int")
        kind = piece.get("type")
        if kind is not None and kind != "function":
            raise ChatProtocolError(
                f"{where}: {path} is a {kind!r} tool call; raf supports function tool calls only"
            )
        call = self.calls.get(index)
        if call is None:
            call = self.calls[index] = [None, None, None, chunk]
        call[3] = chunk
        call_id = piece.get("id")
        if call_id is not None:
            if not isinstance(call_id, str):
                raise ChatProtocolError(f"{where}: {path}.id is {json_type(call_id)}, not a string")
            if call[0] is None:
                call[0] = call_id
        function = piece.get("function")
        if function is None:
            return
        if not isinstance(function, dict):
            raise ChatProtocolError(
                f"{where}: {path}.function is {json_type(function)}, not an object"
            )
        name = function.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise ChatProtocolError(
                    f"{where}: {path}.function.name is {json_type(name)}, not a string"
                )
            if not call[1]:
                call[1] = name
        arguments = function.get("arguments")
        if arguments is not None:
            if not isinstance(arguments, str):
                raise ChatProtocolError(
                    f"{where}: {path}.function.arguments is {json_type(arguments)}, "
                    "not a string of JSON"
                )
            if call[2] is None:
                call[2] = [arguments]
            else:
                call[2].append(arguments)

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
