"""FallbackMiddleware across vendors: a tool loop that falls back from OpenAI to Gemini and
back, over real HTTP (a loopback OpenAI server and a loopback Gemini server, each speaking its
vendor's wire). Here, not in test_fallback.py, as it needs the gemini extra."""

from __future__ import annotations

import pytest

from raf import (
    Agent,
    FallbackMiddleware,
    GeminiChatClient,
    OpenAIChatClient,
    RetryMiddleware,
    tool,
)
from tests._harness.gemini_server import GeminiServer, signature
from tests._harness.openai_server import OpenAIServer, completion

pytestmark = pytest.mark.anyio


# --- across vendors: OpenAI and Gemini (google-genai runs on asyncio only) -------------


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("primary", ["openai", "gemini"])
async def test_a_tool_loop_falls_back_across_vendors_and_back(
    primary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The primary fails twice (retried, then the fallback answers with a call); the next
    call of the loop is the primary's again, over the other vendor's turn."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    openai_server, gemini_server = OpenAIServer(), GeminiServer()
    gpt = OpenAIChatClient("gpt", base_url=openai_server.base_url, api_key="sk", max_retries=0)
    gemini = GeminiChatClient("gemini", base_url=gemini_server.root_url, api_key="g", max_retries=0)
    first, second = (gpt, gemini) if primary == "openai" else (gemini, gpt)
    agent = Agent(
        first,
        tools=[add],
        chat_stack=[FallbackMiddleware(second), RetryMiddleware(attempts=2, wait_initial=0)],
    )
    if primary == "openai":
        openai_server.fail(500)
        openai_server.fail(500)
        gemini_server.answer(
            text=None,
            calls=[(None, "add", {"a": 1, "b": 2})],
            signatures={"add": signature("add")},
        )
        openai_server.answer(completion("3"))
    else:
        gemini_server.fail(503)
        gemini_server.fail(503)
        openai_server.answer(completion(None, tool_calls=[("call_1", "add", '{"a":1,"b":2}')]))
        gemini_server.answer(text="3")
    try:
        answer = await agent.run("1+2?")
    finally:
        await agent.aclose()
        openai_server.close()
        gemini_server.close()
    assert answer.text == "3"
    call = answer.messages[0].tool_calls[0]
    if primary == "openai":
        assert call.id.startswith("raf-gemini-")
        assert answer.messages[0].reasoning is not None  # Gemini's, kept on the message
        last = openai_server.requests[-1].body["messages"]
        assert last[1]["tool_calls"][0]["id"] == call.id
        assert last[2] == {"role": "tool", "tool_call_id": call.id, "content": "3"}
    else:
        contents = gemini_server.requests[-1].body["contents"]
        assert contents[1]["parts"] == [
            {"functionCall": {"id": "call_1", "name": "add", "args": {"a": 1, "b": 2}}}
        ]
        assert contents[2]["parts"] == [
            {"functionResponse": {"id": "call_1", "name": "add", "response": {"output": "3"}}}
        ]
    assert len(openai_server.requests) + len(gemini_server.requests) == 4
