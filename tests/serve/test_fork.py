"""``POST /v1/sessions/{id}/fork``: a copy of the caller's own session, in this process's store
and in a SQLite file; another key's session is as unknown as a session that never was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

import raf.serve
from raf import InMemorySession
from tests._harness.serve_agent import make_agent

pytestmark = pytest.mark.anyio
MODEL = "word-agent"
ANN = {"authorization": "Bearer ann"}
BOB = {"authorization": "Bearer bob"}


@pytest.fixture(params=["memory", "sqlite"])
async def http(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app with two keys, its sessions in memory or in a SQLite file."""
    store = None if request.param == "memory" else str(tmp_path / "sessions.db")
    app = raf.serve.app(make_agent(), store=store, api_keys=["ann", "bob"])
    transport = httpx.ASGITransport(app=app)
    # The app's lifespan opens a store given by path: run it as a server does.
    async with (
        transport,
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
        app.router.lifespan_context(app),
    ):
        yield client


async def _say(http: httpx.AsyncClient, session: str, text: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    reply = await http.post(
        "/v1/chat/completions", json=body, headers={**ANN, "x-session-id": session}
    )
    assert reply.status_code == 200, reply.text


async def _held(http: httpx.AsyncClient, session: str, key: dict[str, str]) -> list[Any]:
    reply = await http.get(f"/v1/sessions/{session}/messages", headers=key)
    assert reply.status_code == 200, reply.text
    return [(m["role"], m["content"]) for m in reply.json()["data"]]


async def test_a_fork_copies_the_callers_session_under_a_new_id(http: httpx.AsyncClient) -> None:
    await _say(http, "talk", "one")
    await _say(http, "talk", "two")
    whole = await http.post("/v1/sessions/talk/fork", headers=ANN)
    assert whole.status_code == 201, whole.text
    new_id = whole.json()["id"]
    assert new_id != "talk"
    assert await _held(http, new_id, ANN) == await _held(http, "talk", ANN)
    named = await http.post("/v1/sessions/talk/fork", json={"new_id": "half", "at": 1}, headers=ANN)
    assert named.json() == {"id": "half"}
    assert next(text for _, text in await _held(http, "half", ANN)) == "one"
    assert len(await _held(http, "half", ANN)) == 2
    # The fork goes on by itself: the original does not see its new turn.
    await _say(http, "half", "three")
    assert len(await _held(http, "talk", ANN)) == 4
    # Bob sees none of Ann's sessions, the fork included.
    assert await _held(http, new_id, BOB) == []


async def test_another_keys_or_an_unknown_session_is_a_404(http: httpx.AsyncClient) -> None:
    await _say(http, "ann-only", "hello")
    for key, session in ((BOB, "ann-only"), (ANN, "never-was")):
        reply = await http.post(f"/v1/sessions/{session}/fork", headers=key)
        assert reply.status_code == 404, reply.text
        assert reply.json()["error"]["code"] == "session_not_found"
    no_key = await http.post("/v1/sessions/ann-only/fork")
    assert no_key.status_code == 401


async def test_a_taken_id_a_bad_at_or_a_bad_body_is_refused(http: httpx.AsyncClient) -> None:
    await _say(http, "src", "hello")
    await _say(http, "taken", "mine")
    taken = await http.post("/v1/sessions/src/fork", json={"new_id": "taken"}, headers=ANN)
    assert taken.status_code == 409
    assert taken.json()["error"]["code"] == "session_exists"
    assert await _held(http, "taken", ANN) == [("user", "mine"), ("assistant", "seen 1: mine ")]
    too_far = await http.post("/v1/sessions/src/fork", json={"at": 5}, headers=ANN)
    assert too_far.status_code == 400
    assert "session 'src' has 1 turn; at must be 0 to 1" in too_far.json()["error"]["message"]
    for bad in ({"new_id": 3}, {"at": "1"}, {"other": 1}, ["new_id"]):
        reply = await http.post("/v1/sessions/src/fork", json=bad, headers=ANN)
        assert reply.status_code == 400, bad
    itself = await http.post("/v1/sessions/src/fork", json={"new_id": "src"}, headers=ANN)
    assert itself.status_code == 400


class _Plain:
    """A store of the user's own that cannot fork."""

    def __init__(self) -> None:
        self.sessions: dict[str, InMemorySession] = {}

    async def get(self, session_id: str) -> InMemorySession:
        return self.sessions.setdefault(session_id, InMemorySession(session_id))


async def test_a_store_that_cannot_fork_is_a_501(anyio_backend: str) -> None:
    app = raf.serve.app(make_agent(), store=_Plain())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        reply = await http.post("/v1/sessions/any/fork")
    assert reply.status_code == 501
    assert "_Plain cannot fork" in reply.json()["error"]["message"]
