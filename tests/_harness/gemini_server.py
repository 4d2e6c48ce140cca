"""A scripted HTTP server on 127.0.0.1 that speaks Gemini's REST API, JSON and SSE.

``POST /{version}/models/{model}:generateContent`` is answered with a
``GenerateContentResponse`` as JSON; ``:streamGenerateContent?alt=sse`` with the
chunks :func:`chunks_of` makes of it, one ``data:`` event each. Tests queue answers
with :meth:`GeminiServer.answer` (a response body, or ``response_body(**kwargs)``)
or :meth:`GeminiServer.reply`, and read what the real SDK sent from
:attr:`GeminiServer.requests`. Errors go in Google's own shape,
``{"error": {"code": ..., "message": ..., "status": ...}}``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pytest

    from raf import GeminiChatClient

from raf import AgentResponse, ChatMessage, ChatOptions
from tests._harness.loopback_server import Exchange, LoopbackServer, Received, sse
from tests._harness.responses_server import Answer, _ending
from tests._harness.wire_rules import gemini_problem

__all__ = ["Answer", "GeminiServer", "chunks_of", "error_body", "response_body", "signature"]

#: The status word Google sends with each HTTP status.
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def error_body(code: int, message: str, status: str | None = None) -> dict[str, Any]:
    """A Google API error body."""
    return {"error": {"code": code, "message": message, "status": status or STATUSES[code]}}


def signature(name: str) -> str:
    """A thought signature as the wire carries it (base64 of opaque bytes)."""
    return base64.b64encode(f"sig:{name}".encode()).decode()


def response_body(
    text: str | None = "ok",
    *,
    calls: Iterable[tuple[str | None, str, Mapping[str, Any]]] = (),
    thought: str | None = None,
    signatures: Mapping[str, str] | None = None,
    usage: tuple[int, int] | None = (5, 2),
    cached: int = 0,
    thoughts_tokens: int = 0,
    finish_reason: str | None = "STOP",
    block_reason: str | None = None,
    response_id: str = "resp-1",
) -> dict[str, Any]:
    """A ``GenerateContentResponse``: a ``thought`` part first (when given), the text,
    then ``calls`` ``(id or None, name, args)`` as ``functionCall`` parts. ``signatures``
    gives a part its ``thoughtSignature``: by ``"thought"``, ``"text"`` or a call's name
    (the first call of that name).
    ``block_reason`` makes it a blocked prompt: no candidate, ``promptFeedback`` only."""
    signed = dict(signatures or {})
    parts: list[dict[str, Any]] = []
    if thought is not None:
        parts.append({"text": thought, "thought": True})
        if "thought" in signed:
            parts[-1]["thoughtSignature"] = signed["thought"]
    if text is not None:
        parts.append({"text": text})
        if "text" in signed:
            parts[-1]["thoughtSignature"] = signed["text"]
    for call_id, name, args in calls:
        call: dict[str, Any] = {"name": name, "args": dict(args)}
        if call_id is not None:
            call["id"] = call_id
        parts.append({"functionCall": call})
        if name in signed:  # the first call of that name
            parts[-1]["thoughtSignature"] = signed.pop(name)
    body: dict[str, Any] = {"modelVersion": "test-model", "responseId": response_id}
    if block_reason is not None:
        body["promptFeedback"] = {"blockReason": block_reason}
    else:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish_reason is not None:
            candidate["finishReason"] = finish_reason
        body["candidates"] = [candidate]
    if usage is not None:
        metadata = {
            "promptTokenCount": usage[0],
            "candidatesTokenCount": usage[1],
            "totalTokenCount": usage[0] + usage[1] + thoughts_tokens,
        }
        if cached:
            metadata["cachedContentTokenCount"] = cached
        if thoughts_tokens:
            metadata["thoughtsTokenCount"] = thoughts_tokens
        body["usageMetadata"] = metadata
    return body


def chunks_of(body: Mapping[str, Any], *, terminal: bool = True) -> list[dict[str, Any]]:
    """The chunks a server streams for ``body``, as Gemini streams: text word by word
    (a thought in one piece, its signature on an empty part after it), each function
    call whole in its own chunk, the ``finishReason`` and the usage on the last
    chunk (left out when ``terminal`` is false). A blocked prompt is one chunk."""
    if "candidates" not in body:
        return [dict(body)]
    candidate = body["candidates"][0]
    chunks: list[dict[str, Any]] = []

    def chunk(parts: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
            "modelVersion": body.get("modelVersion"),
            "responseId": body.get("responseId"),
        }

    for part in candidate["content"]["parts"]:
        if "functionCall" in part or part.get("thought"):
            piece = {key: value for key, value in part.items() if key != "thoughtSignature"}
            chunks.append(chunk([piece]))
            if "thoughtSignature" in part:
                if "functionCall" in part:
                    chunks[-1]["candidates"][0]["content"]["parts"][0] = dict(part)
                else:
                    chunks.append(
                        chunk([{"text": "", "thoughtSignature": part["thoughtSignature"]}])
                    )
            continue
        words = part["text"].split(" ")
        for n, word in enumerate(words):
            chunks.append(chunk([{"text": word if n == len(words) - 1 else word + " "}]))
        if "thoughtSignature" in part:
            chunks[-1]["candidates"][0]["content"]["parts"][0]["thoughtSignature"] = part[
                "thoughtSignature"
            ]
    if not chunks:
        chunks.append(chunk([]))
    if terminal:
        last = chunks[-1]
        if candidate.get("finishReason") is not None:
            last["candidates"][0]["finishReason"] = candidate["finishReason"]
        if "usageMetadata" in body:
            last["usageMetadata"] = body["usageMetadata"]
    return chunks


class GeminiServer(LoopbackServer[Answer]):
    """A loopback server that plays scripted Gemini answers (see
    :class:`tests._harness.loopback_server.LoopbackServer`: with no answer queued it
    answers 500; :meth:`fail` replies carry ``Retry-After`` when asked)."""

    def __init__(self) -> None:
        super().__init__(Answer)

    @property
    def root_url(self) -> str:
        """The server's URL without a version: the SDK adds its API version to each path."""
        return self.base_url.removesuffix("/v1")

    def answer(self, body: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Queue one 200 answer: ``body``, or ``response_body(**kwargs)``."""
        self.reply(Answer(body=dict(body) if body is not None else response_body(**kwargs)))

    def fail(self, status: int, message: str = "scripted failure", **kwargs: Any) -> None:
        """Queue one error reply in Google's shape (``kind``: its status word)."""
        kind = kwargs.pop("kind", None)
        self.reply(Answer(status, error_body(status, message, kind), **kwargs))

    def refusal(self, request: Received) -> bytes | None:
        """The 400's body when the conversation breaks the vendor's rules (see
        :func:`tests._harness.wire_rules.gemini_problem`)."""
        found = gemini_problem(request.body)
        return None if found is None else json.dumps(error_body(400, found)).encode()

    def respond(self, exchange: Exchange, request: Received, answer: Answer) -> None:
        """A 400 when ``require`` refuses the request; the chunks of a 200 answer to
        ``:streamGenerateContent`` (or of one that has ``events``); else a JSON body."""
        problem = answer.require(request.body) if answer.require is not None else None
        if problem is not None:
            data = json.dumps(error_body(400, problem)).encode()
            exchange.send(400, data, "application/json")
            return
        streamed = ":streamGenerateContent" in request.path
        if answer.status == 200 and answer.raw is None and (answer.events is not None or streamed):
            chunks = answer.events if answer.events is not None else chunks_of(answer.body)
            count, end = _ending(answer, len(chunks))
            exchange.stream(
                [sse(json.dumps(chunk)) for chunk in chunks[:count]],
                answer.content_type or "text/event-stream",
                answer.headers,
                end=end,
            )
            return
        data = answer.raw if answer.raw is not None else json.dumps(answer.body).encode()
        exchange.send(
            answer.status, data, answer.content_type or "application/json", answer.headers
        )


# --- what the client tests share --------------------------------------------------------


def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[GeminiServer]:
    """A running server for one test, with no Gemini key or base URL from the environment."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    for variable in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    running = GeminiServer()
    yield running
    running.close()


def client_for(server: GeminiServer, **kwargs: Any) -> GeminiChatClient:
    """raf's Gemini client on ``server`` (no retries unless asked)."""
    from raf import GeminiChatClient  # loads google-genai: only where a test runs it

    kwargs.setdefault("max_retries", 0)
    return GeminiChatClient("test-model", base_url=server.root_url, api_key="g-key", **kwargs)


async def call(
    model: GeminiChatClient,
    streamed: bool,
    messages: list[ChatMessage] | None = None,
    options: ChatOptions | None = None,
) -> AgentResponse:
    """One call: streamed and assembled, or not."""
    messages = messages or [ChatMessage.user("x")]
    options = options or ChatOptions()
    if streamed:
        return AgentResponse.from_updates([u async for u in model.stream(messages, options)])
    return await model.complete(messages, options)
