"""The HTTP edge of a served agent: bodies read within a limit, errors in the OpenAI shape.

An error body says what went wrong in a short message of its own and the
request id, never the text of the exception behind it (a file path, a key
in a message, the model's internal URL): the cause goes to the server's log,
in one line with the same request id (see :mod:`raf.serve._edge`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.types import Scope

from raf.errors import (
    ApprovalError,
    BudgetExceeded,
    ChatClientError,
    ChatTimeoutError,
    GuardrailError,
    OutputValidationError,
    RateLimitError,
    ToolConflictError,
)

__all__: list[str] = []

#: Who a ToolConflictError says offered a run's own tools (raf._agent.agent's words).
RUN_TOOLS = "the run's options"


@attrs.frozen
class HttpError(Exception):
    """A request the server answers with ``status`` and an OpenAI error body."""

    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    request_id: str = ""  # set where the request is known: a stream's error event carries it

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


def error_body(
    message: str, type: str, code: str | None = None, request_id: str = ""
) -> dict[str, Any]:
    """``{"error": {"message", "type", "code", "request_id"}}``: what OpenAI's clients read."""
    error = {"message": message, "type": type, "param": None, "code": code}
    return {"error": {**error, "request_id": request_id}}


def error_response(error: HttpError, scope: Scope) -> JSONResponse:
    """``error`` as a response in the OpenAI error shape, with the request's id."""
    scope.setdefault("state", {}).setdefault("failure", error.message)  # for the edge's log line
    body = error_body(error.message, error.type, error.code, error.request_id or request_id(scope))
    return JSONResponse(body, error.status, headers=dict(error.headers))


def request_id(scope: Scope) -> str:
    """The id the edge gave this request (``""`` outside the app's edge)."""
    return str(scope.get("state", {}).get("request_id", ""))


def note_failure(scope: Scope, cause: BaseException | str) -> None:
    """Say why this request failed, for the edge's one log line (the client never sees it)."""
    scope.setdefault("state", {})["failure"] = cause


def bounded_list(items: Sequence[str], first: int = 3) -> str:
    """``items`` quoted, at most ``first`` of them, and how many more: an error reply that
    names a client's items stays short however many it sent.

    >>> bounded_list(["a", "b", "c", "d", "e"])
    "5: 'a', 'b', 'c' and 2 more"
    """
    quoted = ", ".join(f"{item!r:.80}" for item in items[:first])
    more = f" and {len(items) - first} more" if len(items) > first else ""
    return f"{len(items)}: {quoted}{more}"


async def read_json(request: Request, max_body: int) -> Any:
    """The request body as JSON, read within ``max_body`` bytes.

    Raises :class:`HttpError`: 415 when the request does not say it is JSON
    (a browser sends ``text/plain`` to another site without asking first),
    413 when the body is over the limit (told by
    its Content-Length, or found while reading a chunked body), 400 when it
    is not UTF-8, not JSON, nested too deeply or holds a huge number (or
    ``NaN`` and ``Infinity``, which are not JSON).
    (Starlette's ``request.json()`` reads any length, and guesses UTF-16 or
    UTF-32 from the first bytes.)
    """
    media = (request.headers.get("content-type") or "").partition(";")[0].strip().lower()
    is_json = media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )
    if not is_json:
        raise HttpError(
            415,
            "the body must be JSON, sent as Content-Type: application/json",
            code="unsupported_media_type",
        )
    body = await read_body(request, max_body)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(400, f"the body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        return json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise HttpError(400, f"the body is not valid JSON: {exc}") from None
    except ValueError as exc:  # a number of more than 4300 digits
        raise HttpError(400, f"the body is not usable JSON: {exc!s:.120}") from None
    except RecursionError:
        raise HttpError(400, "the body is not usable JSON: nested too deeply") from None


async def read_body(request: Request, max_body: int) -> bytes:
    """The request body, read within ``max_body`` bytes (a 413 past it, by Content-Length
    or while reading a chunked body)."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise HttpError(400, f"Content-Length is not a number: {length[:40]!r}")
        if int(length) > max_body:
            raise HttpError(413, _too_big(max_body), code="request_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body:
                raise HttpError(413, _too_big(max_body), code="request_too_large")
    except ClientDisconnect:
        raise HttpError(400, "the client went away before the body's end") from None
    return bytes(body)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _too_big(max_body: int) -> str:
    return f"the body is over the limit of {max_body} bytes"


def header(scope: Scope, name: bytes) -> str | None:
    """The value of request header ``name`` (lower case), or ``None`` (for the key check,
    which reads the ASGI scope)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def upstream_error(exc: BaseException) -> HttpError | None:
    """How a failure of the model shows to the client, or ``None`` when it is not the model's.

    A timeout is 504, a rate limit 429 with the upstream's ``Retry-After``,
    any other model error 502. Found on the error or in its causes (a
    provider that wrapped it).
    """
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ChatTimeoutError):
            return HttpError(504, "the model timed out", "timeout", "upstream_timeout")
        if isinstance(error, RateLimitError):
            headers = {}
            if error.retry_after is not None:
                headers["Retry-After"] = str(max(0, math.ceil(error.retry_after)))
            return HttpError(
                429,
                "the model is rate limited",
                "rate_limit_error",
                "rate_limit_exceeded",
                headers,
            )
        if isinstance(error, ChatClientError):
            return HttpError(502, "the model failed", "upstream_error", "bad_gateway")
        error = error.__cause__
    return None


def failure(exc: Exception) -> HttpError:
    """What a run that raised ``exc`` answers: the model's failure (an answer that does
    not fit the output schema, retries included, is a 502 ``output_invalid``), a
    guardrail's block (400 ``guardrail_blocked``, naming the guardrail), or a 500
    without internals.

    Only the kind of failure shows; what the exception says goes to the log.
    """
    upstream = upstream_error(exc)
    if upstream is not None:
        return upstream
    if isinstance(exc, BudgetExceeded):  # the model was not called: try again when it resets
        return HttpError(
            429,
            f"the spending budget of ${exc.budget.usd} per {exc.budget.per} is spent",
            "rate_limit_error",
            "budget_exceeded",
            {"Retry-After": str(max(1, math.ceil(exc.retry_after)))},
        )
    if isinstance(exc, GuardrailError):
        # The guardrail's name, not its reason: the check's own words may tell how it judges.
        what = "the request" if exc.where == "input" else "the answer"
        return HttpError(
            400, f"guardrail {exc.guardrail!r} blocked {what}", code="guardrail_blocked"
        )
    if isinstance(exc, OutputValidationError):  # the model's, not the server's
        return HttpError(
            502,
            f"the model's answer does not fit the output schema ({exc.attempts} attempts)",
            "upstream_error",
            "output_invalid",
        )
    if isinstance(exc, ToolConflictError) and exc.second == RUN_TOOLS:
        # The run's own tools are the client's (a served run has no others): its mistake.
        return HttpError(
            400,
            f"the client's tool {exc.name!r:.80} is named like a tool the agent offers "
            "(its own or a provider's): rename it",
            code="tool_name_taken",
        )
    if isinstance(exc, ApprovalError) and exc.tokens:  # decisions that match no waiting call
        return HttpError(
            409,
            f"the decisions do not match the calls that wait (tokens {bounded_list(exc.tokens)}: "
            "unknown, already decided, another session's, or repeated): none was applied",
            code="approval_mismatch",
        )
    return HttpError(500, "the agent failed", "server_error")
