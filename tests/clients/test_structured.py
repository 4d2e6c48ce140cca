"""Structured output through both OpenAI clients, over real HTTP to loopback servers:
the request bodies, valid, invalid and refused answers, the retry, and streaming."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pydantic
import pytest

from raf import Agent, AgentResponse, OpenAIChatClient, OpenAIResponsesClient, Update, tool
from raf.errors import BadRequestError, OutputRefusedError, OutputValidationError
from tests._harness.openai_server import OpenAIServer, Reply, chunk, text_stream
from tests._harness.responses_server import Answer, ResponsesServer, response_body

pytestmark = pytest.mark.anyio


class Item(pydantic.BaseModel):
    name: str
    qty: int = 1


class Order(pydantic.BaseModel):
    items: list[Item]
    note: str | None = None


#: What both clients send for Order: every property required, the optional ones
#: nullable, no extra properties, no defaults, $defs too.
STRICT_ORDER = {
    "$defs": {
        "Item": {
            "properties": {
                "name": {"title": "Name", "type": "string"},
                "qty": {"anyOf": [{"title": "Qty", "type": "integer"}, {"type": "null"}]},
            },
            "required": ["name", "qty"],
            "title": "Item",
            "type": "object",
            "additionalProperties": False,
        }
    },
    "properties": {
        "items": {"items": {"$ref": "#/$defs/Item"}, "title": "Items", "type": "array"},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Note"},
    },
    "required": ["items", "note"],
    "title": "Order",
    "type": "object",
    "additionalProperties": False,
}

GOOD = '{"items": [{"name": "tea", "qty": 2}, {"name": "cake", "qty": null}], "note": null}'
BAD = '{"items": [{"name": "tea", "qty": "two"}], "note": null}'
ORDER = Order(items=[Item(name="tea", qty=2), Item(name="cake")])


class Api:
    """One OpenAI API behind its loopback server: how to script it, how to read it."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.server: OpenAIServer | ResponsesServer = (
            OpenAIServer() if kind == "chat" else ResponsesServer()
        )

    def client(self) -> OpenAIChatClient | OpenAIResponsesClient:
        cls = OpenAIChatClient if self.kind == "chat" else OpenAIResponsesClient
        return cls("test-model", base_url=self.server.base_url, api_key="sk", max_retries=0)

    def text(self, text: str, *, streamed: bool = False) -> None:
        """Queue an answer with ``text`` (as a stream when ``streamed``)."""
        if isinstance(self.server, OpenAIServer):
            if streamed:
                half = len(text) // 2
                self.server.reply(Reply(events=text_stream(text[:half], text[half:])))
            else:
                self.server.answer(content=text)
        else:
            self.server.answer(text=text)  # streamed as events when the request asks

    def tool_call(self, name: str, arguments: str) -> None:
        if isinstance(self.server, OpenAIServer):
            self.server.answer(content=None, tool_calls=[("call_1", name, arguments)])
        else:
            self.server.answer(text=None, calls=[("call_1", name, arguments)])

    def refusal(self, text: str, *, streamed: bool = False) -> None:
        if isinstance(self.server, OpenAIServer):
            if streamed:
                refused = {**chunk(), "choices": [{"index": 0, "delta": {"refusal": text}}]}
                events = (
                    chunk(role="assistant"),
                    refused,
                    chunk(finish_reason="stop"),
                    chunk(usage=(5, 2), choices=False),
                )
                self.server.reply(Reply(events=events))
            else:
                self.server.answer(content=None, refusal=text)
            return
        body = response_body(None)
        body["output"] = [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "refusal", "refusal": text}],
            }
        ]
        events = [
            {"type": "response.created", "response": {**body, "output": []}},
            {"type": "response.refusal.delta", "item_id": "msg_1", "delta": text},
            {"type": "response.completed", "response": body},
        ]
        self.server.reply(Answer(body=body, events=events if streamed else None))

    def schema_sent(self, body: dict[str, Any]) -> dict[str, Any]:
        """The structured-output request of a request body, in one shape for both APIs."""
        if self.kind == "chat":
            form = body["response_format"]
            assert form["type"] == "json_schema"
            found: dict[str, Any] = form["json_schema"]
            return found
        form = body["text"]["format"]
        assert form["type"] == "json_schema"
        return {key: value for key, value in form.items() if key != "type"}

    def last_message(self, body: dict[str, Any]) -> dict[str, Any]:
        key = "messages" if self.kind == "chat" else "input"
        last: dict[str, Any] = body[key][-1]
        return last


@pytest.fixture(params=["chat", "responses"])
def api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = Api(request.param)
    yield running
    running.server.close()


async def run(api: Api, streamed: bool, **kwargs: Any) -> tuple[AgentResponse, list[Update]]:
    """One run of an agent on ``api``'s client: streamed (the iterator form) or not."""
    tools = kwargs.pop("tools", ())
    async with api.client() as model:
        agent = Agent(model, tools=tools)
        if not streamed:
            return await agent.run("order", **kwargs), []
        updates: list[Update] = []
        async with agent.stream("order", **kwargs) as stream:
            async for update in stream:
                updates.append(update)
        assert stream.response is not None
        return stream.response, updates


@pytest.mark.parametrize("streamed", [False, True])
async def test_the_request_asks_for_the_strict_schema_and_the_answer_is_the_output(
    api: Api, streamed: bool
) -> None:
    api.text(GOOD, streamed=streamed)
    response, updates = await run(api, streamed, output_type=Order)
    assert response.output == ORDER
    assert response.text == GOOD
    if streamed:  # text updates as usual, the output at the end
        assert "".join(u.text for u in updates if u.kind == "text") == GOOD
    (request,) = api.server.requests
    assert api.schema_sent(request.body) == {
        "name": "Order",
        "schema": STRICT_ORDER,
        "strict": True,
    }
    assert (request.body.get("stream") is True) is streamed


async def test_a_plain_type_is_asked_for_wrapped_in_an_object(api: Api) -> None:
    api.text('{"value": [3, 1, 2]}')
    response, _ = await run(api, False, output_type=list[int])
    assert response.output == [3, 1, 2]
    sent = api.schema_sent(api.server.requests[0].body)
    assert sent["name"] == "list_int"
    assert sent["schema"] == {
        "properties": {"value": {"items": {"type": "integer"}, "title": "Value", "type": "array"}},
        "required": ["value"],
        "title": "list_int",
        "type": "object",
        "additionalProperties": False,
    }


async def test_no_output_type_sends_no_format(api: Api) -> None:
    api.text("plain")
    response, _ = await run(api, False)
    assert response.output is None
    body = api.server.requests[0].body
    assert "response_format" not in body
    assert "text" not in body


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_invalid_answer_is_told_to_the_model_and_retried(api: Api, streamed: bool) -> None:
    api.text(BAD, streamed=streamed)
    api.text(GOOD, streamed=streamed)
    response, updates = await run(api, streamed, output_type=Order)
    assert response.output == ORDER
    first, second = api.server.requests
    told = api.last_message(second.body)
    assert told["role"] == "user"
    assert "items.0.qty: Input should be a valid integer" in told["content"]
    # The rejected answer went back to the model, before the correction.
    key = "messages" if api.kind == "chat" else "input"
    assert second.body[key][-2] == {"role": "assistant", "content": BAD}
    # Both requests asked for the schema; the response keeps every turn the model saw.
    assert api.schema_sent(first.body) == api.schema_sent(second.body)
    assert [m.role for m in response.messages] == ["assistant", "user", "assistant"]
    if streamed:
        texts = "".join(u.text for u in updates if u.kind == "text")
        assert texts.endswith(GOOD)


async def test_answers_that_never_validate_raise_with_the_text_and_the_problems(
    api: Api,
) -> None:
    api.text("not json at all")
    api.text('{"items": "none"}')
    with pytest.raises(OutputValidationError) as caught:
        await run(api, False, output_type=Order, output_retries=1)
    error = caught.value
    assert error.text == '{"items": "none"}'
    assert error.attempts == 2
    assert error.problems == ("items: Input should be a valid array",)
    assert isinstance(error.__cause__, pydantic.ValidationError)
    assert len(api.server.requests) == 2


async def test_output_retries_zero_raises_at_the_first_invalid_answer(api: Api) -> None:
    api.text("{}")
    with pytest.raises(OutputValidationError, match="items: Field required"):
        await run(api, False, output_type=Order, output_retries=0)
    assert len(api.server.requests) == 1


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_refusal_is_an_output_refused_error_not_retried(api: Api, streamed: bool) -> None:
    api.refusal("I can't help with that.", streamed=streamed)
    with pytest.raises(OutputRefusedError) as caught:
        await run(api, streamed, output_type=Order)
    assert caught.value.refusal == "I can't help with that."
    assert caught.value.model == "test-model"
    assert not isinstance(caught.value, OutputValidationError)
    assert len(api.server.requests) == 1


@pytest.mark.parametrize("streamed", [False, True])
async def test_without_output_type_a_refusal_stays_the_text(api: Api, streamed: bool) -> None:
    api.refusal("No.", streamed=streamed)
    response, _ = await run(api, streamed)
    assert response.text == "No."


@tool
def price(item: str) -> int:
    """The price of an item."""
    return len(item)


@pytest.mark.parametrize("streamed", [False, True])
async def test_tool_calls_work_as_usual_and_only_the_final_answer_is_validated(
    api: Api, streamed: bool
) -> None:
    api.tool_call("price", '{"item": "tea"}')
    api.text(GOOD, streamed=streamed)
    response, updates = await run(api, streamed, output_type=Order, tools=[price])
    assert response.output == ORDER
    assert [m.role for m in response.messages] == ["assistant", "tool", "assistant"]
    assert response.messages[1].content == "3"
    first, second = api.server.requests
    assert api.schema_sent(first.body) == api.schema_sent(second.body)
    if streamed:
        kinds = [u.kind for u in updates if u.kind != "usage"]
        assert kinds[:3] == ["tool_call", "tool_result", "text"]
        assert set(kinds[2:]) == {"text"}


async def test_a_mapping_with_free_keys_is_refused_before_sending(api: Api) -> None:
    with pytest.raises(BadRequestError, match="free keys"):
        await run(api, False, output_type=dict[str, int])
    assert api.server.requests == []


async def test_extra_text_options_keep_the_format() -> None:
    server = ResponsesServer()
    try:
        server.answer(text='{"value": 1}')
        async with OpenAIResponsesClient(
            "m", base_url=server.base_url, api_key="k", max_retries=0
        ) as model:
            from raf import AgentRunOptions

            options = AgentRunOptions(extra={"text": {"verbosity": "low"}})
            response = await Agent(model).run("x", options=options, output_type=int)
        assert response.output == 1
        text = server.requests[0].body["text"]
        assert text["verbosity"] == "low"
        assert text["format"]["name"] == "int"
    finally:
        server.close()
