"""pydantic-ai's OpenAI model as the client of a served agent, over real uvicorn (issue 32):
its tools are offered to the model and run by pydantic-ai, and its ``output_type`` (as a
tool, and as a JSON schema) comes back validated. pydantic-ai runs on asyncio only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pydantic
import pytest

from tests._harness.uvicorn_server import ServedAgent

if TYPE_CHECKING:
    # pydantic-ai and openai are imported where they are used: collecting stays cheap.
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


class Said(pydantic.BaseModel):
    text: str


class Answer(pydantic.BaseModel):
    answer: str


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # pydantic-ai runs on asyncio only (it calls asyncio.create_task)


@pytest.fixture(scope="module")
def served() -> Iterator[ServedAgent]:
    with ServedAgent() as server:
        yield server


@pytest.fixture
async def model(served: ServedAgent, anyio_backend: str) -> AsyncIterator[OpenAIChatModel]:
    import openai
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    async with openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="unused") as client:
        yield OpenAIChatModel("word-agent", provider=OpenAIProvider(openai_client=client))


def weather_agent(model: OpenAIChatModel, calls: list[str]) -> Agent[None, str]:
    from pydantic_ai import Agent

    agent = Agent(model)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    return agent


async def test_its_tool_is_called_and_its_result_answered(model: OpenAIChatModel) -> None:
    calls: list[str] = []
    result = await weather_agent(model, calls).run("client weather")
    assert calls == ["Paris"]
    assert result.output == "the tool said sunny in Paris (choice auto)"


async def test_its_tool_is_called_in_a_streamed_run(model: OpenAIChatModel) -> None:
    calls: list[str] = []
    async with weather_agent(model, calls).run_stream("client weather") as result:
        text = "".join([delta async for delta in result.stream_text(delta=True)])
    assert text == "the tool said sunny in Paris (choice auto)"
    assert calls == ["Paris"]


async def test_an_output_type_as_its_output_tool(model: OpenAIChatModel) -> None:
    from pydantic_ai import Agent

    # pydantic-ai offers a final_result tool and requires a call: the served model calls it.
    assert (await Agent(model, output_type=Said).run("hello")).output == Said(text="hi")


async def test_an_output_type_as_a_json_schema(model: OpenAIChatModel) -> None:
    from pydantic_ai import Agent, NativeOutput

    result = await Agent(model, output_type=NativeOutput(Answer)).run("hello there")
    assert result.output == Answer(answer="hello there")
