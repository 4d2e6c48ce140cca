"""A served agent with spending budgets: a key whose budget is spent gets a 429 with
Retry-After, and the model is not called; another key's budget is its own."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

import raf.serve
from raf import (
    Agent,
    AgentResponse,
    Budget,
    ChatMessage,
    ChatOptions,
    Prices,
    ScriptedChatClient,
    SpendLimits,
    Usage,
)
from tests.serve.test_asgi import Exchange

pytestmark = pytest.mark.anyio
PRICES = Prices(overrides={"house": {"input": 1000, "output": 1000}})  # $0.001 a token


def answer(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
    return AgentResponse((ChatMessage.assistant("ok"),), Usage(10, 0))  # $0.01


def body(stream: bool) -> dict[str, Any]:
    return {
        "model": "budgeted",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_a_keys_spent_budget_is_a_429_and_the_model_is_not_called(stream: bool) -> None:
    client = ScriptedChatClient([answer] * 4)
    client.model = "house"  # type: ignore[attr-defined]
    client.count_tokens = lambda messages, tools=(): 10  # type: ignore[attr-defined]
    limits = SpendLimits(Budget("0.01", "day", "key"), prices=PRICES)
    agent = Agent(client, name="budgeted", chat_stack=[limits])
    app = raf.serve.app(agent, api_keys=["key-one", "key-two"])
    one = [(b"authorization", b"Bearer key-one")]
    two = [(b"authorization", b"Bearer key-two")]
    path = "/v1/chat/completions"
    assert (await Exchange()(app, path, body(stream), headers=one)).status == 200
    refused = await Exchange()(app, path, body(stream), headers=one)
    assert refused.status == 429
    headers = dict(refused.messages[0]["headers"])
    assert 1 <= int(headers[b"retry-after"]) <= 86400
    error = json.loads(refused.body)["error"]
    assert error["code"] == "budget_exceeded"
    assert "spending budget of $0.01 per day is spent" in error["message"]
    assert len(client.requests) == 1  # the refused call never reached the model
    assert (await Exchange()(app, path, body(stream), headers=two)).status == 200
    assert len(client.requests) == 2


class Stalls:
    """A model whose first call streams the start of an answer, then nothing more: in flight
    until its caller leaves."""

    model = "house"

    def __init__(self) -> None:
        self.calls = 0

    def count_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Any] = ()) -> int:
        return 10

    async def complete(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        raise AssertionError("streamed only")

    async def stream(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        self.calls += 1
        response = AgentResponse((ChatMessage.assistant("the start of a long answer"),))
        for update in response.to_updates():
            yield update
        if self.calls == 1:  # the first call only: a later one answers (a test never hangs)
            await anyio.sleep_forever()


async def test_a_client_that_hangs_up_mid_answer_still_spends_its_calls_hold() -> None:
    # Given back, a key that hangs up every call would spend past its budget for ever.
    model = Stalls()
    limits = SpendLimits(Budget("0.01", "day", "key"), prices=PRICES)
    app = raf.serve.app(Agent(model, name="budgeted", chat_stack=[limits]), api_keys=["k"])
    key = [(b"authorization", b"Bearer k")]
    left = await Exchange(leave_after=1)(app, "/v1/chat/completions", body(True), headers=key)
    assert left.status == 200
    assert model.calls == 1
    refused = await Exchange()(app, "/v1/chat/completions", body(True), headers=key)
    assert refused.status == 429
    assert model.calls == 1


async def test_a_managed_agents_spend_store_is_opened_and_closed_by_the_lifespan(
    redis_server: Any,
) -> None:
    # A Redis store must be opened before the first call, in the task that closes it:
    # with manage_agent (raf serve), the lifespan does, as it opens the providers.
    client = ScriptedChatClient([answer] * 2)
    client.model = "house"  # type: ignore[attr-defined]
    client.count_tokens = lambda messages, tools=(): 10  # type: ignore[attr-defined]
    budget = Budget("0.01", "day", "key", name=f"served-{uuid.uuid4().hex}")  # its own counts
    limits = SpendLimits(budget, store=redis_server.url, prices=PRICES)
    agent = Agent(client, name="budgeted", chat_stack=[limits])
    app = raf.serve.app(agent, manage_agent=True)
    async with app.router.lifespan_context(app):
        exchange = await Exchange()(app, "/v1/chat/completions", body(False))
        assert exchange.status == 200, exchange.body
        refused = await Exchange()(app, "/v1/chat/completions", body(False))
        assert refused.status == 429
    assert len(client.requests) == 1
