"""OpenAIChatClient against a real HTTP server on loopback, through the real SDK."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from raf import Agent, AgentRunOptions, ChatMessage, ChatOptions, ToolCall, Usage, tool
from raf.clients.openai import OpenAIChatClient, message_to_wire, tool_to_wire
from raf.errors import (
    AuthenticationError,
    BadRequestError,
    ChatClientError,
    ChatConnectionError,
    ChatTimeoutError,
    RateLimitError,
    ServerError,
)
from raf.middleware import RetryMiddleware
from tests.openai_server import OpenAIServer, Reply, completion

pytestmark = pytest.mark.anyio


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    running = OpenAIServer()
    yield running
    running.close()


def client_for(server: OpenAIServer, **kwargs: Any) -> OpenAIChatClient:
    kwargs.setdefault("max_retries", 0)
    return OpenAIChatClient("test-model", base_url=server.base_url, api_key="sk-test", **kwargs)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_text_answer_maps_messages_usage_and_raw(server: OpenAIServer) -> None:
    server.answer(content="Hello there", usage=(11, 3))
    async with client_for(server) as model:
        response = await model.complete(
            [ChatMessage.system("Be brief."), ChatMessage.user("hi", name="ann")], ChatOptions()
        )
    assert response.text == "Hello there"
    assert response.usage == Usage(11, 3)
    assert response.raw.id == "chatcmpl-test"
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body == {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi", "name": "ann"},
        ],
    }


async def test_tool_call_round_trip_through_an_agent(server: OpenAIServer) -> None:
    server.answer(content=None, tool_calls=[("call_1", "add", '{"a": 2, "b": 3}')])
    server.answer(content="2 + 3 = 5", usage=(20, 4))
    async with client_for(server) as model:
        response = await Agent(model, instructions="Use tools.", tools=[add]).run("2+3?")
    assert response.text == "2 + 3 = 5"
    assert response.usage == Usage(25, 6)
    first, second = (r.body for r in server.requests)
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": add.parameters,
            },
        }
    ]
    assert second["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    assert response.messages[0].tool_calls == (ToolCall("call_1", "add", '{"a": 2, "b": 3}'),)


async def test_run_options_map_to_request_parameters(server: OpenAIServer) -> None:
    server.answer()
    options = AgentRunOptions(
        model="other-model",
        temperature=0.25,
        max_tokens=64,
        tool_choice="add",
        extra={"seed": 7, "top_p": 0.5, "reasoning_effort": "low", "vendor_flag": True},
    )
    async with client_for(server) as model:
        await Agent(model, tools=[add]).run("x", options=options)
    body = server.requests[0].body
    assert body["model"] == "other-model"
    assert body["temperature"] == 0.25
    assert body["max_tokens"] == 64
    assert body["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert body["seed"] == 7
    assert body["top_p"] == 0.5
    assert body["reasoning_effort"] == "low"
    assert body["vendor_flag"] is True


async def test_tool_choice_words_pass_as_they_are(server: OpenAIServer) -> None:
    server.answer()
    async with client_for(server) as model:
        await model.complete([ChatMessage.user("x")], ChatOptions(tool_choice="required"))
    assert server.requests[0].body["tool_choice"] == "required"


@pytest.mark.parametrize(
    ("status", "error_class", "retryable"),
    [
        (400, BadRequestError, False),
        (401, AuthenticationError, False),
        (403, AuthenticationError, False),
        (404, BadRequestError, False),
        (422, BadRequestError, False),
        (408, ChatTimeoutError, True),
        (409, ServerError, True),
        (429, RateLimitError, True),
        (500, ServerError, True),
        (503, ServerError, True),
    ],
)
async def test_http_errors_map_to_chat_client_errors(
    server: OpenAIServer, status: int, error_class: type[ChatClientError], retryable: bool
) -> None:
    server.fail(status, "the server says no")
    async with client_for(server) as model:
        with pytest.raises(error_class) as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    error = caught.value
    assert type(error) is error_class
    assert error.retryable is retryable
    assert error.status_code == status
    assert "the server says no" in str(error)
    assert "test-model" in str(error)
    assert isinstance(error.__cause__, openai.APIStatusError)
    assert error.__cause__.status_code == status
    assert len(server.requests) == 1


async def test_unreachable_server_is_a_retryable_connection_error(
    server: OpenAIServer,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAIChatClient(
        "test-model", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
    )
    async with model:
        with pytest.raises(ChatConnectionError) as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert caught.value.retryable
    assert type(caught.value.__cause__) is openai.APIConnectionError
    assert str(port) in str(caught.value)


async def test_dropped_connection_is_a_connection_error(server: OpenAIServer) -> None:
    server.reply(Reply(drop=True))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError) as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert caught.value.retryable


async def test_client_side_timeout_is_a_retryable_timeout_error(server: OpenAIServer) -> None:
    server.reply(Reply(body=completion(), delay=30))
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k", timeout=0.2, max_retries=0)
    async with sdk, OpenAIChatClient("test-model", client=sdk) as model:
        with pytest.raises(ChatTimeoutError) as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert caught.value.retryable
    assert caught.value.status_code is None
    assert type(caught.value.__cause__) is openai.APITimeoutError


async def test_sdk_retries_a_503_then_succeeds(server: OpenAIServer) -> None:
    server.fail(503, "overloaded")
    server.answer(content="made it")
    async with client_for(server, max_retries=2) as model:
        response = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert response.text == "made it"
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


async def test_sdk_retries_run_out_and_the_last_error_is_mapped(server: OpenAIServer) -> None:
    for _ in range(3):
        server.fail(503, "still overloaded")
    async with client_for(server, max_retries=2) as model:
        with pytest.raises(ServerError, match="still overloaded"):
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert len(server.requests) == 3


async def test_retry_middleware_retries_with_sdk_retries_off(server: OpenAIServer) -> None:
    server.fail(429, "slow down")
    server.answer(content="after the retry")
    async with client_for(server, max_retries=0) as model:
        agent = Agent(model, chat_stack=[RetryMiddleware(attempts=2, wait_initial=0)])
        response = await agent.run("x")
    assert response.text == "after the retry"
    assert len(server.requests) == 2


async def test_environment_variables_give_base_url_and_key(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server.answer(content="env works")
    async with OpenAIChatClient("test-model") as model:
        response = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert response.text == "env works"
    assert server.requests[0].headers["authorization"] == "Bearer sk-from-env"


async def test_explicit_arguments_beat_the_environment(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/nowhere")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    server.answer()
    async with client_for(server) as model:
        await model.complete([ChatMessage.user("x")], ChatOptions())
    assert server.requests[0].headers["authorization"] == "Bearer sk-test"


def test_missing_api_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(AuthenticationError, match="OPENAI_API_KEY") as caught:
        OpenAIChatClient("gpt-4o-mini")
    assert isinstance(caught.value.__cause__, openai.OpenAIError)


def test_bad_constructor_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="model"):
        OpenAIChatClient("", api_key="k")
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIChatClient("m", api_key="k", max_retries=-1)
    sdk = openai.AsyncOpenAI(api_key="k")
    with pytest.raises(ValueError, match="client="):
        OpenAIChatClient("m", client=sdk, api_key="other")


async def test_aclose_closes_its_own_client_but_not_a_given_one(server: OpenAIServer) -> None:
    own = client_for(server)
    async with own:
        pass
    assert own.client.is_closed()
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k")
    given = OpenAIChatClient("test-model", client=sdk)
    await given.aclose()
    assert not sdk.is_closed()
    await sdk.close()


async def test_tool_message_without_call_id_is_refused_before_sending(
    server: OpenAIServer,
) -> None:
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match=r"messages\[1\].*tool_call_id"):
            await model.complete(
                [ChatMessage.user("x"), ChatMessage("tool", "orphan")], ChatOptions()
            )
    assert server.requests == []


async def test_refusal_becomes_the_text(server: OpenAIServer) -> None:
    server.answer(content=None, refusal="I can't help with that.")
    async with client_for(server) as model:
        response = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert response.text == "I can't help with that."


async def test_no_choices_is_an_error(server: OpenAIServer) -> None:
    body = completion()
    body["choices"] = []
    server.answer(body)
    async with client_for(server) as model:
        with pytest.raises(ChatClientError, match="no choices") as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert not caught.value.retryable


async def test_missing_usage_is_none(server: OpenAIServer) -> None:
    server.answer(usage=None)
    async with client_for(server) as model:
        response = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert response.usage is None


def test_wire_format_of_every_role() -> None:
    call = ToolCall("c1", "add", '{"a":1}')
    assert message_to_wire(ChatMessage.assistant("sure", tool_calls=[call])) == {
        "role": "assistant",
        "content": "sure",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}
        ],
    }
    assert message_to_wire(ChatMessage.assistant("plain")) == {
        "role": "assistant",
        "content": "plain",
    }
    # The wire has no name on tool messages; the call id says what they answer.
    assert message_to_wire(ChatMessage.tool("c1", "2", name="add")) == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "2",
    }
    wire = tool_to_wire(add)
    assert json.loads(json.dumps(wire)) == wire


async def test_streaming_through_extra_is_refused_before_sending(server: OpenAIServer) -> None:
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match="'stream'") as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions(extra={"stream": True}))
        with pytest.raises(BadRequestError, match="'extra_body' must be a mapping"):
            await model.complete([ChatMessage.user("x")], ChatOptions(extra={"extra_body": 3}))
    assert not caught.value.retryable
    assert server.requests == []
