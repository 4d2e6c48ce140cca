"""A Gemini reply (the google-genai SDK's ``GenerateContentResponse``, whole or chunk by
chunk) as raf's response and updates, with the thought signatures it carried, and the
SDK's errors as raf's."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from typing import Any, Final

import httpx2
from google.genai import errors, types

from raf._clients._overflow import overflow
from raf._clients._reply import json_type
from raf._clients._sdk import MAX_QUOTED, RETRY_AFTER_MAX, error_from_http, retry_after_seconds
from raf._values.carried import Reasoning
from raf._values.messages import AgentResponse, ChatMessage, ToolCall, Update, Usage
from raf.errors import (
    AuthenticationError,
    BadRequestError,
    ChatClientError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    IncompleteResponseError,
    RateLimitError,
    ServerError,
)

__all__: list[str] = []

#: The source of the reasoning this wire keeps (:class:`raf.Reasoning`).
SOURCE: Final = "gemini"
#: How the ids raf gives calls that came without one begin: never sent back to the API.
MADE_ID: Final = "raf-gemini-"
#: The finish reasons of an answer the model did not finish.
_CUT: Final = frozenset({"MAX_TOKENS"})
#: The finish reasons of a whole answer.
_DONE: Final = frozenset({"STOP"})


def call_name(model: str) -> str:
    """How errors name a call of ``model``."""
    return f"Gemini generateContent (model {model!r})"


def _error_object(details: Any) -> Any:
    """The ``error`` object of a Google error body (``[{"error": ...}]`` on a stream)."""
    if isinstance(details, list) and details:
        details = details[0]
    return details.get("error") if isinstance(details, dict) else None


def error_from_genai(exc: Exception, where: str) -> ChatClientError:
    """The :class:`raf.ChatClientError` for an error of the google-genai SDK (an
    ``APIError`` with Google's ``code``, ``status`` and ``message``) or of its HTTP
    stack; ``retry_after`` from the reply's ``Retry-After``. A 400 that says the key
    is not valid (``API_KEY_INVALID``) is an :class:`raf.errors.AuthenticationError`, one
    on the input token count a :class:`raf.ContextOverflowError`."""
    if isinstance(exc, errors.APIError) and isinstance(exc.code, int):
        status = exc.code
        text = f"{where} failed with HTTP {status} {exc.status or ''}".rstrip()
        text += f": {exc.message:.{MAX_QUOTED}}" if exc.message else ""  # an excerpt
        headers = getattr(exc.response, "headers", None)
        retry_after = retry_after_seconds(headers) if isinstance(headers, Mapping) else None
        if retry_after is None:
            retry_after = _retry_delay(exc.details)
        kind: type[ChatClientError] = BadRequestError
        if status == 429:
            kind = RateLimitError
        elif status == 408:
            kind = ChatTimeoutError
        elif status == 409 or status >= 500:
            kind = ServerError
        elif status in (401, 403) or "API_KEY_INVALID" in str(exc.details):
            kind = AuthenticationError
        elif status < 400:
            kind = ChatClientError
        elif (error := overflow(_error_object(exc.details), text, status)) is not None:
            return error
        return kind(text, status_code=status, retry_after=retry_after)
    if isinstance(exc, httpx2.HTTPError):
        return error_from_http(exc, where)
    if isinstance(exc, errors.APIError):  # an error chunk with no code
        return ChatClientError(f"{where}: the server sent an error: {exc!s:.{MAX_QUOTED}}")
    return ChatProtocolError(
        f"{where}: the google-genai SDK could not read the reply: {type(exc).__name__}: "
        f"{exc!s:.{MAX_QUOTED}}"
    )


def _retry_delay(details: Any) -> float | None:
    """The ``retryDelay`` of the ``google.rpc.RetryInfo`` in an error's ``details`` (a
    Duration, ``"38s"`` or ``"0.5s"``) in seconds: how Gemini says when to retry a 429.

    >>> info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "38s"}
    >>> _retry_delay({"error": {"details": [info]}}), _retry_delay({"error": {}})
    (38.0, None)
    """
    error = details.get("error") if isinstance(details, Mapping) else None
    entries = error.get("details") if isinstance(error, Mapping) else None
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping) or not str(entry.get("@type", "")).endswith(
            "google.rpc.RetryInfo"
        ):
            continue
        delay = entry.get("retryDelay")
        try:
            seconds = float(str(delay).removesuffix("s"))
        except ValueError:
            return None
        return min(max(seconds, 0.0), RETRY_AFTER_MAX) if seconds == seconds else None
    return None


#: What :func:`error_from_genai` maps: everything else is not the call's failure.
SDK_ERRORS: Final = (errors.APIError, httpx2.HTTPError, ValueError)


def _signature(part: types.Part) -> dict[str, str]:
    signed = part.thought_signature
    return {} if not signed else {"signature": base64.b64encode(signed).decode()}


class Reading:
    """The parts of one model turn as they come (whole, or chunk by chunk): its text,
    its calls, and the order of what it carried to send back (thoughts, and where the
    text and each call were, with their thought signatures)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.texts: list[str] | None = None
        self.calls: list[ToolCall] = []
        self.order: list[dict[str, Any]] = []
        #: What the ids raf makes for this turn's calls share: the reply's id, when it has one.
        self.made: str | None = None

    def add(self, part: types.Part) -> str:
        """Take one part; the text to show of it (``""`` for none)."""
        signature = _signature(part)
        call = part.function_call
        if call is not None:
            self._call(call, signature)
            return ""
        text = part.text or ""
        if part.thought:
            last = self.order[-1] if self.order else None
            if last is not None and last["type"] == "thought" and "signature" not in last:
                last["text"] += text
                last.update(signature)
            else:
                self.order.append({"type": "thought", "text": text, **signature})
            return ""
        if not text:
            # A signature streamed on a part of its own belongs to the part before it.
            last = self.order[-1] if self.order else None
            if signature and last is not None and "signature" not in last:
                last.update(signature)
            elif signature:
                self._text_entry().update(signature)
            return ""
        self.texts = [*(self.texts or ()), text]
        self._text_entry().update(signature)
        return text

    def _text_entry(self) -> dict[str, Any]:
        for entry in self.order:
            if entry["type"] == "text":
                return entry
        self.order.append({"type": "text"})
        return self.order[-1]

    def _call(self, call: types.FunctionCall, signature: dict[str, str]) -> None:
        if not isinstance(call.name, str) or not call.name:
            raise ChatProtocolError(
                f"{self.where}: a functionCall's name is {json_type(call.name)}, not a string"
            )
        args = call.args if call.args is not None else {}
        if not isinstance(args, dict):
            raise ChatProtocolError(
                f"{self.where}: the args of functionCall {call.name!r} are "
                f"{json_type(args)}, not an object"
            )
        if self.made is None:
            self.made = uuid.uuid4().hex[:12]
        call_id = call.id or f"{MADE_ID}{self.made}-{len(self.calls)}"
        arguments = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
        self.calls.append(ToolCall(call_id, call.name, arguments))
        self.order.append({"type": "call", "id": call_id, **signature})

    def message(self) -> ChatMessage:
        """The assistant message so far, its reasoning on it when it carried any."""
        text = None if self.texts is None else "".join(self.texts)
        kept = any(e["type"] == "thought" or "signature" in e for e in self.order)
        reasoning = None
        if kept:
            reasoning = Reasoning(SOURCE, json.dumps(self.order, separators=(",", ":")))
        return ChatMessage("assistant", text, tool_calls=tuple(self.calls), reasoning=reasoning)


def read_usage(metadata: types.GenerateContentResponseUsageMetadata | None) -> Usage | None:
    """A reply's ``usageMetadata``: the prompt (its cached part included) and tool-use
    prompt tokens in; the candidates' and the thoughts' tokens out."""
    if metadata is None:
        return None
    counts = [
        metadata.prompt_token_count,
        metadata.tool_use_prompt_token_count,
        metadata.candidates_token_count,
        metadata.thoughts_token_count,
        metadata.cached_content_token_count,
    ]
    prompt, tool_use, output, thoughts, cached = (max(count or 0, 0) for count in counts)
    return Usage(
        prompt + tool_use,
        output + thoughts,
        cached_input_tokens=cached,
        reasoning_tokens=thoughts,
    )


def _word(value: Any) -> str | None:
    """An enum of the SDK (or a string it did not know) as Google's word."""
    if value is None:
        return None
    return str(getattr(value, "value", value))


def check_blocked(response: types.GenerateContentResponse, where: str) -> None:
    """A prompt the API blocked (``promptFeedback.blockReason``) as a non-retryable
    :class:`raf.ChatClientError` that names the reason."""
    feedback = response.prompt_feedback
    reason = _word(feedback.block_reason) if feedback is not None else None
    if reason is not None:
        detail = (
            f": {feedback.block_reason_message}"
            if feedback and feedback.block_reason_message
            else ""
        )
        raise ChatClientError(
            f"{where}: the prompt was blocked (blockReason {reason!r}){detail}; "
            "the request is not answered"
        )


def check_finish(
    reason: str | None, message: str | None, where: str, partial: AgentResponse
) -> None:
    """A cut answer (``MAX_TOKENS``) as an :class:`raf.errors.IncompleteResponseError` with
    ``partial``; any other ending but ``STOP`` (``SAFETY``, ``RECITATION``,
    ``PROHIBITED_CONTENT``, a malformed call, ...) as a non-retryable
    :class:`raf.ChatClientError` that names it: never a complete answer."""
    if reason in _DONE:
        return
    if reason in _CUT:
        raise IncompleteResponseError(
            f"{where}: the answer was cut (finishReason 'MAX_TOKENS') - raise max_tokens",
            reason="MAX_TOKENS",
            partial=partial,
        )
    if reason is None:
        raise ChatProtocolError(f"{where}: the candidate has no finishReason")
    detail = f": {message}" if message else ""
    raise ChatClientError(
        f"{where}: the model stopped without an answer (finishReason {reason!r}){detail}; "
        "the request is not answered"
    )


def _candidate(response: types.GenerateContentResponse, where: str) -> types.Candidate | None:
    candidates = response.candidates or []
    if len(candidates) > 1:
        raise ChatProtocolError(
            f"{where}: the reply has {len(candidates)} candidates; raf asks for one"
        )
    return candidates[0] if candidates else None


def response_from_reply(response: types.GenerateContentResponse, where: str) -> AgentResponse:
    """The assistant turn of a whole reply; a blocked prompt, a cut answer or a safety
    stop as the errors :func:`check_blocked` and :func:`check_finish` raise."""
    check_blocked(response, where)
    candidate = _candidate(response, where)
    if candidate is None:
        raise ChatProtocolError(f"{where}: the reply has no candidate and no blockReason")
    reading = Reading(where)
    reading.made = response.response_id
    for part in (candidate.content.parts if candidate.content else None) or []:
        reading.add(part)
    answer = AgentResponse((reading.message(),), read_usage(response.usage_metadata), response)
    check_finish(_word(candidate.finish_reason), candidate.finish_message, where, answer)
    return answer


class StreamState:
    """What a stream's chunks amount to so far; :meth:`feed` turns one into updates.

    Text goes out as it comes (thoughts do not); the calls, the reasoning and the usage once a
    chunk carries the ``finishReason`` (only then is the turn whole); a stream
    that ends before one is a :class:`raf.errors.ChatConnectionError`.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.done = False
        self.reading = Reading(where)
        self.usage: Usage | None = None
        self.message: ChatMessage | None = None

    def feed(self, chunk: types.GenerateContentResponse) -> list[Update]:
        """The updates of one chunk (none once the turn is whole)."""
        if self.done:
            return []
        check_blocked(chunk, self.where)
        if chunk.usage_metadata is not None:
            self.usage = read_usage(chunk.usage_metadata)  # the totals so far: the last wins
        candidate = _candidate(chunk, self.where)
        if candidate is None:
            return []
        self.reading.made = self.reading.made or chunk.response_id
        updates = []
        for part in (candidate.content.parts if candidate.content else None) or []:
            text = self.reading.add(part)
            if text:
                updates.append(Update.of_text(text, raw=chunk))
        reason = _word(candidate.finish_reason)
        if reason is None:
            return updates
        message = self.reading.message()
        partial = AgentResponse((message,), self.usage, chunk)
        check_finish(reason, candidate.finish_message, self.where, partial)
        self.done = True
        self.message = message
        updates += [Update.of_tool_call(call, raw=chunk) for call in message.tool_calls]
        if message.reasoning is not None:
            updates.append(Update.of_reasoning(message.reasoning, raw=chunk))
        if self.usage is not None:
            updates.append(Update.of_usage(self.usage, raw=chunk))
        return updates

    def finish(self) -> None:
        """Nothing when the turn came whole; else the stream was cut short."""
        if not self.done:
            raise ChatConnectionError(
                f"{self.where}: the stream ended before a chunk with its finishReason"
            )
