"""/mcp served by real uvicorn, driven by the mcp SDK's streamable-HTTP client (one server for
the module).

On asyncio only: the SDK's HTTP client (httpx2's SSE reader) leaves an async generator
unclosed on trio, a ResourceWarning that this suite turns into an error. The route itself
runs on trio too: tests/serve/test_mcp.py drives it in-process on both backends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import httpx2
import pytest

from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

if TYPE_CHECKING:
    # The mcp SDK is imported where it is used: collecting this module stays cheap.
    from mcp import ClientSession

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

KEYS = ["key-a", "key-b"]
LONG = "".join(f"w{i} " for i in range(200))  # what the served model says to "long"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server() -> Iterator[ServedAgent]:
    with ServedAgent(mcp=True, keys=KEYS, delay=0.01) as served:
        yield served


@asynccontextmanager
async def connected(server: ServedAgent, key: str = "key-a") -> AsyncIterator[ClientSession]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60, verify=TLS) as http,
        streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def test_the_agent_is_one_tool_named_after_it(
    server: ServedAgent,
) -> None:
    async with connected(server) as session:
        listed = await session.list_tools()
    (tool,) = listed.tools
    assert tool.name == "word-agent"
    assert tool.input_schema["required"] == ["message"]
    assert set(tool.input_schema["properties"]) == {"message", "session_id"}


async def test_a_call_answers_and_streams_progress(server: ServedAgent) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    async with connected(server) as session:
        result = await session.call_tool(
            "word-agent", {"message": "hello there"}, progress_callback=on_progress
        )
    assert not result.is_error
    assert result.content[0].text == "seen 1: hello there "  # type: ignore[union-attr]
    assert "".join(message or "" for _, message in progress) == "seen 1: hello there "
    counts = [done for done, _ in progress]
    assert counts == sorted(counts)
    assert len(counts) == 3


async def test_sessions_are_the_callers_key_s(server: ServedAgent) -> None:
    conversation = "s-keys"
    async with connected(server, "key-a") as session:
        await session.call_tool("word-agent", {"message": "first", "session_id": conversation})
        again = await session.call_tool(
            "word-agent", {"message": "second", "session_id": conversation}
        )
    async with connected(server, "key-b") as session:
        other = await session.call_tool(
            "word-agent", {"message": "hello", "session_id": conversation}
        )
    assert again.content[0].text == "seen 3: second "  # type: ignore[union-attr]
    assert again.structured_content == {"answer": "seen 3: second ", "session_id": conversation}
    assert other.content[0].text == "seen 1: hello "  # type: ignore[union-attr]


async def test_without_a_valid_key_it_is_a_401(server: ServedAgent) -> None:
    hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx.AsyncClient(verify=TLS) as http:
        for headers in ({}, {"Authorization": "Bearer nope"}):
            reply = await http.post(f"{server.url}/mcp", json=hello, headers=headers)
            assert reply.status_code == 401
            assert reply.json()["error"]["code"] == "invalid_api_key"


async def test_a_get_is_a_405_that_allows_post(server: ServedAgent) -> None:
    # Stateless, the server has nothing to push: a GET stream would stay open for ever.
    headers = {"Authorization": "Bearer key-a", "Accept": "text/event-stream"}
    async with httpx.AsyncClient(timeout=10, verify=TLS) as http:
        reply = await http.get(f"{server.url}/mcp", headers=headers)
    assert reply.status_code == 405
    assert reply.headers["allow"] == "POST"


async def test_bad_calls_are_mcp_errors(server: ServedAgent) -> None:
    from mcp.shared.exceptions import MCPError

    async with connected(server) as session:
        with pytest.raises(MCPError, match="no tool 'other' here"):
            await session.call_tool("other", {"message": "hi"})
        with pytest.raises(MCPError, match="unknown arguments: 'text'"):
            await session.call_tool("word-agent", {"text": "hi"})
        with pytest.raises(MCPError, match="'message' must be a non-empty string"):
            await session.call_tool("word-agent", {"message": 3})
        with pytest.raises(MCPError, match="a session id must be"):
            await session.call_tool("word-agent", {"message": "hi", "session_id": "x" * 201})
        failed = await session.call_tool("word-agent", {"message": "fail:model"})
    assert failed.is_error
    assert failed.content[0].text == "the model failed (bad_gateway)"  # type: ignore[union-attr]


async def test_a_client_that_leaves_closes_the_run_early(
    server: ServedAgent,
) -> None:
    conversation = "leave"
    heard = anyio.Event()

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        if done > 30:
            heard.set()

    async def call(session: ClientSession) -> None:
        await session.call_tool(
            "word-agent",
            {"message": "long", "session_id": conversation},
            progress_callback=on_progress,
        )

    with anyio.fail_after(30):
        async with connected(server) as session, anyio.create_task_group() as group:
            group.start_soon(call, session)
            await heard.wait()
            group.cancel_scope.cancel()  # the client and its connection go away
        stored = await _stored(server, conversation)
    # The history provider (persist_partial=True) kept the question and the partial answer:
    # its post stage ran with the early close, not a cancellation (which keeps nothing).
    assert [m["role"] for m in stored] == ["user", "assistant"]
    partial = stored[1]["content"]
    assert 30 < len(partial) < len(LONG)
    assert LONG.startswith(partial)


async def _stored(server: ServedAgent, conversation: str) -> list[dict[str, Any]]:
    """The session's messages once the run stored them (the server finishes on its own)."""
    headers = {"Authorization": "Bearer key-a"}
    url = f"{server.url}/v1/sessions/{conversation}/messages"
    async with httpx.AsyncClient(headers=headers, verify=TLS) as http:
        while True:
            messages: list[dict[str, Any]] = (await http.get(url)).json()["data"]
            if messages:
                return messages
            await anyio.sleep(0.05)
