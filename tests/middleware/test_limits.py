"""raf.UsageLimits: the call that would pass a limit of the run is never sent, the run ends with
UsageLimitExceeded, and every post stage runs."""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pytest

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    FallbackMiddleware,
    Prices,
    RetryMiddleware,
    ScriptedChatClient,
    ToolCall,
    Usage,
    UsageLimitExceeded,
    UsageLimits,
    tool,
)
from raf.errors import ConfigError, RateLimitError

pytestmark = pytest.mark.anyio

PRICES = Prices(
    overrides={
        "house": {"input": 1, "output": 10},
        "backup": {"input": 100, "output": 100},
    }
)


@tool
def look() -> str:
    """Look around."""
    return "nothing here"


def answer(usage: Usage, text: str | None = "ok", *, calls: bool = False) -> Any:
    """A step that answers with ``usage``: text, or a tool call when ``calls``."""

    def step(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        message = (
            ChatMessage.assistant(None, tool_calls=[ToolCall(f"c{len(messages)}", "look")])
            if calls
            else ChatMessage.assistant(text)
        )
        return AgentResponse((message,), usage)

    return step


class Seen(ContextProvider):
    """Records the error its post stage saw."""

    def __init__(self) -> None:
        self.errors: list[BaseException | None] = []

    async def on_invoked(self, agent, session, request_messages, response, error):  # type: ignore[no-untyped-def]
        self.errors.append(error)


def client(*steps: Any, model: str = "house", counted: int | None = None) -> ScriptedChatClient:
    scripted = ScriptedChatClient(list(steps))
    scripted.model = model  # type: ignore[attr-defined]
    if counted is not None:  # the client's own count of a prompt, which the limits use
        scripted.count_tokens = lambda messages, tools=(): counted  # type: ignore[attr-defined]
    return scripted


async def test_max_requests_refuses_the_call_past_it_and_every_post_stage_sees_why() -> None:
    model = client(*(answer(Usage(10, 1), calls=True) for _ in range(5)))
    seen = Seen()
    agent = Agent(model, tools=[look], stack=[seen], chat_stack=[UsageLimits(max_requests=2)])
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("look twice")
    assert len(model.requests) == 2  # the third call was never sent
    error = caught.value
    assert (error.limit, error.requests) == ("max_requests", 2)
    assert error.spent == Usage(20, 2)
    assert seen.errors == [error]
    assert "usage limit max_requests" in str(error)


async def test_the_input_is_counted_with_the_clients_count_before_sending() -> None:
    model = client(answer(Usage(10, 1)), counted=500)
    agent = Agent(model, chat_stack=[UsageLimits(max_request_input_tokens=499)])
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("hi")
    assert model.requests == []
    assert caught.value.limit == "max_request_input_tokens"
    assert "the call's input is 500 tokens, over 499" in str(caught.value)


async def test_max_input_tokens_counts_the_run_so_far_and_the_next_calls_input() -> None:
    model = client(answer(Usage(300, 5), calls=True), answer(Usage(300, 5)), counted=300)
    agent = Agent(model, tools=[look], chat_stack=[UsageLimits(max_input_tokens=599)])
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("hi")
    assert len(model.requests) == 1
    assert caught.value.limit == "max_input_tokens"
    agent = Agent(
        client(answer(Usage(300, 5), calls=True), answer(Usage(300, 5)), counted=300),
        tools=[look],
        chat_stack=[UsageLimits(max_input_tokens=600, max_total_tokens=605)],
    )
    assert (await agent.run("hi")).text == "ok"


async def test_an_answer_past_max_output_tokens_ends_normally_and_the_next_call_is_refused() -> (
    None
):
    model = client(answer(Usage(10, 50), calls=True), answer(Usage(10, 1)))
    agent = Agent(model, tools=[look], chat_stack=[UsageLimits(max_output_tokens=40)])
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("hi")
    assert len(model.requests) == 1
    assert caught.value.limit == "max_output_tokens"
    one = Agent(client(answer(Usage(10, 50))), chat_stack=[UsageLimits(max_output_tokens=40)])
    assert (await one.run("hi")).text == "ok"


async def test_max_cost_refuses_the_call_whose_input_alone_would_pass_it() -> None:
    # house: $1 in, $10 out per million. The first call costs 1000*1 + 100*10 = $0.002.
    model = client(answer(Usage(1000, 100), calls=True), answer(Usage(1000, 1)), counted=1000)
    limits = UsageLimits(max_cost="0.0031", prices=PRICES)
    agent = Agent(model, tools=[look], chat_stack=[limits])
    assert (await agent.run("hi")).text == "ok"  # $0.002, then $0.001 of input: it fits
    # The second call's input alone, $0.001, on top of $0.002 passes $0.0029: not sent.
    limits = UsageLimits(max_cost="0.0029", prices=PRICES)
    model = client(answer(Usage(1000, 100), calls=True), answer(Usage(1000, 1)), counted=1000)
    with pytest.raises(UsageLimitExceeded) as caught:
        await Agent(model, tools=[look], chat_stack=[limits]).run("hi")
    assert len(model.requests) == 1
    assert (caught.value.limit, caught.value.cost) == ("max_cost", Decimal("0.002"))


async def test_each_run_has_its_own_count() -> None:
    model = client(answer(Usage(10, 1)), answer(Usage(10, 1)), answer(Usage(10, 1)))
    agent = Agent(model, chat_stack=[UsageLimits(max_requests=1)])
    for _ in range(3):
        await agent.run("hi")
    assert len(model.requests) == 3


async def test_a_streamed_run_is_limited_too() -> None:
    model = client(*(answer(Usage(10, 1), calls=True) for _ in range(3)))
    agent = Agent(model, tools=[look], chat_stack=[UsageLimits(max_requests=1)])

    async def read() -> None:
        async with agent.stream("hi") as stream:
            async for _ in stream:
                pass

    with pytest.raises(UsageLimitExceeded):
        await read()
    assert len(model.requests) == 1


async def test_a_fallbacks_call_is_priced_at_its_own_models_price() -> None:
    primary = client(RateLimitError("slow down", status_code=429))
    backup = client(answer(Usage(1000, 0), calls=True), model="backup")
    limits = UsageLimits(max_cost="0.05", prices=PRICES)
    agent = Agent(primary, tools=[look], chat_stack=[limits, FallbackMiddleware(backup)])
    with pytest.raises(UsageLimitExceeded) as caught:
        await agent.run("hi")
    # backup: $100 per million: 1000 tokens cost $0.1, not house's $0.001.
    assert caught.value.cost == Decimal("0.1")


async def test_after_retry_middleware_each_attempt_is_a_request() -> None:
    model = client(RateLimitError("slow down", status_code=429), answer(Usage(10, 1)))
    agent = Agent(
        model,
        chat_stack=[RetryMiddleware(attempts=3, wait_initial=0), UsageLimits(max_requests=1)],
    )
    with pytest.raises(UsageLimitExceeded):
        await agent.run("hi")
    assert len(model.requests) == 1


async def test_max_cost_on_a_model_of_no_known_price_is_a_clear_error() -> None:
    agent = Agent(
        client(answer(Usage(1, 1)), model="nobody-knows"),
        chat_stack=[UsageLimits(max_cost=1, prices=PRICES)],
    )
    with pytest.raises(ConfigError, match="max_cost needs the price of model 'nobody-knows'"):
        await agent.run("hi")


async def test_an_answer_from_a_model_of_no_known_price_is_named_in_the_error() -> None:
    # The call asked for "house" (priced); the server answered as "house:latest" (not):
    # the error names the model that answered, not the one the caller did price.
    def renamed(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        call = ToolCall(f"c{len(messages)}", "look")
        return AgentResponse(
            (ChatMessage.assistant(None, tool_calls=[call]),), Usage(1, 1), model="house:latest"
        )

    agent = Agent(
        client(renamed, answer(Usage(1, 1))),
        tools=[look],
        chat_stack=[UsageLimits(max_cost=1, prices=PRICES)],
    )
    with pytest.raises(ConfigError, match="price of model 'house:latest', which answered"):
        await agent.run("hi")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"max_requests": -1}, "max_requests must be an int >= 0"),
        ({"max_input_tokens": 1.5}, "max_input_tokens must be an int >= 0"),
        ({"max_output_tokens": True}, "max_output_tokens must be an int >= 0"),
        ({"max_cost": -0.01}, "max_cost must be finite and >= 0"),
        ({"max_cost": "a dollar"}, "max_cost must be a number of USD"),
        ({"max_cost": float("inf")}, "max_cost must be finite and >= 0"),
    ],
)
def test_bad_limits_are_refused_when_built(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="UsageLimits: ") as caught:
        UsageLimits(**arguments)
    assert message in str(caught.value)


async def test_it_belongs_in_the_chat_stack() -> None:
    agent = Agent(client(answer(Usage(1, 1))), stack=[UsageLimits(max_requests=1)])
    with pytest.raises(TypeError, match="belongs in Agent"):
        await agent.run("hi")
