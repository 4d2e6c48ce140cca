"""Structured output offline: the validation step, the options that carry the schema, the
strict schema, the errors, and the testing strategy."""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Awaitable, Callable
from typing import Any, NotRequired

import anyio
import anyio.lowlevel
import attrs
import pydantic
import pytest
from hypothesis import given, settings
from typing_extensions import TypedDict

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatMessage,
    ChatOptions,
    ChatRequest,
    ContextProvider,
    ContextResult,
    EchoChatClient,
    HistoryProvider,
    InMemorySession,
    Invocation,
    OpenAIChatClient,
    ScriptedChatClient,
    ToolCall,
    tool,
)
from raf.errors import BadRequestError, OutputRefusedError, OutputValidationError
from raf.testing import strategies as rs
from tests._harness.openai_server import OpenAIServer

pytestmark = pytest.mark.anyio


class Item(pydantic.BaseModel):
    name: str
    qty: int = pydantic.Field(default=1, ge=1)


@dataclasses.dataclass
class Box:
    items: list[Item]
    label: str | None = None
    size: int = 3


class Point(TypedDict):
    x: int
    y: NotRequired[int]


async def test_a_scripted_client_ignores_the_schema_and_the_run_validates() -> None:
    client = ScriptedChatClient(['{"items": [{"name": "tea"}], "label": "a"}'])
    response = await Agent(client).run("pack", output_type=Box)
    assert response.output == Box([Item(name="tea")], "a")
    (call,) = client.requests
    # An object type's schema is pydantic's JSON Schema of it (docs/structured-output.md).
    assert call.options.output_schema == pydantic.TypeAdapter(Box).json_schema()
    assert call.options.output_schema["title"] == "Box"


@pytest.mark.parametrize(
    ("output_type", "answer", "expected"),
    [
        (Point, '{"x": 1}', {"x": 1}),
        (int, '{"value": 7}', 7),
        (list[Item], '{"value": [{"name": "a", "qty": 2}]}', [Item(name="a", qty=2)]),
        (Item | None, '{"value": null}', None),
        (str, "just text", "just text"),
    ],
)
async def test_each_kind_of_type_is_validated(output_type: Any, answer: str, expected: Any) -> None:
    client = ScriptedChatClient([answer])
    response = await Agent(client).run("x", output_type=output_type)
    assert response.output == expected
    schema = client.requests[0].options.output_schema
    if output_type is str:
        assert schema is None  # the text is the output: nothing to ask for
    else:
        assert schema is not None
        assert schema["type"] == "object"


async def test_the_echo_client_accepts_the_schema_too() -> None:
    response = await Agent(EchoChatClient()).run('{"value": 3}', output_type=int)
    assert response.output == 3


def test_run_sync_asks_for_the_type_too() -> None:
    response = Agent(EchoChatClient()).run_sync('{"x": 4}', output_type=Point)
    assert response.output == {"x": 4}


async def test_a_null_for_an_optional_field_that_is_not_nullable_means_its_default() -> None:
    # What a strict schema makes a model write: every field, null when it has no value.
    client = ScriptedChatClient(
        ['{"items": [{"name": "a", "qty": null}], "label": null, "size": null}']
    )
    response = await Agent(client).run("x", output_type=Box)
    assert response.output == Box([Item(name="a", qty=1)], None, 3)


async def test_the_correction_names_each_field_and_problem() -> None:
    client = ScriptedChatClient(['{"items": [{"name": 5, "qty": 0}]}', '{"items": []}'])
    response = await Agent(client).run("x", output_type=Box)
    assert response.output == Box([])
    told = client.requests[1].messages[-1]
    assert told.role == "user"
    assert "items.0.name: Input should be a valid string" in (told.content or "")
    assert "items.0.qty: Input should be greater than or equal to 1" in (told.content or "")
    assert client.requests[1].messages[-2].content == '{"items": [{"name": 5, "qty": 0}]}'


async def test_the_retries_are_counted_and_the_error_keeps_the_text() -> None:
    client = ScriptedChatClient(["a", "b", "c"])
    with pytest.raises(OutputValidationError) as caught:
        await Agent(client).run("x", output_type=int, output_retries=2)
    assert caught.value.attempts == 3
    assert caught.value.text == "c"
    assert caught.value.problems[0].startswith("(the whole answer): Invalid JSON")
    assert len(client.requests) == 3
    restored = pickle.loads(pickle.dumps(caught.value))
    assert (restored.text, restored.problems, str(restored)) == (
        "c",
        caught.value.problems,
        str(caught.value),
    )


def test_a_refusal_error_says_so_and_pickles() -> None:
    error = OutputRefusedError("not allowed", model="m")
    assert str(error) == "model 'm' refused to answer with the output type: not allowed"
    assert pickle.loads(pickle.dumps(error)).refusal == "not allowed"


async def test_a_run_with_history_keeps_every_turn_the_model_saw() -> None:
    session = InMemorySession()
    client = ScriptedChatClient(["oops", '{"value": 1}'])
    agent = Agent(client, history=True)
    response = await agent.run("x", session=session, output_type=int)
    assert response.output == 1
    stored = [m.role for m in await session.get_messages()]
    assert stored == ["user", "assistant", "user", "assistant"]
    assert isinstance(agent.stack[0], HistoryProvider)


async def test_the_options_carry_the_type_to_providers_and_the_schema_to_the_chat_stack() -> None:
    seen: list[Any] = []

    class Looks(ContextProvider):
        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            seen.append(("provider", options.output_type))
            return ContextResult()

    async def run_middleware(
        invocation: Invocation, call_next: Callable[[Invocation], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        seen.append(("run", invocation.options.output_retries))
        return await call_next(invocation)

    async def chat_middleware(
        request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        seen.append(("chat", request.options.output_schema["title"]))
        return await call_next(request)

    agent = Agent(
        ScriptedChatClient(['{"name": "a"}']),
        stack=[Looks(), run_middleware],
        chat_stack=[chat_middleware],
    )
    response = await agent.run("x", output_type=Item, output_retries=3)
    assert response.output == Item(name="a")
    assert seen == [("provider", Item), ("run", 3), ("chat", "Item")]


async def test_options_can_ask_for_the_type_themselves() -> None:
    options = AgentRunOptions(output_type=int, output_retries=0)
    client = ScriptedChatClient(['{"value": 2}', "plain"])
    response = await Agent(client).run("x", options=options)
    assert response.output == 2
    # A plain type is asked for wrapped in an object with one key, value.
    assert client.requests[0].options.output_schema == {
        "properties": {"value": {"title": "Value", "type": "integer"}},
        "required": ["value"],
        "title": "int",
        "type": "object",
    }
    await Agent(client).run("x", options=attrs.evolve(options, output_type=None))
    assert client.requests[1].options.output_schema is None
    assert ChatOptions().output_schema is None


async def test_bad_output_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="output_retries"):
        AgentRunOptions(output_retries=-1)

    class NotAType:
        pass

    client = ScriptedChatClient(["never"])
    with pytest.raises(TypeError, match="output_type"):
        await Agent(client).run("x", output_type=NotAType)
    with pytest.raises(TypeError, match="output_type"):
        await Agent(client).run("x", options=AgentRunOptions(output_type=NotAType))
    assert client.requests == []


@tool
def look(what: str) -> str:
    """Look something up."""
    return what.upper()


async def test_tool_calls_are_not_validated_and_streams_end_with_the_output() -> None:
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(ToolCall("1", "look", '{"what": "a"}')),
            ['{"na', 'me": "A"}'],
        ]
    )
    async with Agent(client, tools=[look]).stream("x", output_type=Item) as stream:
        kinds = [update.kind async for update in stream]
    assert kinds == ["tool_call", "tool_result", "text", "text"]
    assert stream.response is not None
    assert stream.response.output == Item(name="A")


async def test_a_streamed_retry_streams_both_answers() -> None:
    client = ScriptedChatClient([["{", "bad"], '{"value": 5}'])
    texts: list[str] = []

    async def on_update(update: Any) -> None:
        texts.append(update.text)

    response = await Agent(client).run("x", output_type=int, on_update=on_update)
    assert response.output == 5
    assert texts == ["{", "bad", '{"value": 5}']


# --- The strict schema --------------------------------------------------------------------


async def strict_schema_sent(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema an OpenAIChatClient sends, strict, when a call asks for ``schema``."""
    server = OpenAIServer()
    try:
        server.answer(content="{}")
        async with OpenAIChatClient(
            "m", base_url=server.base_url, api_key="k", max_retries=0
        ) as model:
            await model.complete([ChatMessage.user("x")], ChatOptions(output_schema=schema))
        (request,) = server.requests
        sent: dict[str, Any] = request.body["response_format"]["json_schema"]["schema"]
        return sent
    finally:
        server.close()


async def test_strict_schema_requires_every_property_and_forbids_others_recursively(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    schema = pydantic.TypeAdapter(Box).json_schema()
    strict = await strict_schema_sent(schema)
    assert strict["required"] == ["items", "label", "size"]
    assert strict["additionalProperties"] is False
    assert strict["properties"]["size"] == {
        "anyOf": [{"title": "Size", "type": "integer"}, {"type": "null"}]
    }
    item = strict["$defs"]["Item"]
    assert item["required"] == ["name", "qty"]
    assert item["additionalProperties"] is False
    assert "default" not in str(strict)
    assert schema["required"] == ["items"]  # the original is left as it was


async def test_strict_schema_turns_one_of_into_any_of_and_refuses_free_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    strict = await strict_schema_sent({"oneOf": [{"type": "integer"}, {"type": "string"}]})
    assert strict == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    with pytest.raises(BadRequestError, match="#/properties/tags"):
        await strict_schema_sent(
            {
                "type": "object",
                "properties": {
                    "tags": {"type": "object", "additionalProperties": {"type": "integer"}}
                },
            }
        )


# --- The testing strategy -----------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(rs.outputs(Box))
def test_outputs_are_values_a_run_can_return(box: Box) -> None:
    assert isinstance(box, Box)
    assert all(item.qty >= 1 for item in box.items)  # the constraints hold
    client = ScriptedChatClient([rs.output_json(box, Box)])
    response = anyio.run(lambda: Agent(client).run("x", output_type=Box))
    assert response.output == box


@settings(max_examples=25, deadline=None)
@given(rs.outputs(list[Item]), rs.outputs(Point), rs.outputs(int | None))
def test_outputs_of_plain_types_and_typed_dicts(
    items: list[Item], point: Point, number: int | None
) -> None:
    assert all(isinstance(item, Item) for item in items)
    assert isinstance(point["x"], int)
    assert number is None or isinstance(number, int)
    client = ScriptedChatClient([rs.output_json(items, list[Item])])
    response = anyio.run(lambda: Agent(client).run("x", output_type=list[Item]))
    assert response.output == items


class Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str


async def test_the_correction_quotes_a_made_up_key_briefly() -> None:
    # A 100 kB key the model invented is quoted and cut, not repeated whole into a user
    # message that the history stores.
    long_key = "k\\n" + "x" * 100_000
    client = ScriptedChatClient([f'{{"name": "a", "{long_key}": 1}}', '{"name": "b"}'])
    response = await Agent(client).run("x", output_type=Strict)
    assert response.output == Strict(name="b")
    told = client.requests[1].messages[-1].content or ""
    assert len(told) < 1_000
    assert "'k\\nxxxx" in told
    assert "...': Extra inputs are not permitted" in told


async def test_a_large_wrong_answer_is_checked_while_other_tasks_run() -> None:
    # A wrong answer just under the limit (38,000 items, about 1 MB): the other tasks of
    # the event loop go on while it is checked (it was checked in the loop, for seconds).
    wrong = json.dumps({"value": [{"name": 1, "qty": "x"}] * 38_000})
    client = ScriptedChatClient([wrong])
    ticks = 0
    done = anyio.Event()

    async def tick() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as group:
        group.start_soon(tick)
        await anyio.lowlevel.checkpoint()
        counted = ticks
        with pytest.raises(OutputValidationError) as raised:
            await Agent(client).run("x", output_type=list[Item], output_retries=0)
        done.set()
    assert len(raised.value.problems) == 20
    # The run itself awaits a few times; a check in the loop leaves the ticker no more.
    assert ticks - counted > 200


async def test_an_answer_over_the_limit_is_not_validated_and_the_model_is_told() -> None:
    # 5 MB of wrong items: pydantic would build all 1M errors, for the 20 raf tells.
    huge = json.dumps({"value": [{"name": 1, "qty": "x"}] * 500_000})
    client = ScriptedChatClient([huge, '{"value": [{"name": "tea"}]}'])
    response = await Agent(client).run("x", output_type=list[Item])
    assert response.output == [Item(name="tea")]
    told = client.requests[1].messages[-1].content or ""
    assert "over the limit of 1048576 characters" in told
    assert len(told) < 1_000
