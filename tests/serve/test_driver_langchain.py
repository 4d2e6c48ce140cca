"""``langchain-openai``'s ``ChatOpenAI`` as the client of a served agent, over real uvicorn
(issue 32): ``bind_tools`` offers its tools to the model, a call comes back as the
message's ``tool_calls`` and the result goes on; streaming and structured output."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pydantic
import pytest

from tests._harness.uvicorn_server import ServedAgent

if TYPE_CHECKING:
    # langchain is imported where it is used: collecting this module stays cheap.
    from langchain_core.tools import BaseTool
    from langchain_openai import ChatOpenAI

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def get_weather() -> BaseTool:
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    return get_weather


class Answer(pydantic.BaseModel):
    answer: str


@pytest.fixture(scope="module")
def chat() -> Iterator[ChatOpenAI]:
    from langchain_openai import ChatOpenAI

    with ServedAgent() as served:
        yield ChatOpenAI(
            model="word-agent", base_url=f"{served.url}/v1", api_key="unused", max_retries=0
        )


def test_bind_tools_gets_the_call_and_the_result_goes_on(
    chat: ChatOpenAI, get_weather: BaseTool
) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    bound = chat.bind_tools([get_weather])
    question = HumanMessage("client weather")
    called = bound.invoke([question])
    assert isinstance(called, AIMessage)
    [call] = called.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answered = bound.invoke([question, called, result])
    assert answered.content == "the tool said sunny in Paris"


def test_a_required_tool_choice_calls_the_tool(chat: ChatOpenAI, get_weather: BaseTool) -> None:
    from langchain_core.messages import AIMessage

    called = chat.bind_tools([get_weather], tool_choice="any").invoke("hello")
    assert isinstance(called, AIMessage)
    assert [c["name"] for c in called.tool_calls] == ["get_weather"]


def test_a_streamed_answer_is_the_whole_one(chat: ChatOpenAI) -> None:
    streamed = "".join(str(chunk.content) for chunk in chat.stream("hi there"))
    assert streamed == chat.invoke("hi there").content == "seen 1: hi there "


def test_structured_output_by_json_schema(chat: ChatOpenAI) -> None:
    answer = chat.with_structured_output(Answer, method="json_schema").invoke("hello")
    assert answer == Answer(answer="hello")


class Said(pydantic.BaseModel):
    text: str


def test_structured_output_by_function_calling(chat: ChatOpenAI) -> None:
    # LangChain sends the schema as a tool, that tool as the tool choice, and
    # parallel_tool_calls=false: one call a turn (a 400 before).
    said = chat.with_structured_output(Said, method="function_calling").invoke("hello")
    assert said == Said(text="hi")


def test_structured_output_by_json_mode(chat: ChatOpenAI) -> None:
    # response_format {"type": "json_object"}: any JSON object (a 400 before).
    answer = chat.with_structured_output(Answer, method="json_mode").invoke("hello")
    assert answer == Answer(answer="hello")
