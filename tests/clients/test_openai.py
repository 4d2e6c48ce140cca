"""OpenAIChatClient against a real HTTP server on loopback, through the real SDK."""

from __future__ import annotations

import contextlib
import email.utils
import functools
import gc
import gzip
import json
import pickle
import socket
import struct
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatClientError,
    ChatMessage,
    ChatOptions,
    ContextResult,
    OpenAIChatClient,
    OpenAIResponsesClient,
    RetryMiddleware,
    StreamClosedError,
    StreamingChatClient,
    ToolCall,
    Update,
    Usage,
    tool,
)
from raf._clients._sdk import RETRY_AFTER_MAX, retry_after_seconds
from raf._clients.openai import message_to_wire, tool_to_wire
from raf.errors import (
    AuthenticationError,
    BadRequestError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    RateLimitError,
    ServerError,
)
from tests._harness.openai_server import (
    OpenAIServer,
    Reply,
    chunk,
    completion,
    error_body,
    text_stream,
)

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
    import openai

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
    import openai

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
    import openai

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
    import openai

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(AuthenticationError, match="OPENAI_API_KEY") as caught:
        OpenAIChatClient("gpt-4o-mini")
    assert isinstance(caught.value.__cause__, openai.OpenAIError)


def test_an_admin_key_alone_never_signs_a_model_call(
    server: OpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK signs a post() with its admin key when it has no API key; raf's requests are
    # model calls, which the SDK's create() refuses to sign with it.
    monkeypatch.setenv("OPENAI_ADMIN_KEY", "sk-admin-secret")
    for kind in (OpenAIChatClient, OpenAIResponsesClient):
        with pytest.raises(AuthenticationError, match=r"OPENAI_API_KEY\).*OPENAI_ADMIN_KEY"):
            kind("m", base_url=server.base_url)
    assert server.requests == []


def test_bad_constructor_arguments_are_refused() -> None:
    import openai

    with pytest.raises(ValueError, match="model"):
        OpenAIChatClient("", api_key="k")
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIChatClient("m", api_key="k", max_retries=-1)
    sdk = openai.AsyncOpenAI(api_key="k")
    with pytest.raises(ValueError, match="client="):
        OpenAIChatClient("m", client=sdk, api_key="other")


async def test_aclose_closes_its_own_client_but_not_a_given_one(server: OpenAIServer) -> None:
    import openai

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


# --- The wire body: built by raf, not by the SDK's request transform ---------------------


HISTORY = [
    ChatMessage.system("Be brief."),
    ChatMessage.user("hi", name="ann"),
    ChatMessage.assistant("hello"),
    ChatMessage.user("add 2 and 3 — «quickly» 😀"),
    ChatMessage.assistant(None, tool_calls=[ToolCall("c1", "add", '{"a": 2, "b": 3}')]),
    ChatMessage.assistant("both", tool_calls=[ToolCall("c2", "add", "")]),
    ChatMessage.tool("c1", "5"),
    ChatMessage.tool("c2", "", name="add"),
]


async def test_the_body_is_what_the_sdks_create_would_send(server: OpenAIServer) -> None:
    # Differential: the same call through the SDK's own create(), with its transform.
    options = ChatOptions(
        model="other",
        temperature=0.5,
        max_tokens=9,
        tool_choice="add",
        extra={"seed": 3, "vendor_flag": [1, 2], "extra_body": {"top_k": 4}},
        tools=(add,),
    )
    server.checks = False  # the body's form is pinned here, not what OpenAI accepts
    server.answer()
    server.answer()
    async with client_for(server) as model:
        await model.complete(HISTORY, options)
        await model.client.chat.completions.create(
            model="other",
            messages=[message_to_wire(m) for m in HISTORY],  # type: ignore[misc]
            tools=[tool_to_wire(add)],  # type: ignore[list-item]
            temperature=0.5,
            max_tokens=9,
            tool_choice={"type": "function", "function": {"name": "add"}},
            seed=3,
            extra_body={"vendor_flag": [1, 2], "top_k": 4},
        )
    ours, sdks = server.requests
    assert ours.body == sdks.body
    assert ours.headers["content-type"] == "application/json"
    assert ours.headers["authorization"] == sdks.headers["authorization"]


async def test_transport_options_in_extra_go_to_the_sdk(server: OpenAIServer) -> None:
    server.answer()
    extra = {"extra_headers": {"x-team": "raf"}, "extra_query": {"api-version": "1"}, "timeout": 5}
    async with client_for(server) as model:
        await model.complete([ChatMessage.user("x")], ChatOptions(extra=extra))
    (request,) = server.requests
    assert request.headers["x-team"] == "raf"
    assert request.path == "/v1/chat/completions?api-version=1"
    assert set(request.body) == {"model", "messages"}


async def test_bad_extra_options_are_refused_before_sending(server: OpenAIServer) -> None:
    async with client_for(server) as model:
        for extra, match in [
            ({"messages": []}, "'messages' is not allowed"),
            ({"extra_body": {"messages": []}}, "'messages' is not allowed"),
            ({"extra_headers": ["x"]}, "'extra_headers' must be a mapping"),
            ({"seed": object()}, "cannot be sent as JSON"),
            ({"top_p": float("nan")}, "cannot be sent as JSON"),
        ]:
            with pytest.raises(BadRequestError, match=match):
                await model.complete([ChatMessage.user("x")], ChatOptions(extra=extra))
    assert server.requests == []


async def test_a_lone_surrogate_in_a_reply_breaks_nothing(server: OpenAIServer) -> None:
    # json.dumps escapes it as \ud800, as a server would send it.
    server.answer(content="bad \ud800 text")
    server.answer(content="fine")
    async with client_for(server) as model:
        first = await model.complete([ChatMessage.user("x")], ChatOptions())
        assert first.text in ("bad \ud800 text", "bad \ufffd text")
        second = await model.complete([ChatMessage.user("x"), *first.messages], ChatOptions())
    assert second.text == "fine"
    assert server.requests[1].body["messages"][1]["content"] in (
        "bad \ud800 text",
        "bad \ufffd text",
    )


# --- Malformed replies: a ChatProtocolError that names the problem -----------------------


def _reply_with(**message: Any) -> dict[str, Any]:
    body = completion()
    body["choices"][0]["message"] = message
    return body


def _null_message() -> dict[str, Any]:
    body = completion()
    body["choices"][0]["message"] = None
    return body


def _call(**call: Any) -> dict[str, Any]:
    return _reply_with(role="assistant", content=None, tool_calls=[call])


def _finish(reason: Any) -> dict[str, Any]:
    body = completion()
    body["choices"][0]["finish_reason"] = reason
    return body


def _usage(**usage: Any) -> dict[str, Any]:
    body = completion()
    body["usage"] = usage
    return body


MALFORMED: list[tuple[str, Reply, str]] = [
    ("not json", Reply(raw=b"this is not json"), "not JSON"),
    (
        "html",
        Reply(raw=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
        r"not JSON \(text/html.*502 Bad Gateway",
    ),
    ("empty body", Reply(raw=b""), "not JSON"),
    ("a json list", Reply(body=[completion()]), "the reply is a list, not a JSON object"),
    ("a json string", Reply(body="ok"), "the reply is a string, not a JSON object"),
    ("nested deep", Reply(raw=b"[" * 100_000 + b"]" * 100_000), "not JSON"),
    ("an error in a 200", Reply(body={"error": {"message": "quota"}}), "200 with an error.*quota"),
    ("choices missing", Reply(body={"id": "x"}), "choices is missing"),
    ("choices an object", Reply(body={"choices": {}}), "choices is an object, not a list"),
    ("choices empty", Reply(body={**completion(), "choices": []}), "no choices"),
    ("choice a number", Reply(body={**completion(), "choices": [3]}), r"choices\[0\] is a number"),
    ("message null", Reply(body=_null_message()), r"choices\[0\]\.message is null"),
    (
        "content a number",
        Reply(body=_reply_with(role="assistant", content=5)),
        r"content is a number \(5\)",
    ),
    ("content a list", Reply(body=_reply_with(content=["a"])), "content is a list"),
    ("refusal a number", Reply(body=_reply_with(content=None, refusal=1)), "refusal is a number"),
    ("tool_calls an object", Reply(body=_reply_with(tool_calls={})), "tool_calls is an object"),
    ("call a string", Reply(body=_reply_with(tool_calls=["c"])), r"tool_calls\[0\] is a string"),
    (
        "arguments an object",
        Reply(
            body=_call(id="c1", type="function", function={"name": "add", "arguments": {"a": 1}})
        ),
        r"tool_calls\[0\]\.function\.arguments is an object, not a string",
    ),
    (
        "id null",
        Reply(body=_call(id=None, type="function", function={"name": "add", "arguments": "{}"})),
        r"tool_calls\[0\]\.id is null",
    ),
    (
        "name missing",
        Reply(body=_call(id="c1", type="function", function={"arguments": "{}"})),
        r"tool_calls\[0\]\.function\.name is missing",
    ),
    (
        "function null",
        Reply(body=_call(id="c1", type="function", function=None)),
        r"tool_calls\[0\]\.function is null",
    ),
    (
        "a custom tool call",
        Reply(body=_call(id="c1", type="custom", custom={"name": "x", "input": ""})),
        "'custom' tool call; raf supports function tool calls only",
    ),
    ("finish_reason a list", Reply(body=_finish(["length"])), r"finish_reason is a list"),
    ("finish_reason a number", Reply(body=_finish(1)), r"finish_reason is a number \(1\)"),
    ("usage a list", Reply(body={**completion(), "usage": [1]}), "usage is a list"),
    # Keys the SDK's builder takes for its own arguments (was: a raw AttributeError, TypeError).
    (
        "a key of the builder's",
        Reply(body=_reply_with(content="hi", _fields_set=["content"])),
        "cannot be built as the SDK's ChatCompletion",
    ),
    (
        "a mangled key of the builder's",
        Reply(body={**completion(), "_BaseModel__cls": 1}),
        "cannot be built as the SDK's ChatCompletion",
    ),
    (
        "tokens a string",
        Reply(body=_usage(prompt_tokens="5", completion_tokens=1)),
        r"usage\.prompt_tokens is a string",
    ),
    (
        "tokens a float",
        Reply(body=_usage(prompt_tokens=5, completion_tokens=1.5)),
        r"usage\.completion_tokens is a number \(1\.5\)",
    ),
    (
        "tokens a boolean",
        Reply(body=_usage(prompt_tokens=True)),
        r"usage\.prompt_tokens is a boolean",
    ),
    (
        "tokens negative",
        Reply(body=_usage(prompt_tokens=-1)),
        r"usage\.prompt_tokens is a number \(-1\)",
    ),
]


@pytest.mark.parametrize(
    ("reply", "match"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
async def test_a_malformed_reply_is_a_protocol_error_that_names_the_problem(
    server: OpenAIServer, reply: Reply, match: str
) -> None:
    server.reply(reply)
    retry = RetryMiddleware(attempts=3, wait_initial=0)
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match=match) as caught:
            await Agent(model, chat_stack=[retry]).run("x")
    assert isinstance(caught.value, ChatClientError)
    assert not caught.value.retryable
    assert "test-model" in str(caught.value)
    assert len(server.requests) == 1  # not retried


async def test_odd_but_readable_replies_are_accepted(server: OpenAIServer) -> None:
    # What compatible servers do: no id or object, no usage counts, arguments null.
    body = _call(id="c1", function={"name": "add", "arguments": None})
    del body["id"], body["object"]
    body["usage"] = {"prompt_tokens": None}
    server.answer(body)
    async with client_for(server) as model:
        response = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert response.messages[0].tool_calls == (ToolCall("c1", "add", "{}"),)
    assert response.usage == Usage(0, 0)
    assert response.raw.choices[0].message.tool_calls[0].id == "c1"


# --- The whole-call deadline ---------------------------------------------------------------


@pytest.mark.slow
async def test_a_trickling_server_cannot_hold_a_call_past_its_timeout(server: OpenAIServer) -> None:
    # One byte every 0.25 s: each read is quick, so only a whole-call deadline ends it.
    server.reply(Reply(body=completion(), trickle=0.25))
    async with client_for(server, timeout=1.0) as model:
        with (
            anyio.fail_after(20),
            pytest.raises(ChatTimeoutError, match=r"within 1\.0 s") as caught,
        ):
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert caught.value.retryable


@pytest.mark.slow
async def test_the_deadline_covers_the_sdks_retries(server: OpenAIServer) -> None:
    for _ in range(3):
        server.reply(Reply(503, error_body("busy"), headers={"retry-after": "3"}))
    async with client_for(server, timeout=1.0, max_retries=2) as model:
        with anyio.fail_after(20), pytest.raises(ChatTimeoutError, match="retries included"):
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert len(server.requests) == 1


async def test_a_cancellation_from_outside_is_not_a_timeout(server: OpenAIServer) -> None:
    server.reply(Reply(body=completion(), delay=30))
    async with client_for(server, timeout=60) as model:
        with anyio.fail_after(20), anyio.move_on_after(0.3) as scope:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert scope.cancelled_caught


async def test_timeout_none_means_no_deadline(server: OpenAIServer) -> None:
    server.reply(Reply(body=completion(content="slow"), delay=0.2))
    async with client_for(server, timeout=None) as model:
        assert (await model.complete([ChatMessage.user("x")], ChatOptions())).text == "slow"


def test_bad_timeouts_and_bounds_are_refused() -> None:
    for timeout in (0, -1, float("nan"), "5", True):
        with pytest.raises(ValueError, match="timeout"):
            OpenAIChatClient("m", api_key="k", timeout=timeout)  # type: ignore[arg-type]
    for size in (0, 1.5, None):
        with pytest.raises(ValueError, match="max_response_bytes"):
            OpenAIChatClient("m", api_key="k", max_response_bytes=size)  # type: ignore[arg-type]


# --- The size bound ------------------------------------------------------------------------


async def test_a_reply_larger_than_the_bound_is_refused(server: OpenAIServer) -> None:
    big = completion(content="x" * 5000)
    server.answer(big)
    server.reply(Reply(raw=json.dumps(big).encode(), headers={"transfer-encoding": "chunked"}))
    async with client_for(server, max_response_bytes=4096) as model:
        with pytest.raises(ChatProtocolError, match="larger than max_response_bytes=4096"):
            await model.complete([ChatMessage.user("x")], ChatOptions())


@functools.cache
def _gzip_bomb(inflated: int) -> bytes:
    """A gzip stream of ``inflated`` zero bytes (whole MiBs): its header, one compressed MiB
    repeated, its trailer. A full flush resets the compressor, so each MiB after the first
    compresses to the same bytes: deflating them all (2.4 s of CPU) is not needed."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip frame is ours
    block = bytes(1 << 20)
    first = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    blocks = inflated >> 20
    crc = 0
    for _ in range(blocks):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, no time
    trailer = struct.pack("<II", crc, inflated & 0xFFFFFFFF)
    return b"".join([header, first, again * (blocks - 1), packer.flush(), trailer])


@pytest.mark.slow
async def test_a_gzip_bomb_is_not_inflated_whole(server: OpenAIServer) -> None:
    bomb = _gzip_bomb(512 << 20)  # 512 MiB of zeros in about half a megabyte
    assert len(bomb) < 1 << 20
    server.reply(Reply(raw=bomb, headers={"content-encoding": "gzip"}))
    async with client_for(server, max_response_bytes=1 << 20) as model:
        tracemalloc.start()
        try:
            with anyio.fail_after(20), pytest.raises(ChatProtocolError, match="max_response_bytes"):
                await model.complete([ChatMessage.user("x")], ChatOptions())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 64 << 20


async def test_a_gzipped_reply_within_the_bound_is_read(server: OpenAIServer) -> None:
    body = gzip.compress(json.dumps(completion(content="zipped")).encode())
    server.reply(Reply(raw=body, headers={"content-encoding": "gzip"}))
    async with client_for(server) as model:
        response = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert response.text == "zipped"


# httpx raises a decoding error from its outer stream generator and leaves the inner one to
# the garbage collector, which trio reports; the connection itself is closed by raf.
@pytest.mark.filterwarnings("ignore:Async generator 'httpcore2:ResourceWarning")
async def test_a_corrupt_gzip_reply_is_a_protocol_error(server: OpenAIServer) -> None:
    corrupt = gzip.compress(b"{}")[:10] + b"\xff" * 20  # a gzip header, then no valid block
    server.reply(Reply(raw=corrupt, headers={"content-encoding": "gzip"}))
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match="cannot be decompressed"):
            await model.complete([ChatMessage.user("x")], ChatOptions())


async def test_a_connection_cut_mid_reply_is_a_connection_error(server: OpenAIServer) -> None:
    # A content-length promising more than is sent, then the server is stopped.
    server.reply(Reply(body=completion(), trickle=0.05))
    async with client_for(server) as model, anyio.create_task_group() as group:
        group.start_soon(anyio.to_thread.run_sync, _close_soon, server)
        with anyio.fail_after(20), pytest.raises(ChatConnectionError, match="reading the reply"):
            await model.complete([ChatMessage.user("x")], ChatOptions())


def _close_soon(server: OpenAIServer) -> None:
    time.sleep(0.3)
    server.close()


# --- Retry-After ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "soon"}, None),
        ({}, None),
    ],
)
async def test_http_errors_carry_the_servers_retry_after(
    server: OpenAIServer, headers: dict[str, str], expected: float | None
) -> None:
    server.reply(Reply(429, error_body("slow down"), headers=headers))
    async with client_for(server) as model:
        with pytest.raises(RateLimitError) as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert caught.value.retry_after == expected


def test_retry_after_as_an_http_date() -> None:
    now = 1_700_000_000.0
    later = email.utils.formatdate(now + 120, usegmt=True)
    assert retry_after_seconds({"retry-after": later}, now=now) == 120.0
    past = email.utils.formatdate(now - 120, usegmt=True)
    assert retry_after_seconds({"retry-after": past}, now=now) == 0.0
    assert retry_after_seconds({"retry-after": "nan"}) is None


@pytest.mark.parametrize("value", ["inf", "1e999", "Infinity", "1e300"])
def test_a_retry_after_past_the_ceiling_is_clamped(value: str) -> None:
    # An endless ask is a long one: a finite number that logs, sleeps and compares.
    assert retry_after_seconds({"retry-after": value}) == RETRY_AFTER_MAX
    assert retry_after_seconds({"retry-after-ms": value}) == RETRY_AFTER_MAX


async def test_retry_after_inf_from_a_server_is_a_finite_retry_after(server: OpenAIServer) -> None:
    server.reply(Reply(429, error_body("slow down"), headers={"retry-after": "inf"}))
    async with client_for(server) as model:
        with pytest.raises(RateLimitError) as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert caught.value.retry_after == RETRY_AFTER_MAX


@pytest.mark.parametrize(
    "error",
    [
        ChatClientError("x", status_code=500, retry_after=1.5),
        RateLimitError("slow", status_code=429, retry_after=30.0),
        ChatProtocolError("bad reply"),
        ChatTimeoutError("late"),
    ],
)
def test_chat_client_errors_survive_pickling(error: ChatClientError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.status_code, copy.retry_after, copy.retryable) == (
        str(error),
        error.status_code,
        error.retry_after,
        error.retryable,
    )


async def test_retry_middleware_gives_up_when_the_server_asks_for_too_long(
    server: OpenAIServer,
) -> None:
    server.reply(Reply(429, error_body("come back tomorrow"), headers={"retry-after": "100000"}))
    server.answer(content="too early")
    async with client_for(server) as model:
        agent = Agent(model, chat_stack=[RetryMiddleware(attempts=3, wait_max=8.0)])
        with anyio.fail_after(10), pytest.raises(RateLimitError, match="tomorrow") as caught:
            await agent.run("x")
    assert caught.value.retry_after == 100000.0
    assert len(server.requests) == 1


async def test_retry_middleware_waits_what_the_server_asks(server: OpenAIServer) -> None:
    server.reply(Reply(503, error_body("busy"), headers={"retry-after-ms": "300"}))
    server.answer(content="after the wait")
    async with client_for(server) as model:
        agent = Agent(model, chat_stack=[RetryMiddleware(wait_initial=0.001)])
        started = anyio.current_time()
        assert (await agent.run("x")).text == "after the wait"
    assert anyio.current_time() - started >= 0.29


ODD_MESSAGES = [
    ChatMessage.user('lone \ud800 \x00 \u2028 "q" \\ é', name="\udcff"),
    ChatMessage.assistant(None, tool_calls=[ToolCall("\ud800", "n", '{"a": "\\u00e9"}')]),
    ChatMessage.assistant("", tool_calls=[ToolCall("c1", "n", "{}"), ToolCall("c2", "m", "")]),
    ChatMessage.tool("c1", None, name="n"),
    ChatMessage.system(None),
]


async def test_odd_messages_arrive_as_their_wire_form(server: OpenAIServer) -> None:
    # Lone surrogates, control characters and escapes: the body is valid JSON on the wire.
    server.checks = False  # the body's form is pinned here, not what OpenAI accepts
    server.answer()
    async with client_for(server) as model:
        await model.complete(ODD_MESSAGES, ChatOptions())
    (request,) = server.requests
    assert request.body["messages"] == [message_to_wire(m) for m in ODD_MESSAGES]


@pytest.mark.parametrize(("status", "error_class"), [(500, ServerError), (400, BadRequestError)])
async def test_a_gzip_bomb_as_an_error_reply_is_not_inflated_whole(
    server: OpenAIServer, status: int, error_class: type[ChatClientError]
) -> None:
    # The SDK reads error replies whole to quote them: raf's hook reads them first, bounded.
    bomb = _gzip_bomb(512 << 20)
    server.reply(Reply(status, raw=bomb, headers={"content-encoding": "gzip"}))
    async with client_for(server) as model:
        tracemalloc.start()
        try:
            with anyio.fail_after(20), pytest.raises(error_class) as caught:
                await model.complete([ChatMessage.user("x")], ChatOptions())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 64 << 20
    assert len(str(caught.value)) < 2 << 20


async def test_a_compressed_error_reply_is_still_read(server: OpenAIServer) -> None:
    import openai

    body = gzip.compress(json.dumps(error_body("the key is wrong")).encode())
    server.reply(Reply(401, raw=body, headers={"content-encoding": "gzip"}))
    deflated = zlib.compress(b"no such model")
    server.reply(Reply(404, raw=deflated, headers={"content-encoding": "deflate"}))
    server.reply(Reply(503, raw=b"x" * (3 << 20)))  # plain, but long: its start is kept
    async with client_for(server) as model:
        with pytest.raises(AuthenticationError, match="the key is wrong"):
            await model.complete([ChatMessage.user("x")], ChatOptions())
        with pytest.raises(BadRequestError, match="HTTP 404") as not_found:
            await model.complete([ChatMessage.user("x")], ChatOptions())
        with pytest.raises(ServerError, match="HTTP 503") as unavailable:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert isinstance(not_found.value.__cause__, openai.APIStatusError)
    assert not_found.value.__cause__.response.text == "no such model"
    assert isinstance(unavailable.value.__cause__, openai.APIStatusError)
    assert len(unavailable.value.__cause__.response.content) == 1 << 20


@pytest.mark.parametrize("deployment", [None, "my-deployment"])
async def test_an_azure_client_reaches_the_deployment_the_sdk_would(
    server: OpenAIServer, deployment: str | None
) -> None:
    import openai

    root = server.base_url.removesuffix("/v1")
    sdk = openai.AsyncAzureOpenAI(
        azure_endpoint=root,
        azure_deployment=deployment,
        api_key="k",
        api_version="2024-06-01",
        max_retries=0,
    )
    server.answer()
    server.answer()
    async with sdk, OpenAIChatClient("gpt 4o/mini", client=sdk) as model:
        await model.complete([ChatMessage.user("x")], ChatOptions())
        await sdk.chat.completions.create(
            model="gpt 4o/mini", messages=[{"role": "user", "content": "x"}]
        )
    ours, sdks = server.requests
    assert ours.path == sdks.path
    assert "/deployments/" in ours.path
    assert ours.body == sdks.body
    assert ours.headers["api-key"] == "k"


async def test_something_else_than_a_message_is_refused_before_sending(
    server: OpenAIServer,
) -> None:
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match=r"messages\[1\] must be a ChatMessage, got dict"):
            await model.complete(
                [ChatMessage.user("x"), {"role": "user", "content": "y"}],  # type: ignore[list-item]
                ChatOptions(),
            )
    assert server.requests == []


# --- Streaming: stream() over server-sent events ---------------------------------------------


async def collect(model: OpenAIChatClient, options: ChatOptions | None = None) -> list[Update]:
    updates: list[Update] = []
    async with contextlib.aclosing(
        model.stream([ChatMessage.user("x")], options or ChatOptions())
    ) as stream:
        async for update in stream:
            updates.append(update)
    return updates


def call_delta(
    index: int, *, id: str | None = None, name: str | None = None, args: str | None = None
) -> dict[str, Any]:
    delta: dict[str, Any] = {"index": index}
    if id is not None:
        delta |= {"id": id, "type": "function"}
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    if function:
        delta["function"] = function
    return delta


async def test_a_streamed_text_comes_delta_by_delta_and_equals_complete(
    server: OpenAIServer,
) -> None:
    server.reply(Reply(events=text_stream("Hel", "lo ", "there", usage=(11, 3))))
    server.answer(content="Hello there", usage=(11, 3))
    async with client_for(server) as model:
        updates = await collect(model)
        whole = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert [u.text for u in updates if u.kind == "text"] == ["Hel", "lo ", "there"]
    assert updates[-1] == Update.of_usage(Usage(11, 3))
    assert updates[0].raw["object"] == "chat.completion.chunk"
    assert AgentResponse.from_updates(updates) == whole
    assert isinstance(model, StreamingChatClient)
    streamed, plain = (r.body for r in server.requests)
    assert streamed == {**plain, "stream": True, "stream_options": {"include_usage": True}}
    assert list(streamed)[-2:] == ["stream", "stream_options"]


async def test_tool_call_deltas_interleaved_by_index_are_assembled(server: OpenAIServer) -> None:
    events = (
        chunk(None, role="assistant", tool_calls=[call_delta(0, id="c1", name="add", args="")]),
        chunk(tool_calls=[call_delta(1, id="c2", name="add", args='{"a"')]),
        chunk(tool_calls=[call_delta(0, args='{"a": 2,')]),
        chunk(tool_calls=[call_delta(1, args=": 7, "), call_delta(0, args=' "b": 3}')]),
        chunk(tool_calls=[call_delta(1, args='"b": 1}')]),
        chunk(tool_calls=[call_delta(2, id="c3", name="now")]),
        chunk(finish_reason="tool_calls"),
        chunk(usage=(9, 4), choices=False),
    )
    server.reply(Reply(events=events))
    calls = [
        ("c1", "add", '{"a": 2, "b": 3}'),
        ("c2", "add", '{"a": 7, "b": 1}'),
        ("c3", "now", "{}"),
    ]
    server.answer(completion(content=None, tool_calls=calls, usage=(9, 4)))
    async with client_for(server) as model:
        updates = await collect(model)
        whole = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert [u.kind for u in updates] == ["tool_call", "tool_call", "tool_call", "usage"]
    assert [u.tool_call for u in updates[:3]] == [ToolCall(*call) for call in calls]
    assert AgentResponse.from_updates(updates) == whole
    assert whole.messages[0].content is None


async def test_a_server_that_repeats_the_id_and_name_in_every_delta_gets_them_once(
    server: OpenAIServer,
) -> None:
    # Some compatible servers send a call's id, type and name with each of its deltas:
    # they name the call, they are not pieces of it to join.
    events = (
        chunk(None, role="assistant", tool_calls=[call_delta(0, id="c1", name="add", args="")]),
        chunk(tool_calls=[call_delta(0, id="c1", name="add", args='{"a": 2,')]),
        chunk(tool_calls=[call_delta(1, id="c2", name="now", args="")]),
        chunk(tool_calls=[call_delta(0, id="c1", name="add", args=' "b": 3}')]),
        chunk(tool_calls=[call_delta(1, id="c2", name="now")]),
        chunk(finish_reason="tool_calls"),
    )
    server.reply(Reply(events=events))
    async with client_for(server) as model:
        updates = await collect(model)
    assert [u.tool_call for u in updates] == [
        ToolCall("c1", "add", '{"a": 2, "b": 3}'),
        ToolCall("c2", "now", ""),
    ]


async def test_tool_call_deltas_without_an_index_are_placed_by_position(
    server: OpenAIServer,
) -> None:
    def unindexed(**keys: Any) -> dict[str, Any]:
        delta = call_delta(0, **keys)
        del delta["index"]
        return delta

    events = (
        chunk(None, role="assistant", tool_calls=[unindexed(id="c1", name="add", args="{}")]),
        chunk(finish_reason="tool_calls"),
    )
    server.reply(Reply(events=events))
    async with client_for(server) as model:
        updates = await collect(model)
    assert [u.tool_call for u in updates] == [ToolCall("c1", "add", "{}")]


@pytest.mark.parametrize(
    ("events", "body"),
    [
        # An empty answer is "", not None, as in a whole completion.
        (text_stream(), completion(content="")),
        # A refusal with no text is the text.
        (
            (
                chunk(role="assistant"),
                {**chunk(), "choices": [{"index": 0, "delta": {"refusal": "No"}}]},
                chunk(finish_reason="stop"),
            ),
            completion(content=None, refusal="No", usage=None),
        ),
        # Text and a tool call, no usage.
        (
            (
                chunk("Let me", role="assistant"),
                chunk(" see.", tool_calls=[call_delta(0, id="c1", name="add", args="{}")]),
                chunk(finish_reason="tool_calls"),
            ),
            completion(content="Let me see.", tool_calls=[("c1", "add", "{}")], usage=None),
        ),
    ],
)
async def test_odd_streamed_answers_equal_their_completions(
    server: OpenAIServer, events: tuple[Any, ...], body: dict[str, Any]
) -> None:
    server.reply(Reply(events=events))
    server.answer(body)
    async with client_for(server) as model:
        updates = await collect(model)
        whole = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert AgentResponse.from_updates(updates) == whole


async def test_a_stream_through_an_agent_with_tools_equals_the_unstreamed_run(
    server: OpenAIServer,
) -> None:
    turn = (
        chunk(
            None,
            role="assistant",
            tool_calls=[call_delta(0, id="call_1", name="add", args='{"a": 2, ')],
        ),
        chunk(tool_calls=[call_delta(0, args='"b": 3}')]),
        chunk(finish_reason="tool_calls"),
        chunk(usage=(20, 4), choices=False),
    )
    server.reply(Reply(events=turn), Reply(events=text_stream("2 + 3 ", "= 5", usage=(30, 5))))
    server.answer(content=None, tool_calls=[("call_1", "add", '{"a": 2, "b": 3}')], usage=(20, 4))
    server.answer(content="2 + 3 = 5", usage=(30, 5))
    seen: list[Update] = []

    async def on_update(update: Update) -> None:
        seen.append(update)

    async with client_for(server) as model:
        agent = Agent(model, tools=[add])
        streamed = await agent.run("2+3?", on_update=on_update)
        plain = await agent.run("2+3?")
    assert streamed == plain
    assert streamed.text == "2 + 3 = 5"
    assert [u.kind for u in seen] == ["tool_call", "usage", "tool_result", "text", "text", "usage"]


async def test_a_connection_dropped_mid_stream_is_a_connection_error(server: OpenAIServer) -> None:
    server.reply(
        Reply(events=(chunk("Once", role="assistant"), chunk(" upon")), done=False, cut=True)
    )
    got: list[Update] = []

    async def consume(model: OpenAIChatClient) -> None:
        async with contextlib.aclosing(
            model.stream([ChatMessage.user("x")], ChatOptions())
        ) as stream:
            async for update in stream:
                got.append(update)

    async with client_for(server) as model:
        with (
            anyio.fail_after(20),
            pytest.raises(ChatConnectionError, match="reading the reply") as caught,
        ):
            await consume(model)
    assert [u.text for u in got] == ["Once", " upon"]
    assert caught.value.retryable


@pytest.mark.parametrize("done", [True, False])
async def test_a_stream_without_a_finish_reason_is_a_connection_error(
    server: OpenAIServer, done: bool
) -> None:
    # The body ends properly, with or without [DONE], but the model never finished.
    server.reply(Reply(events=(chunk("Once", role="assistant"), chunk(" upon")), done=done))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError, match="no finish_reason"):
            await collect(model)


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        ("{not json", "a chunk is not JSON"),
        ("[1, 2]", "a chunk is a list, not a JSON object"),
        ('{"choices": {}}', "choices is an object, not a list"),
        ('{"choices": [{"index": 0, "delta": "hi"}]}', r"choices\[0\]\.delta is a string"),
        ('{"choices": [{"index": 0, "delta": {"content": 3}}]}', r"delta\.content is a number"),
        (
            '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]}',
            r"index is a string",
        ),
        ('{"choices": [], "usage": {"prompt_tokens": -1}}', r"usage\.prompt_tokens"),
        ('{"choices": [{"delta": {}, "finish_reason": ["stop"]}]}', r"finish_reason is a list"),
        ('{"error": {"message": "overloaded"}}', "sent an error mid-stream: .*overloaded"),
    ],
)
async def test_a_malformed_chunk_is_a_protocol_error(
    server: OpenAIServer, event: str, problem: str
) -> None:
    server.reply(Reply(events=(chunk("Hi", role="assistant"), event, chunk(finish_reason="stop"))))
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match=problem) as caught:
            await collect(model)
    assert not caught.value.retryable


@pytest.mark.parametrize(
    "ending",
    [
        pytest.param((chunk(finish_reason="tool_calls"),), id="no usage"),
        # Was: reading the call for the usage failed, the error passed for one after the
        # finish, and the answer was its text without the call.
        pytest.param(
            (chunk(finish_reason="tool_calls"), chunk(usage=(5, 2), choices=False)),
            id="usage after the finish",
        ),
        pytest.param((chunk(finish_reason="tool_calls", usage=(5, 2)),), id="usage with it"),
    ],
)
async def test_a_tool_call_without_id_or_name_is_a_protocol_error(
    server: OpenAIServer, ending: tuple[Any, ...]
) -> None:
    call = chunk(tool_calls=[call_delta(0, name="add", args="{}")])
    server.reply(Reply(events=(chunk("Hi", role="assistant"), call, *ending)))
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match="index 0 has no id"):
            await collect(model)


@pytest.mark.parametrize(
    ("status", "error_class"),
    [(429, RateLimitError), (500, ServerError), (401, AuthenticationError)],
)
async def test_http_errors_before_the_stream_map_as_for_complete(
    server: OpenAIServer, status: int, error_class: type[ChatClientError]
) -> None:
    server.reply(Reply(status, error_body("scripted"), headers={"retry-after": "2"}))
    async with client_for(server) as model:
        with pytest.raises(error_class, match=f"HTTP {status}") as caught:
            await collect(model)
    assert caught.value.status_code == status
    assert caught.value.retry_after == 2.0


async def test_the_sdks_retries_cover_an_error_before_the_stream(server: OpenAIServer) -> None:
    server.fail(503)
    server.reply(Reply(events=text_stream("fine")))
    async with client_for(server, max_retries=1) as model:
        assert AgentResponse.from_updates(await collect(model)).text == "fine"


async def test_a_server_that_answers_with_a_whole_completion_still_streams(
    server: OpenAIServer,
) -> None:
    server.answer(content="whole", usage=(1, 2))
    async with client_for(server) as model:
        updates = await collect(model)
    assert updates == [Update.of_text("whole"), Update.of_usage(Usage(1, 2))]


async def test_an_early_close_closes_the_http_response(server: OpenAIServer) -> None:
    # A long stream, a chunk every 20 ms: the consumer leaves after two.
    events = (chunk("", role="assistant"), *(chunk(f"{n} ") for n in range(500)))
    server.reply(Reply(events=events, pause=0.02))
    async with client_for(server) as model:
        stream = model.stream([ChatMessage.user("x")], ChatOptions())
        async with contextlib.aclosing(stream):
            async for update in stream:
                if update.text == "1 ":
                    break
        assert await anyio.to_thread.run_sync(server.stream_aborted.wait, 20)


async def test_an_early_close_of_an_agent_stream_closes_the_http_response(
    server: OpenAIServer,
) -> None:
    events = (chunk("", role="assistant"), *(chunk(f"{n} ") for n in range(500)))
    server.reply(Reply(events=events, pause=0.02))
    async with client_for(server) as model:
        async with Agent(model).stream("count") as stream:
            async for update in stream:
                if update.text == "2 ":
                    break
        assert stream.response is None
        assert await anyio.to_thread.run_sync(server.stream_aborted.wait, 20)


async def test_an_agent_stream_reads_chunks_that_arrive_apart(server: OpenAIServer) -> None:
    # Each read waits on the socket, in the consumer's task: the answer is whole.
    events = (chunk("", role="assistant"), *(chunk(f"{n} ") for n in range(5)))
    server.reply(Reply(events=(*events, chunk("", finish_reason="stop")), pause=0.01))
    async with client_for(server) as model:
        with anyio.fail_after(20):
            async with Agent(model).stream("count") as stream:
                seen = [update.text async for update in stream]
    assert seen == ["0 ", "1 ", "2 ", "3 ", "4 "]
    assert stream.response is not None
    assert stream.response.text == "0 1 2 3 4 "


@pytest.mark.slow
async def test_a_cancelled_read_of_an_agent_stream_closes_the_http_response(
    server: OpenAIServer,
) -> None:
    # Was: the cancelled read closed the stream and reading again raised StreamClosedError.
    # Now a cancelled read loses nothing, and leaving the block closes the HTTP response.
    closed: list[BaseException | None] = []

    class Sees:
        async def on_invoking(self, *args: Any) -> ContextResult:
            return ContextResult()

        async def on_invoked(self, *args: Any) -> None:
            closed.append(args[-1])

    events = (chunk("", role="assistant"), chunk("first "), *(chunk("x") for _ in range(50)))
    server.reply(Reply(events=events, pause=0.5))
    async with client_for(server) as model:
        async with Agent(model, stack=[Sees()]).stream("count") as stream:
            first = await stream.__anext__()
            with anyio.move_on_after(0.05):  # the next chunk is 0.5 s away: give up
                await stream.__anext__()
            second = await stream.__anext__()  # the chunk that read gave up on
        assert (first.text, second.text) == ("first ", "x")
        assert isinstance(closed[0], StreamClosedError)
        assert closed[0].partial.text == "first x"
        assert await anyio.to_thread.run_sync(server.stream_aborted.wait, 20)


@pytest.mark.slow
async def test_a_slow_stream_is_held_to_the_idle_timeout(server: OpenAIServer) -> None:
    # #26.14: a stream is bounded by the silence between chunks (idle_timeout), not by
    # timeout, which bounds it only until it starts: a healthy answer may stream longer.
    events = (chunk("", role="assistant"), *(chunk("x") for _ in range(3)))
    server.reply(Reply(events=events, pause=2.0, done=False))
    async with client_for(server, timeout=1.0, idle_timeout=1.0) as model:
        with (
            anyio.fail_after(20),
            pytest.raises(ChatTimeoutError, match=r"for 1\.0 s") as caught,
        ):
            await collect(model)
    assert caught.value.retryable


@pytest.mark.slow
async def test_the_time_a_consumer_holds_an_update_is_not_the_servers(
    server: OpenAIServer,
) -> None:
    server.reply(Reply(events=text_stream("a", "b", "c")))
    async with client_for(server, timeout=0.5) as model:
        stream = model.stream([ChatMessage.user("x")], ChatOptions())
        texts = []
        async with contextlib.aclosing(stream):
            async for update in stream:
                texts.append(update.text)
                await anyio.sleep(0.3)  # 1.5 s in all, three times the timeout
    assert texts == ["a", "b", "c", ""]


async def test_a_cancellation_from_outside_is_not_a_stream_timeout(server: OpenAIServer) -> None:
    server.reply(Reply(events=text_stream("a"), pause=5))
    async with client_for(server, timeout=60) as model:
        with anyio.fail_after(20), anyio.move_on_after(0.3) as scope:
            await collect(model)
    assert scope.cancelled_caught


async def test_a_stream_larger_than_the_bound_is_refused(server: OpenAIServer) -> None:
    server.reply(Reply(events=text_stream(*(["x" * 100] * 100))))
    async with client_for(server, max_response_bytes=4096) as model:
        with pytest.raises(ChatProtocolError, match="larger than max_response_bytes=4096"):
            await collect(model)


async def test_sse_comments_crlf_and_multiline_data_are_read(server: OpenAIServer) -> None:
    first = json.dumps(chunk("Hi", role="assistant"))
    events = (
        b": keep-alive\r\n\r\n",
        f"event: message\r\ndata: {first}\r\n\r\n".encode(),
        b'data: {"choices": [{"index": 0,\ndata: "delta": {"content": " you"}}]}\n\n',
        chunk(finish_reason="stop"),
    )
    server.reply(Reply(events=events))
    async with client_for(server) as model:
        updates = await collect(model)
    assert AgentResponse.from_updates(updates).text == "Hi you"


async def test_sse_fields_with_no_data_and_bare_cr_line_ends_are_read(
    server: OpenAIServer,
) -> None:
    # An event with no data line is none (the standard's rule): a proxy's "retry:" opening
    # the stream, an "event: ping" heartbeat. Lines may end with a bare CR, and a CRLF may
    # be split between two reads.
    first, second = json.dumps(chunk("Hi", role="assistant")), json.dumps(chunk(" there"))
    events = (
        b"retry: 3000\n\n",
        f"id: 1\rdata: {first}\r\r".encode(),
        b"event: ping\r\n",
        b"\r",
        f"\ndata: {second}\r\n\r\n".encode(),
        b"id: 2\n\n",
        chunk(finish_reason="stop"),
    )
    server.reply(Reply(events=events, pause=0.01))
    async with client_for(server) as model:
        updates = await collect(model)
    assert AgentResponse.from_updates(updates).text == "Hi there"


async def test_stream_and_stream_options_in_extra_are_refused(server: OpenAIServer) -> None:
    async with client_for(server) as model:
        with pytest.raises(BadRequestError, match="'stream_options'"):
            await collect(model, ChatOptions(extra={"stream_options": {"x": 1}}))
        server.reply(Reply(events=text_stream("ok")))
        await collect(model, ChatOptions(extra={"stream": False}))
    assert server.requests[0].body["stream"] is True


async def test_retry_middleware_retries_a_stream_only_before_its_first_update(
    server: OpenAIServer,
) -> None:
    server.fail(503)
    server.reply(Reply(events=text_stream("fine")))
    server.reply(Reply(events=(chunk("Once", role="assistant"),), done=False, cut=True))
    server.reply(Reply(events=text_stream("never")))
    texts: list[str] = []

    async def on_update(update: Update) -> None:
        texts.append(update.text)

    async with client_for(server) as model:
        agent = Agent(model, chat_stack=[RetryMiddleware(attempts=3, wait_initial=0)])
        assert (await agent.run("x", on_update=on_update)).text == "fine"
        with pytest.raises(ChatConnectionError):
            await agent.run("x", on_update=on_update)
    assert texts == ["fine", "", "Once"]
    assert len(server.requests) == 3


async def test_an_event_split_across_reads_is_read_whole(server: OpenAIServer) -> None:
    whole = f"data: {json.dumps(chunk('Hello', role='assistant'))}\n\n".encode()
    # The event in three pieces, 50 ms apart: a line cut in two, its end, the blank line.
    pieces = (whole[:9], whole[9:-2], whole[-2:-1], whole[-1:])
    server.reply(Reply(events=(*pieces, chunk(" you"), chunk(finish_reason="stop")), pause=0.05))
    async with client_for(server) as model:
        updates = await collect(model)
    assert [u.text for u in updates] == ["Hello", " you"]


async def test_a_stream_cut_inside_its_last_event_is_a_connection_error(
    server: OpenAIServer,
) -> None:
    # The finish chunk's event never ends (no blank line): the answer is not complete.
    finish = json.dumps(chunk(finish_reason="stop"))
    events = (chunk("Hi", role="assistant"), f"data: {finish}".encode())
    server.reply(Reply(events=events, done=False))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError, match="no finish_reason"):
            await collect(model)


async def test_invalid_utf8_in_a_stream_is_replaced_as_in_a_reply(server: OpenAIServer) -> None:
    # Was: a ChatProtocolError raised by the SDK's decoder, above the HTTP stack's readers,
    # which it left to the garbage collector (a ResourceWarning on trio).
    def piece(content: bytes) -> bytes:
        return b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n' % content

    split = piece("caf\u00e9".encode())
    at = split.index(b"\xa9")
    events = (piece(b"bad \xff"), split[:at], split[at:], chunk(finish_reason="stop"))
    server.reply(Reply(events=events, pause=0.01))  # a character split across two reads
    server.reply(Reply(raw=b'{"choices": [{"message": {"content": "bad \xffcaf\xc3\xa9"}}]}'))
    async with client_for(server) as model:
        updates = await collect(model)
        gc.collect()  # no ResourceWarning (filterwarnings=error): every reader was closed
        whole = await model.complete([ChatMessage.user("x")], ChatOptions())
    assert [u.text for u in updates] == ["bad \ufffd", "caf\u00e9"]
    assert AgentResponse.from_updates(updates).text == whole.text
