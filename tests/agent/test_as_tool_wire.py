"""A forked agent tool on the wire: through the real OpenAI client against a loopback server,
the child's first request begins with the parent's last request byte for byte (tools, then
the messages), under the parent's prompt_cache_key, and the ledger shows the prefix the
child shared and the cached tokens the server reported."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from raf import Agent, HistoryProvider, OpenAIChatClient, tool
from raf.observe import ContextLedger
from tests._harness.openai_server import OpenAIServer, completion

pytestmark = pytest.mark.anyio


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = OpenAIServer()
    yield server
    server.close()


def segment(raw: bytes, key: str) -> str:
    """The JSON text of ``key``'s value in a request body, exactly as it was sent."""
    text = raw.decode()
    start = text.index(f'"{key}":') + len(key) + 3
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end]


async def test_a_forked_childs_first_request_starts_with_the_parents_last_byte_for_byte(
    server: OpenAIServer,
) -> None:
    clerk_call = ("c1", "clerk", json.dumps({"task": "Is a refund due on order 7?"}))
    server.answer(completion(None, tool_calls=[("l1", "lookup", '{"order": "7"}')], usage=(90, 5)))
    server.answer(completion(None, tool_calls=[clerk_call], usage=(120, 8), cached=0))
    server.answer(completion("Yes: it shipped late.", usage=(150, 6), cached=128))
    server.answer(completion("A refund is due.", usage=(170, 5), cached=128))
    ledger = ContextLedger()
    async with OpenAIChatClient(
        "gpt-4o-mini", base_url=server.base_url, api_key="sk-test", max_retries=0
    ) as model:
        clerk = Agent(model, name="clerk", instructions="Answer one question, briefly.")
        lead = Agent(
            model,
            name="lead",
            instructions="You handle refunds. " * 20,
            tools=[lookup, clerk.as_tool(context="forked")],
            stack=[HistoryProvider()],
            observers=[ledger],
        )
        response = await lead.run("My order 7 arrived late. " * 10)
    assert response.text == "A refund is due."
    _, parent, child, after = server.requests
    # The tools, the same bytes; the messages: the parent's array is the start of the child's.
    assert segment(child.raw, "tools") == segment(parent.raw, "tools")
    parents, childs = segment(parent.raw, "messages"), segment(child.raw, "messages")
    assert childs.startswith(parents[:-1] + ",")
    extra = json.loads("[" + childs[len(parents) :])
    assert extra == [
        {"role": "system", "content": "Answer one question, briefly."},
        {"role": "user", "content": "Is a refund due on order 7?"},
    ]
    # One prompt_cache_key: the provider routes the child to the cache its parent filled.
    assert child.body["prompt_cache_key"] == parent.body["prompt_cache_key"]
    assert after.body["prompt_cache_key"] == parent.body["prompt_cache_key"]
    # The ledger: the child's call shares the parent's whole last prompt, and the server
    # said it served it from its cache.
    calls = ledger.calls
    assert [entry.agent_tool for entry in calls] == [None, None, "clerk", None]
    parent_entry, child_entry = calls[1], calls[2]
    assert child_entry.shared_prefix_tokens == parent_entry.input_tokens
    assert child_entry.broken_by is None
    assert child_entry.reported_cached_tokens == 128
    assert sum(p.tokens for p in child_entry.parts if p.layer == "parent") == (
        parent_entry.input_tokens
    )
    assert calls[3].broken_by is None  # the parent goes on from its own last prompt
