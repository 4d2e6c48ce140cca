"""litellm (``acompletion`` with ``api_base``) as the client of a served agent, over real
uvicorn (issue 32). ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps litellm from fetching its cost
map at import; nothing else it does goes past the loopback. litellm runs on asyncio."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests._harness.uvicorn_server import ServedAgent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    # litellm's own TypedDicts (its OAuth device code), on its first call: not raf's.
    pytest.mark.filterwarnings("ignore:Items? .* using the .ReadOnly. qualifier:UserWarning"),
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # litellm's async client is asyncio's (aiohttp)


@pytest.fixture(scope="module")
def served() -> Iterator[ServedAgent]:
    with ServedAgent() as server:
        yield server


def litellm() -> Any:
    """litellm, imported by the test that runs, not at collection: its import costs
    about 4 s of CPU, which every pytest worker would pay for three tests."""
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported
    return pytest.importorskip("litellm")


async def complete(served: ServedAgent, text: str, **more: Any) -> Any:
    return await litellm().acompletion(
        model="openai/word-agent", api_base=f"{served.url}/v1", api_key="unused",
        messages=[{"role": "user", "content": text}], **more,
    )  # fmt: skip


async def test_a_plain_answer(served: ServedAgent) -> None:
    reply = await complete(served, "hi there")
    assert reply.choices[0].message.content == "seen 1: hi there "
    assert reply.choices[0].finish_reason == "stop"


async def test_a_streamed_answer(served: ServedAgent) -> None:
    chunks = await complete(served, "hi there", stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in chunks])
    assert text == "seen 1: hi there "


async def test_a_call_of_its_tool_ends_the_turn(served: ServedAgent) -> None:
    reply = await complete(served, "client weather", tools=[WEATHER])
    [call] = reply.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
    assert reply.choices[0].finish_reason == "tool_calls"
