"""``POST /v1/sessions/{id}/fork``: a copy of a caller's session, under the caller's key."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from raf._sessions.fork import first_turns
from raf.errors import SessionExistsError
from raf.serve._http import HttpError, note_failure, read_json
from raf.serve._served import Served
from raf.serve._sessions import session_key

__all__: list[str] = []


async def fork(served: Served, request: Request) -> ASGIApp:
    """``POST /v1/sessions/{id}/fork``: copy the caller's session ``id`` into a new one.

    The body is optional: ``{"new_id": "...", "at": N}`` (the new session's id,
    a fresh one when left out; how many turns to copy, all when left out). The
    answer is ``201 {"id": new_id}``. A session that another key owns, or that
    holds nothing, is a 404, as an unknown one: a caller learns nothing of
    another key's sessions. A ``new_id`` that holds messages is a 409, and it
    is never overwritten.
    """
    session_id = str(request.path_params["session_id"])
    new_id, at = await _arguments(request, served.max_body)
    scope = request.state.key_scope
    source_key, new_key = session_key(scope, session_id), session_key(scope, new_id)
    store = served.store
    if store is not None and not callable(getattr(store, "fork", None)):
        raise HttpError(
            501, f"the session store {type(store).__name__} cannot fork", code="not_implemented"
        )
    source = await served.session(request, session_id, keep=False)
    try:
        messages = await source.get_messages()
        if not messages:
            raise HttpError(404, f"no session {session_id!r:.80}", "not_found", "session_not_found")
        first_turns(messages, session_id, at)  # a bad `at` told with the caller's own id
        await store.fork(source_key, new_key, at=at)
    except ValueError as exc:
        raise HttpError(400, str(exc), code="bad_fork") from None
    except SessionExistsError:
        raise HttpError(
            409,
            f"session {new_id!r:.80} already holds messages: a fork never overwrites one",
            code="session_exists",
        ) from None
    except HttpError:
        raise
    except Exception as exc:
        note_failure(request.scope, exc)
        raise HttpError(503, "the session store failed", "server_error") from None
    return JSONResponse({"id": new_id}, 201)


async def _arguments(request: Request, max_body: int) -> tuple[str, int | None]:
    """The new id (a fresh one when the body names none) and ``at`` of a fork request."""
    data: Any = {}
    if request.headers.get("content-length", "0") != "0" or "chunked" in (
        request.headers.get("transfer-encoding") or ""
    ):
        data = await read_json(request, max_body)
    if not isinstance(data, dict):
        raise HttpError(400, 'the body must be a JSON object: {"new_id": ..., "at": ...}')
    unknown = sorted(set(data) - {"new_id", "at"})
    if unknown:
        raise HttpError(400, f"unknown field(s) {', '.join(map(repr, unknown)):.200}")
    new_id = data.get("new_id")
    if new_id is None:
        new_id = uuid.uuid4().hex
    if not isinstance(new_id, str):
        raise HttpError(400, f"new_id must be a string, got {new_id!r:.80}")
    at = data.get("at")
    if at is not None and type(at) is not int:
        raise HttpError(400, f"at must be a number of turns, got {at!r:.80}")
    return new_id, at
