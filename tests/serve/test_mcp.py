"""/mcp in-process on asyncio and trio: MCP's JSON-RPC over streamable HTTP, as written on
the wire, through the app and its lifespan (the SDK's session manager)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import raf.serve
from raf import Agent, EchoChatClient
from raf.errors import ConfigError
from tests._harness.serve_agent import make_agent
from tests.serve.test_asgi import Exchange

pytestmark = pytest.mark.anyio

ACCEPT = (b"accept", b"application/json, text/event-stream")


@asynccontextmanager
async def running(**options: Any) -> AsyncIterator[Any]:
    """The app with ``/mcp``, its lifespan entered (the session manager runs there)."""
    app = raf.serve.app(make_agent(0.001), mcp=True, **options)
    async with app.router.lifespan_context(app):
        yield app


def call(message: str, session_id: str | None = None, name: str = "word-agent") -> dict[str, Any]:
    arguments = {"message": message} | ({"session_id": session_id} if session_id else {})
    params = {"name": name, "arguments": arguments, "_meta": {"progressToken": "p"}}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


async def post(app: Any, body: Any, *, leave_after: int | None = None) -> list[dict[str, Any]]:
    """POST /mcp; the JSON-RPC messages of its SSE answer. ``leave_after``: the client goes
    away after that many of them."""
    pending = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    gone = anyio.Event()
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message.get("body"):
            sent.append(message["body"])
        if leave_after is not None and len(sent) >= leave_after:
            gone.set()

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
        "headers": [(b"content-type", b"application/json"), ACCEPT],
    }  # fmt: skip
    await app(scope, receive, send)
    gone.set()
    text = b"".join(sent).decode()
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


async def test_a_call_streams_progress_then_answers(anyio_backend: str) -> None:
    async with running() as app:
        *progress, answer = await post(app, call("hello there"))
    assert [p["method"] for p in progress] == ["notifications/progress"] * 3
    assert "".join(p["params"]["message"] for p in progress) == "seen 1: hello there "
    result = answer["result"]
    assert result["content"] == [{"type": "text", "text": "seen 1: hello there "}]
    assert not result.get("isError")


async def test_the_text_of_two_model_calls_is_kept_apart(anyio_backend: str) -> None:
    async with running() as app:
        *progress, answer = await post(app, call("check the tool"))
    streamed = "".join(p["params"]["message"] for p in progress)
    assert streamed == "Let me check.\n\nthe tool said HI"
    assert answer["result"]["content"][0]["text"] == streamed


async def test_a_call_that_waits_for_approval_names_the_calls(anyio_backend: str) -> None:
    async with running() as app:
        *_, answer = await post(app, call("please delete it", "s1"))
    structured = answer["result"]["structuredContent"]
    (pending,) = structured["pending"]
    assert (pending["name"], json.loads(pending["arguments"])) == ("delete", {"path": "notes.txt"})
    assert "waiting for a person's approval: delete" in answer["result"]["content"][0]["text"]


async def test_a_client_that_leaves_is_an_early_close(anyio_backend: str) -> None:
    async with running() as app:
        await post(app, call("long", "gone"), leave_after=5)
        for _ in range(1000):  # the run ends on its own, in the session manager's task group
            if stored := await _stored(app, "gone"):
                break
            await anyio.sleep(0.01)
    # persist_partial=True stored the partial answer: the history provider's post stage
    # saw the early close (a cancellation stores nothing).
    assert [m["role"] for m in stored] == ["user", "assistant"]
    whole = "".join(f"w{i} " for i in range(200))
    assert 0 < len(stored[1]["content"]) < len(whole)
    assert whole.startswith(stored[1]["content"])


async def test_the_key_is_checked_before_the_sdk(anyio_backend: str) -> None:
    async with running(api_keys=["k"]) as app:
        reply = await Exchange()(app, "/mcp", call("hi"), headers=[ACCEPT])
    assert reply.status == 401
    assert json.loads(reply.body)["error"]["code"] == "invalid_api_key"


async def test_the_server_shows_only_the_first_paragraph_of_the_instructions(
    anyio_backend: str,
) -> None:
    rules = "You help with notes.\n\nNever tell anyone the admin password, hunter2."
    app = raf.serve.app(Agent(EchoChatClient(), name="echo", instructions=rules), mcp=True)
    hello = {"protocolVersion": "2025-06-18", "capabilities": {},
             "clientInfo": {"name": "t", "version": "1"}}  # fmt: skip
    async with app.router.lifespan_context(app):
        (init,) = await post(app, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                   "params": hello})  # fmt: skip
        (listed,) = await post(app, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    # The instructions are the agent's own (a system prompt): a caller sees what the
    # tool's description and the A2A card show of them, their first paragraph.
    assert init["result"]["instructions"] == "You help with notes."
    assert listed["result"]["tools"][0]["description"] == "You help with notes."


async def _stored(app: Any, session_id: str) -> list[dict[str, Any]]:
    reply = await Exchange()(app, f"/v1/sessions/{session_id}/messages", method="GET")
    messages: list[dict[str, Any]] = json.loads(reply.body)["data"]
    return messages


def test_without_the_extra_the_error_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "mcp_types", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"raf-agents\[mcp\]"):
        raf.serve.app(Agent(EchoChatClient(), name="echo"), mcp=True)
