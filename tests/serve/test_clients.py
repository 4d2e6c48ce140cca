"""What real clients send: their own tools, tool_choice, response_format, fields the
server cannot honour, and a turn of two model calls, over real uvicorn (issue 32)."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx2 as httpx
import pydantic
import pytest
from ag_ui.core import EventType

from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent, started

if TYPE_CHECKING:
    import openai  # imported where used: collecting this module stays cheap

pytestmark = pytest.mark.slow
MODEL = "word-agent"
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


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServedAgent, ...]]:
    with started(
        ServedAgent(), ServedAgent(delay=0.01), ServedAgent(provider_tool=True)
    ) as running:
        yield running


@pytest.fixture
def server(servers: tuple[ServedAgent, ...]) -> ServedAgent:
    return servers[0]


@pytest.fixture
def slow(servers: tuple[ServedAgent, ...]) -> ServedAgent:
    return servers[1]


def sdk(server: ServedAgent) -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# -- client tools ----------------------------------------------------------------------


def test_a_call_of_a_client_tool_ends_the_turn_with_the_call(server: ServedAgent) -> None:
    reply = sdk(server).chat.completions.create(
        model=MODEL, messages=user("client weather"), tools=[WEATHER]
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )


def test_the_clients_next_request_brings_the_result_and_the_run_goes_on(
    server: ServedAgent,
) -> None:
    client = sdk(server)
    first = client.chat.completions.create(
        model=MODEL, messages=user("client weather"), tools=[WEATHER]
    )
    message = first.choices[0].message
    assert message.tool_calls is not None
    result = {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"}
    history = [*user("client weather"), message.model_dump(exclude_none=True), result]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "the tool said sunny"


def test_in_a_session_the_agents_own_call_runs_here_and_the_clients_waits(
    server: ServedAgent,
) -> None:
    client = sdk(server)
    session = {"X-Session-Id": uuid.uuid4().hex}
    first = client.chat.completions.create(
        model=MODEL, messages=user("client both"), tools=[WEATHER], extra_headers=session
    )
    calls = first.choices[0].message.tool_calls
    assert calls is not None
    assert [call.function.name for call in calls] == ["get_weather"]
    result = {"role": "tool", "tool_call_id": calls[0].id, "content": "rain"}
    second = client.chat.completions.create(
        model=MODEL, messages=[result], tools=[WEATHER], extra_headers=session
    )
    assert second.choices[0].message.content == "the tool said rain"
    stored = httpx.get(
        f"{server.url}/v1/sessions/{session['X-Session-Id']}/messages", verify=TLS
    ).json()["data"]
    answers = [m["content"] for m in stored if m["role"] == "tool"]
    assert answers == ["HI", "rain"]


def test_a_streamed_client_call_comes_as_tool_call_chunks(server: ServedAgent) -> None:
    chunks = list(
        sdk(server).chat.completions.create(
            model=MODEL, messages=user("client weather"), tools=[WEATHER], stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for delta in deltas for call in delta.tool_calls or ()]
    assert len(calls) == 1
    assert calls[0].function is not None
    assert (calls[0].index, calls[0].function.name) == (0, "get_weather")
    assert json.loads(calls[0].function.arguments or "") == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_client_tool_named_like_an_agent_tool_is_a_400(server: ServedAgent) -> None:
    import openai

    shout = {**WEATHER, "function": {**WEATHER["function"], "name": "shout"}}
    with pytest.raises(openai.BadRequestError, match="shout"):
        sdk(server).chat.completions.create(model=MODEL, messages=user("hi"), tools=[shout])


def test_a_named_tool_choice_goes_with_the_first_call_only(server: ServedAgent) -> None:
    reply = sdk(server).chat.completions.create(
        model=MODEL,
        messages=user("hello"),
        tool_choice={"type": "function", "function": {"name": "shout"}},
    )
    assert reply.choices[0].message.content == "the tool said HI (choice auto)"


def test_a_required_tool_choice_calls_the_clients_tool(server: ServedAgent) -> None:
    reply = sdk(server).chat.completions.create(
        model=MODEL, messages=user("hello"), tools=[WEATHER], tool_choice="required"
    )
    calls = reply.choices[0].message.tool_calls
    assert calls is not None
    assert calls[0].function.name == "get_weather"


def test_a_tool_choice_naming_no_offered_tool_is_a_400(server: ServedAgent) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="nothing"):
        sdk(server).chat.completions.create(
            model=MODEL,
            messages=user("hello"),
            tool_choice={"type": "function", "function": {"name": "nothing"}},
        )


# -- response_format and fields -------------------------------------------------------


class Answer(pydantic.BaseModel):
    answer: str


def test_a_json_schema_response_format_is_answered_with_its_json(server: ServedAgent) -> None:
    reply = sdk(server).chat.completions.parse(
        model=MODEL, messages=user("hello"), response_format=Answer
    )
    assert reply.choices[0].message.parsed == Answer(answer="hello")


def test_a_streamed_structured_answer_is_its_json(server: ServedAgent) -> None:
    chunks = sdk(server).chat.completions.create(
        model=MODEL,
        messages=user("hi"),
        stream=True,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": Answer.model_json_schema()},
        },
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) == {"answer": "hi"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("n", 2), ("logprobs", True), ("audio", {"voice": "x"}), ("seed", 3), ("top_p", 0.5)],
)
def test_a_field_the_server_cannot_honour_is_a_400_naming_it(
    server: ServedAgent, field: str, value: Any
) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match=repr(field)):
        sdk(server).chat.completions.create(
            model=MODEL, messages=user("hi"), extra_body={field: value}
        )


def test_neutral_values_and_nulls_of_other_fields_are_accepted(server: ServedAgent) -> None:
    reply = sdk(server).chat.completions.create(
        model=MODEL,
        messages=user("hi"),
        extra_body={"n": 1, "logprobs": False, "parallel_tool_calls": True, "seed": None},
    )
    assert reply.choices[0].message.content == "seen 1: hi "


# -- a turn of two model calls --------------------------------------------------------


def test_a_streamed_turns_text_equals_the_whole_answers(server: ServedAgent) -> None:
    client = sdk(server)
    whole = client.chat.completions.create(model=MODEL, messages=user("check tool"))
    chunks = client.chat.completions.create(model=MODEL, messages=user("check tool"), stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == "Let me check.\n\nthe tool said HI"
    assert streamed == whole.choices[0].message.content


# -- AG-UI ------------------------------------------------------------------------------


def agui_events(server: ServedAgent, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{server.url}/ag-ui", json=body, timeout=30, verify=TLS) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    return [json.loads(line[6:]) for line in lines]


def agui_input(thread: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    tool = {**WEATHER["function"]}
    return {
        "threadId": thread,
        "runId": uuid.uuid4().hex,
        "state": None,
        "messages": messages,
        "tools": [tool],
        "context": [],
        "forwardedProps": None,
    }


def test_ag_ui_client_tools_end_the_run_with_the_call_and_the_result_goes_on(
    server: ServedAgent,
) -> None:
    thread = uuid.uuid4().hex
    asked = {"id": "u1", "role": "user", "content": "client weather"}
    events = agui_events(server, agui_input(thread, [asked]))
    kinds = [e["type"] for e in events]
    assert kinds == [
        EventType.RUN_STARTED,
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
        EventType.RUN_FINISHED,
    ]
    call_id = events[1]["toolCallId"]
    assert events[1]["toolCallName"] == "get_weather"
    called = {
        "id": "a1",
        "role": "assistant",
        "toolCalls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": events[2]["delta"]},
            }
        ],
    }
    result = {"id": "t1", "role": "tool", "toolCallId": call_id, "content": "snow"}
    later = agui_events(server, agui_input(thread, [asked, called, result]))
    text = "".join(e["delta"] for e in later if e["type"] == EventType.TEXT_MESSAGE_CONTENT)
    assert text == "the tool said snow"


# -- a stopped stream, resent ---------------------------------------------------------


def stop_after(server: ServedAgent, path: str, body: dict[str, Any], session: str) -> None:
    """Send ``body`` streamed and close the socket after a few events (a Stop button)."""
    raw_body = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
            + b"Content-Type: application/json\r\n"
            + f"X-Session-Id: {session}\r\nContent-Length: {len(raw_body)}\r\n\r\n".encode()
            + raw_body
        )
        received = b""
        while received.count(b"data: ") < 6:
            received += raw.recv(4096)


def stored(server: ServedAgent, session: str, *, wait_for: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        data: list[dict[str, Any]] = httpx.get(
            f"{server.url}/v1/sessions/{session}/messages", verify=TLS
        ).json()["data"]
        if len(data) >= wait_for or time.monotonic() > deadline:
            return data
        time.sleep(0.05)


def test_a_stopped_question_resent_without_its_partial_answer_is_stored_once(
    slow: ServedAgent,
) -> None:
    session = uuid.uuid4().hex
    first = sdk(slow).chat.completions.create(
        model=MODEL, messages=user("hello"), extra_headers={"X-Session-Id": session}
    )
    history = [*user("hello"), {"role": "assistant", "content": first.choices[0].message.content}]
    body = {"model": MODEL, "stream": True, "messages": [*history, *user("long")]}
    stop_after(slow, "/v1/chat/completions", body, session)
    assert len(stored(slow, session, wait_for=4)) == 4  # the question and its partial answer
    again = sdk(slow).chat.completions.create(
        model=MODEL, messages=[*history, *user("long")], extra_headers={"X-Session-Id": session}
    )
    asked = [m["content"] for m in stored(slow, session, wait_for=5) if m["role"] == "user"]
    assert asked == ["hello", "long"]
    content = again.choices[0].message.content or ""
    assert content.startswith("seen 4: w0 ")  # the model saw the question once


def test_ag_ui_a_stopped_question_resent_is_stored_once(slow: ServedAgent) -> None:
    thread = uuid.uuid4().hex
    asked = {"id": "u1", "role": "user", "content": "long"}
    stop_after(slow, "/ag-ui", agui_input(thread, [asked]), thread)
    assert len(stored(slow, thread, wait_for=2)) == 2
    agui_events(slow, agui_input(thread, [asked]))
    users = [m["content"] for m in stored(slow, thread, wait_for=3) if m["role"] == "user"]
    assert users == ["long"]


# -- POST /v1/responses ---------------------------------------------------------------

WEATHER_FLAT = {"type": "function", **WEATHER["function"]}


def test_responses_a_plain_answer(server: ServedAgent) -> None:
    reply = sdk(server).responses.create(model=MODEL, input="hello there")
    assert reply.status == "completed"
    assert reply.output_text == "seen 1: hello there "
    assert reply.usage is not None
    assert reply.usage.output_tokens == 3


def test_responses_streamed_events_end_with_the_completed_response(server: ServedAgent) -> None:
    events = list(sdk(server).responses.create(model=MODEL, input="check tool", stream=True))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    whole = sdk(server).responses.create(model=MODEL, input="check tool")
    assert deltas == whole.output_text == "Let me check.\n\nthe tool said HI"
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == deltas


def test_responses_a_client_function_call_then_its_output_by_previous_response_id(
    server: ServedAgent,
) -> None:
    client = sdk(server)
    first = client.responses.create(model=MODEL, input="client weather", tools=[WEATHER_FLAT])
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": "hail"}
    second = client.responses.create(
        model=MODEL, input=[output], previous_response_id=first.id, tools=[WEATHER_FLAT]
    )
    assert second.output_text == "the tool said hail"


def test_responses_a_streamed_client_call_is_a_function_call_item(server: ServedAgent) -> None:
    events = list(
        sdk(server).responses.create(
            model=MODEL, input="client weather", tools=[WEATHER_FLAT], stream=True
        )
    )
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.item.type for e in done] == ["function_call"]
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].type == "function_call"


def test_responses_a_json_schema_text_format_is_answered_with_its_json(
    server: ServedAgent,
) -> None:
    reply = sdk(server).responses.parse(model=MODEL, input="hello", text_format=Answer)
    assert reply.output_parsed == Answer(answer="hello")


def test_responses_an_unknown_previous_response_id_is_a_400(server: ServedAgent) -> None:
    import openai

    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        sdk(server).responses.create(model=MODEL, input="hi", previous_response_id="resp_x")


@pytest.mark.parametrize("previous", [7, ["resp_x"], {"id": "resp_x"}, True])
def test_responses_a_previous_response_id_that_is_not_a_string_is_a_400(
    server: ServedAgent, previous: Any
) -> None:
    body = {"model": MODEL, "input": "hi", "previous_response_id": previous}
    reply = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30)
    assert reply.status_code == 400
    assert "'previous_response_id' must be a string" in reply.json()["error"]["message"]


def test_responses_without_store_is_stateless_and_other_fields_are_a_400(
    server: ServedAgent,
) -> None:
    import openai

    client = sdk(server)
    first = client.responses.create(model=MODEL, input="one", store=False)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    with pytest.raises(openai.BadRequestError, match="'top_logprobs'"):
        client.responses.create(model=MODEL, input="two", top_logprobs=3)


def test_responses_previous_response_id_goes_on_in_its_conversation(server: ServedAgent) -> None:
    client = sdk(server)
    first = client.responses.create(model=MODEL, input="one")
    second = client.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    assert second.output_text == "seen 3: two "


def test_ag_ui_each_model_calls_text_is_its_own_message(server: ServedAgent) -> None:
    asked = {"id": "u1", "role": "user", "content": "check tool"}
    events = agui_events(server, agui_input(uuid.uuid4().hex, [asked]))
    starts = [e["messageId"] for e in events if e["type"] == EventType.TEXT_MESSAGE_START]
    assert len(set(starts)) == 2
    texts = {
        id_: "".join(
            e["delta"]
            for e in events
            if e["type"] == EventType.TEXT_MESSAGE_CONTENT and e["messageId"] == id_
        )
        for id_ in starts
    }
    assert list(texts.values()) == ["Let me check.", "the tool said HI"]


def test_a_client_tool_with_a_schema_that_is_no_schema_is_a_400(server: ServedAgent) -> None:
    import openai

    broken = {**WEATHER, "function": {**WEATHER["function"], "parameters": {"type": 5}}}
    with pytest.raises(openai.BadRequestError, match="parameters"):
        sdk(server).chat.completions.create(model=MODEL, messages=user("hi"), tools=[broken])


def test_ag_ui_a_client_tool_named_like_an_agent_tool_is_a_400(server: ServedAgent) -> None:
    body = agui_input(uuid.uuid4().hex, [{"id": "u1", "role": "user", "content": "hi"}])
    body["tools"] = [{**WEATHER["function"], "name": "shout"}]
    reply = httpx.post(f"{server.url}/ag-ui", json=body, verify=TLS)
    assert reply.status_code == 400
    assert "shout" in reply.json()["error"]["message"]


def test_responses_a_named_tool_choice_calls_that_tool(server: ServedAgent) -> None:
    reply = sdk(server).responses.create(
        model=MODEL,
        input="hello",
        tools=[WEATHER_FLAT],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert [item.type for item in reply.output] == ["function_call"]


def test_parallel_tool_calls_false_reaches_the_model(server: ServedAgent) -> None:
    # On both routes, to a model behind OpenAI's API (a loopback server: what raf sent it).
    from tests._harness.openai_server import OpenAIServer

    model = OpenAIServer()
    try:
        with ServedAgent(openai_url=model.base_url) as served:
            model.answer(content="one")
            model.answer(content="two")
            chat = httpx.post(
                f"{served.url}/v1/chat/completions",
                json={"model": MODEL, "messages": user("hi"), "parallel_tool_calls": False},
                verify=TLS,
            )
            responses = httpx.post(
                f"{served.url}/v1/responses",
                json={"model": MODEL, "input": "hi", "parallel_tool_calls": False},
                verify=TLS,
            )
        assert (chat.status_code, responses.status_code) == (200, 200)
        sent = [request.body for request in model.requests]
    finally:
        model.close()
    assert [body.get("parallel_tool_calls") for body in sent] == [False, False]


def test_parallel_tool_calls_false_is_one_call_a_turn(server: ServedAgent) -> None:
    # The word model behind no OpenAI API: the field is not sent on, the turn goes as asked.
    body = {
        "model": MODEL, "messages": user("client weather"), "tools": [WEATHER],
        "parallel_tool_calls": False,
    }  # fmt: skip
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, verify=TLS)
    assert reply.status_code == 200
    (call,) = reply.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    bad = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={**body, "parallel_tool_calls": "no"},
        verify=TLS,
    )
    assert bad.status_code == 400
    assert "'parallel_tool_calls' must be a boolean" in bad.json()["error"]["message"]


def test_a_json_object_format_is_answered_with_a_json_object(server: ServedAgent) -> None:
    client = sdk(server)
    chat = client.chat.completions.create(
        model=MODEL, messages=user("hello"), response_format={"type": "json_object"}
    )
    responded = client.responses.create(
        model=MODEL, input="hello", text={"format": {"type": "json_object"}}
    )
    assert json.loads(chat.choices[0].message.content or "") == {"answer": "hello"}
    assert json.loads(responded.output_text) == {"answer": "hello"}


def test_a_json_object_format_is_openai_s_json_mode_for_its_model() -> None:
    # OpenAI's strict mode refuses a free object: its own JSON mode asks for one; raf
    # still checks the answer is an object (a list is told to the model, once more).
    from tests._harness.openai_server import OpenAIServer

    model = OpenAIServer()
    try:
        with ServedAgent(openai_url=model.base_url) as served:
            model.answer(content='{"city": "Paris", "sunny": true}')
            model.answer(content="[1, 2]")
            model.answer(content='{"n": 2}')
            body = {
                "model": MODEL,
                "messages": user("hi"),
                "response_format": {"type": "json_object"},
            }
            first = httpx.post(f"{served.url}/v1/chat/completions", json=body, verify=TLS)
            second = httpx.post(f"{served.url}/v1/chat/completions", json=body, verify=TLS)
        sent = [request.body for request in model.requests]
    finally:
        model.close()
    assert (first.status_code, second.status_code) == (200, 200)
    assert json.loads(first.json()["choices"][0]["message"]["content"]) == {
        "city": "Paris", "sunny": True,
    }  # fmt: skip
    assert json.loads(second.json()["choices"][0]["message"]["content"]) == {"n": 2}
    assert [b["response_format"] for b in sent] == [{"type": "json_object"}] * 3


def test_a_client_tool_named_like_a_provider_s_tool_is_a_400(
    servers: tuple[ServedAgent, ...],
) -> None:
    # A provider's tools are known only once the run asks it: a 400 then, not a 500.
    url = servers[2].url
    tool = {**WEATHER, "function": {**WEATHER["function"], "name": "lookup"}}  # type: ignore[dict-item]
    chat = {"model": MODEL, "messages": user("hello"), "tools": [tool]}
    flat = {"type": "function", **tool["function"]}
    replies = [
        httpx.post(f"{url}/v1/chat/completions", json=chat, verify=TLS),
        httpx.post(f"{url}/v1/chat/completions", json={**chat, "stream": True}, verify=TLS),
        httpx.post(
            f"{url}/v1/responses", json={"model": MODEL, "input": "hi", "tools": [flat]}, verify=TLS
        ),
    ]
    for reply in replies:
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["code"] == "tool_name_taken"
        assert "'lookup' is named like a tool the agent offers" in reply.json()["error"]["message"]
    fine = httpx.post(f"{url}/v1/chat/completions", json={**chat, "tools": [WEATHER]}, verify=TLS)
    assert fine.status_code == 200


def test_responses_a_function_call_output_that_answers_no_call_is_a_400(
    server: ServedAgent,
) -> None:
    item = {"type": "function_call_output", "call_id": "call-none", "output": "42"}
    stateless = {"model": MODEL, "input": [item], "store": False}
    stored = {"model": MODEL, "input": [item]}
    for body in (stateless, stored):
        reply = httpx.post(f"{server.url}/v1/responses", json=body, verify=TLS)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["code"] == "bad_tool"
        assert "function_call_output answers no call: call_id 'call-none'" in reply.text
    # After a call the model made, its output goes on (by previous_response_id).
    weather = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
    called = httpx.post(
        f"{server.url}/v1/responses",
        json={"model": MODEL, "input": "client weather", "tools": [weather]},
        verify=TLS,
    ).json()
    (call,) = [o for o in called["output"] if o["type"] == "function_call"]
    answer = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    went_on = httpx.post(
        f"{server.url}/v1/responses",
        json={
            "model": MODEL, "input": [answer], "tools": [weather],
            "previous_response_id": called["id"],
        },
        verify=TLS,
    )  # fmt: skip
    assert went_on.status_code == 200, went_on.text
