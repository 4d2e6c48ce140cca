"""A scripted HTTP server on 127.0.0.1 that speaks the OpenAI chat completions protocol
(and its embeddings: ``POST /v1/embeddings``, see :func:`embeddings`).

Tests queue replies with :meth:`OpenAIServer.reply` (or the helpers) and read
what the real SDK sent from :attr:`OpenAIServer.requests`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from raf import ChatMessage
from tests._harness.loopback_server import Exchange, LoopbackServer, Received, error_body, sse
from tests._harness.wire_rules import openai_problem

__all__ = [
    "HISTORY_EDITS",
    "OpenAIServer",
    "Received",
    "Reply",
    "chunk",
    "completion",
    "embeddings",
    "edit_history",
    "error_body",
    "text_stream",
]


@attrs.frozen
class Reply:
    """One scripted answer: a status and JSON body, or a dropped connection, maybe late.

    ``raw`` is sent as the body byte for byte instead of ``body`` as JSON (with
    ``content_type``); ``trickle`` sends the body one byte per that many seconds.
    ``events`` makes it a server-sent event stream instead (chunked): each item
    a chunk as JSON (a mapping), a ``data:`` line's text (a str) or raw bytes,
    ``pause`` seconds apart, then ``data: [DONE]`` unless ``done`` is false;
    ``cut`` then drops the connection before the body's end.
    """

    status: int = 200
    body: Any = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    delay: float = 0.0
    drop: bool = False
    raw: bytes | None = None
    content_type: str = "application/json"
    trickle: float = 0.0
    events: tuple[Any, ...] | None = None
    pause: float = 0.0
    done: bool = True
    cut: bool = False


#: What can change in a conversation between two calls of a client (see :func:`edit_history`).
HISTORY_EDITS = ("extend", "new objects", "new system", "drop system", "truncate")


def edit_history(
    step: str, n: int, messages: list[ChatMessage], pool: Sequence[ChatMessage]
) -> list[ChatMessage]:
    """``messages`` after step ``n`` of a random conversation, one of :data:`HISTORY_EDITS`
    (another step leaves them as they are): more of ``pool``, a history decoded anew
    (equal messages, new objects), another leading system message, none, or its first half.
    """
    if step == "extend":
        return [*messages, *pool[: n % len(pool) + 1]]
    if step == "new objects":
        return [ChatMessage.from_dict(m.to_dict()) for m in messages]
    if step == "new system":
        return [ChatMessage.system(f"rules {n}"), *messages[1:]]
    if step == "drop system" and messages and messages[0].role == "system":
        return messages[1:]
    if step == "truncate":
        return messages[: len(messages) // 2]
    return messages


def completion(
    content: str | None = "ok",
    *,
    tool_calls: Iterable[tuple[str, str, str]] = (),
    usage: tuple[int, int] | None = (5, 2),
    model: str = "test-model",
    refusal: str | None = None,
    cached: int | None = None,
) -> dict[str, Any]:
    """A chat.completion body; ``tool_calls`` are ``(id, name, arguments)`` triples;
    ``cached`` the prompt tokens the cache served, reported as OpenAI does."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    calls = [
        {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}
        for id_, name, arguments in tool_calls
    ]
    if calls:
        message["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if calls else "stop",
                "logprobs": None,
            }
        ],
    }
    if usage is not None:
        body["usage"] = _usage(usage, cached)
    return body


def embeddings(
    *vectors: Sequence[float], model: str = "test-embedding", order: Sequence[int] | None = None
) -> dict[str, Any]:
    """A ``create embeddings`` body: one ``embedding`` object per vector, ``index`` its
    place among the inputs (listed in ``order`` when given: a server may list them so)."""
    places = list(range(len(vectors))) if order is None else list(order)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": n, "embedding": list(vectors[n])} for n in places
        ],
        "model": model,
        "usage": {"prompt_tokens": 3 * len(vectors), "total_tokens": 3 * len(vectors)},
    }


def chunk(
    content: str | None = None,
    *,
    tool_calls: Iterable[Mapping[str, Any]] = (),
    finish_reason: str | None = None,
    usage: tuple[int, int] | None = None,
    role: str | None = None,
    choices: bool = True,
    cached: int | None = None,
) -> dict[str, Any]:
    """A chat.completion.chunk; ``tool_calls`` are raw tool-call deltas (with ``index``).

    ``choices=False`` makes the last chunk of a stream that includes usage
    (no choices, only the usage).
    """
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    calls = [dict(call) for call in tool_calls]
    if calls:
        delta["tool_calls"] = calls
    body: dict[str, Any] = {
        "id": "chatcmpl-test",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "test-model",
        "choices": (
            [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
            if choices
            else []
        ),
        "usage": None,
    }
    if usage is not None:
        body["usage"] = _usage(usage, cached)
    return body


def text_stream(
    *pieces: str, usage: tuple[int, int] | None = (5, 2), finish_reason: str = "stop"
) -> tuple[dict[str, Any], ...]:
    """The chunks of a streamed text answer, as OpenAI sends them: a first chunk with
    the role and empty content, a chunk per piece, the finish, then the usage."""
    chunks = [chunk("", role="assistant")]
    chunks += [chunk(piece) for piece in pieces]
    chunks.append(chunk(finish_reason=finish_reason))
    if usage is not None:
        chunks.append(chunk(usage=usage, choices=False))
    return tuple(chunks)


def _usage(usage: tuple[int, int], cached: int | None = None) -> dict[str, Any]:
    """The usage of a body or chunk, from ``(prompt, completion)`` token counts; with
    ``cached``, the details OpenAI adds (``prompt_tokens_details.cached_tokens``)."""
    body: dict[str, Any] = {
        "prompt_tokens": usage[0],
        "completion_tokens": usage[1],
        "total_tokens": sum(usage),
    }
    if cached is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        body["completion_tokens_details"] = {"reasoning_tokens": 0, "audio_tokens": 0}
    return body


class OpenAIServer(LoopbackServer[Reply]):
    """A loopback server that plays scripted chat completions replies (see
    :class:`tests._harness.loopback_server.LoopbackServer`: with no reply queued it answers
    500; :meth:`fail` replies let the SDK retry after a millisecond)."""

    def __init__(self) -> None:
        super().__init__(Reply)

    def answer(self, body: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Queue one 200 reply: ``body``, or ``completion(**kwargs)``."""
        self.reply(Reply(200, dict(body) if body is not None else completion(**kwargs)))

    def embed(self, *vectors: Sequence[float], **kwargs: Any) -> None:
        """Queue one 200 reply to ``POST /v1/embeddings``: ``embeddings(*vectors)``."""
        self.reply(Reply(200, embeddings(*vectors, **kwargs)))

    def refusal(self, request: Received) -> bytes | None:
        """The 400's body when the conversation breaks the vendor's rules (see
        :func:`tests._harness.wire_rules.openai_problem`)."""
        found = openai_problem(request.body)
        if found is None:
            return None
        message, param = found
        refusal = error_body(message)
        refusal["error"]["param"] = param
        return json.dumps(refusal).encode()

    def respond(self, exchange: Exchange, request: Received, reply: Reply) -> None:
        """A JSON body (or ``raw`` bytes), or the ``events`` as ``data:`` lines."""
        if reply.events is not None:
            frames = [_frame(event) for event in reply.events]
            if reply.done:
                frames.append(sse("[DONE]"))
            exchange.stream(
                frames,
                "text/event-stream; charset=utf-8",
                reply.headers,
                status=reply.status,
                pause=reply.pause,
                end="cut" if reply.cut else "done",
            )
            return
        data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
        exchange.send(reply.status, data, reply.content_type, reply.headers, trickle=reply.trickle)


def _frame(event: Any) -> bytes:
    """An item of ``Reply.events`` as it goes on the wire."""
    if isinstance(event, bytes):
        return event
    return sse(event if isinstance(event, str) else json.dumps(event))
