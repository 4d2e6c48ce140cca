"""OpenAIResponsesClient against a real HTTP server on loopback, through the real SDK."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatClientError,
    ChatMessage,
    ChatOptions,
    HistoryProvider,
    LoggingMiddleware,
    OpenAIResponsesClient,
    Reasoning,
    RedisSessionStore,
    RetryMiddleware,
    SqliteSessionStore,
    ToolCall,
    Update,
    Usage,
    tool,
)
from raf._clients.responses import input_items, tool_to_wire
from raf.errors import (
    AuthenticationError,
    BadRequestError,
    ChatConnectionError,
    ChatProtocolError,
    ChatTimeoutError,
    RateLimitError,
    ServerError,
)
from tests._harness.openai_server import HISTORY_EDITS, edit_history
from tests._harness.redis_server import RedisServer
from tests._harness.responses_server import Answer, ResponsesServer, events_of, response_body

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ResponsesServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    running = ResponsesServer()
    yield running
    running.close()


def client_for(server: ResponsesServer, **kwargs: Any) -> OpenAIResponsesClient:
    kwargs.setdefault("max_retries", 0)
    return OpenAIResponsesClient(
        "test-model", base_url=server.base_url, api_key="sk-test", **kwargs
    )


async def collect(
    model: OpenAIResponsesClient, messages: list[ChatMessage], seen: list[Update] | None = None
) -> list[Update]:
    """The updates of one streamed call, also appended to ``seen`` as they come."""
    updates = [] if seen is None else seen
    async for update in model.stream(messages, ChatOptions()):
        updates.append(update)
    return updates


async def call(model: OpenAIResponsesClient, streamed: bool) -> AgentResponse:
    """One call with one user message: streamed and assembled, or not."""
    messages = [ChatMessage.user("x")]
    if streamed:
        return AgentResponse.from_updates(await collect(model, messages))
    return await model.complete(messages, ChatOptions())


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


async def test_plain_answer_maps_messages_usage_and_raw(server: ResponsesServer) -> None:
    server.answer(text="Hello there", usage=(11, 3), cached=8, reasoning_tokens=2)
    async with client_for(server) as model:
        response = await model.complete(
            [ChatMessage.system("Be brief."), ChatMessage.user("hi", name="ann")], ChatOptions()
        )
    assert response.text == "Hello there"
    assert response.usage == Usage(11, 3, cached_input_tokens=8, reasoning_tokens=2)
    assert response.raw.id == "resp_test"
    (request,) = server.requests
    assert request.path == "/v1/responses"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.body == {
        "model": "test-model",
        "input": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }


@pytest.mark.parametrize(
    "body",
    [
        response_body("one two three", usage=(4, 3)),
        response_body(None, calls=[("c1", "add", '{"a": 1, "b": 2}'), ("c2", "add", "{}")]),
        response_body("Let me add.", calls=[("c1", "add", '{"a": 1}')], reasoning="rs_1"),
        response_body("", usage=None),
    ],
)
async def test_a_streamed_answer_assembles_to_what_complete_returns(
    server: ResponsesServer, body: dict[str, Any]
) -> None:
    server.answer(body)
    server.answer(body)
    async with client_for(server) as model:
        whole = await model.complete([ChatMessage.user("x")], ChatOptions())
        updates = await collect(model, [ChatMessage.user("x")])
    assert AgentResponse.from_updates(updates) == whole
    assert server.requests[1].body["stream"] is True
    assert "stream" not in server.requests[0].body


async def test_text_arrives_in_deltas_and_calls_once_complete(server: ResponsesServer) -> None:
    server.answer(text="Let me add.", calls=[("c1", "add", '{"a": 1, "b": 2}')], usage=(7, 5))
    async with client_for(server) as model:
        updates = await collect(model, [ChatMessage.user("x")])
    assert updates == [
        Update.of_text("Let "),
        Update.of_text("me "),
        Update.of_text("add."),
        Update.of_tool_call(ToolCall("c1", "add", '{"a": 1, "b": 2}')),
        Update.of_usage(Usage(7, 5)),
    ]
    assert updates[0].raw["type"] == "response.output_text.delta"
    assert updates[3].raw["type"] == "response.output_item.done"  # before response.completed


def _replays(reasoning_id: str) -> Any:
    """What a real server checks with store=False: the reasoning item, with its
    encrypted content, right before the call it led to."""

    def check(body: Any) -> str | None:
        items = body["input"]
        kinds = [item.get("type", "message") for item in items]
        if "reasoning" not in kinds:
            return "the reasoning item of the previous reply is missing"
        index = kinds.index("reasoning")
        item = items[index]
        if (
            item["id"] != reasoning_id
            or item["encrypted_content"] != f"gAAAA-{reasoning_id}-secret"
        ):
            return f"a reasoning item that is not {reasoning_id}: {item}"
        if kinds[index + 1] != "function_call":
            return "a reasoning item without its required following item"
        return None

    return check


@pytest.mark.parametrize("streamed", [False, True])
async def test_tool_loop_round_trip_replays_the_reasoning(
    server: ResponsesServer, streamed: bool
) -> None:
    server.answer(text=None, calls=[("call_1", "add", '{"a": 2, "b": 3}')], reasoning="rs_1")
    server.reply(Answer(body=response_body("2 + 3 = 5", usage=(20, 4)), require=_replays("rs_1")))
    async with client_for(server) as model:
        agent = Agent(model, instructions="Use tools.", tools=[add])
        if streamed:
            seen: list[Update] = []

            async def keep(update: Update) -> None:
                seen.append(update)

            response = await agent.run("2+3?", on_update=keep)
            assert [u.kind for u in seen].count("tool_result") == 1
        else:
            response = await agent.run("2+3?")
    assert response.text == "2 + 3 = 5"
    assert response.usage == Usage(25, 6)
    first, second = (r.body for r in server.requests)
    assert first["tools"] == [
        {
            "type": "function",
            "name": "add",
            "description": "Add two numbers.",
            "parameters": add.parameters,
            "strict": False,
        }
    ]
    assert second["input"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "2+3?"},
        response_body(None, calls=[], reasoning="rs_1")["output"][0],
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]
    assert second["include"] == ["reasoning.encrypted_content"]


@pytest.mark.parametrize("store", ["sqlite", "redis"])
async def test_reasoning_survives_a_session_store_round_trip_into_a_new_client(
    server: ResponsesServer, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server.answer(text=None, calls=[("call_1", "add", '{"a": 2, "b": 3}')], reasoning="rs_1")
    server.answer(text="5")
    server.reply(Answer(body=response_body("again"), require=_replays("rs_1")))

    def opened() -> Any:
        if store == "sqlite":
            return SqliteSessionStore(tmp_path / "s.db")
        redis: RedisServer = request.getfixturevalue("redis_server")
        return RedisSessionStore(redis.url, prefix=f"t{id(tmp_path)}")

    for question in ("2+3?", "and now?"):
        # A new client, agent and connection each turn: the reasoning is only in the store.
        agent = Agent(client_for(server), tools=[add], stack=[HistoryProvider()])
        async with agent, opened() as sessions:
            await agent.run(question, session=await sessions.get("s"))
    item = response_body(None, calls=[], reasoning="rs_1")["output"][0]
    assert server.requests[2].body["input"][1] == item
    assert json.dumps(item, separators=(",", ":")).encode() in server.requests[2].raw


def test_reasoning_of_another_source_is_left_out() -> None:
    call = ToolCall("c1", "add", "{}")
    thinking = Reasoning("anthropic", json.dumps([{"type": "thinking", "signature": "s"}]))
    message = ChatMessage.assistant(None, tool_calls=[call], reasoning=thinking)
    assert input_items([message]) == [
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"}
    ]


async def test_reasoning_keeps_its_place_and_an_edited_turn_has_none(
    server: ResponsesServer,
) -> None:
    server.answer(text="Checking.", calls=[("c1", "add", "{}")], reasoning="rs_9")
    async with client_for(server) as model:
        turn = (await model.complete([ChatMessage.user("x")], ChatOptions())).messages[0]
        replayed = input_items([turn])
        reasoning = turn.reasoning
        edited = input_items(
            [
                ChatMessage.assistant(
                    "Other.", tool_calls=[ToolCall("c1", "add")], reasoning=reasoning
                )
            ]
        )
        other_calls = input_items(
            [ChatMessage.assistant(None, tool_calls=[ToolCall("c9", "add")], reasoning=reasoning)]
        )
    assert [item.get("type", "message") for item in replayed] == [
        "reasoning",
        "message",
        "function_call",
    ]
    assert replayed[1] == {"role": "assistant", "content": "Checking."}
    # Same calls, other text: the reply's order still holds, with today's text.
    assert [item.get("type", "message") for item in edited] == [
        "reasoning",
        "message",
        "function_call",
    ]
    assert reasoning is not None
    assert reasoning.source == "openai.responses"
    other = input_items([ChatMessage.assistant(None, tool_calls=[ToolCall("c9", "add")])])
    assert other == [{"type": "function_call", "call_id": "c9", "name": "add", "arguments": "{}"}]
    assert other_calls == other  # the calls changed: the reasoning is not theirs


async def test_store_true_asks_for_no_encrypted_reasoning(server: ResponsesServer) -> None:
    server.answer()
    async with client_for(server, store=True) as model:
        await model.complete([ChatMessage.user("x")], ChatOptions())
    body = server.requests[0].body
    assert body["store"] is True
    assert "include" not in body


async def test_run_options_map_to_request_parameters(server: ResponsesServer) -> None:
    server.answer()
    options = AgentRunOptions(
        model="other-model",
        temperature=0.25,
        max_tokens=64,
        tool_choice="add",
        extra={
            "reasoning": {"effort": "low"},
            "include": ["message.output_text.logprobs"],
            "extra_headers": {"x-team": "raf"},
            "extra_body": {"top_k": 4},
        },
    )
    async with client_for(server) as model:
        await Agent(model, tools=[add]).run("x", options=options)
    (request,) = server.requests
    body = request.body
    assert body["model"] == "other-model"
    assert body["temperature"] == 0.25
    assert body["max_output_tokens"] == 64
    assert "max_tokens" not in body
    assert body["tool_choice"] == {"type": "function", "name": "add"}
    assert body["reasoning"] == {"effort": "low"}
    assert body["include"] == ["reasoning.encrypted_content", "message.output_text.logprobs"]
    assert body["top_k"] == 4
    assert request.headers["x-team"] == "raf"


async def test_the_body_is_what_the_sdks_create_would_send(server: ResponsesServer) -> None:
    history = [
        ChatMessage.system("Be brief."),
        ChatMessage.user("add 2 and 3 — «quickly» 😀"),
        ChatMessage.assistant("sure", tool_calls=[ToolCall("c1", "add", '{"a": 2, "b": 3}')]),
        ChatMessage.tool("c1", "5"),
        ChatMessage.assistant("5"),
    ]
    options = ChatOptions(
        temperature=0.5,
        max_tokens=9,
        tool_choice="required",
        tools=(add,),
        extra={"reasoning": {"effort": "low"}, "top_p": 0.5, "extra_body": {"top_k": 4}},
    )
    for _ in range(4):
        server.answer()
    async with client_for(server) as model:
        await model.complete(history, options)
        await model.complete(history, options)
        for stream in (None, True):
            await model.client.responses.create(  # type: ignore[call-overload]
                model="test-model",
                input=input_items(history),
                tools=[tool_to_wire(add)],
                temperature=0.5,
                max_output_tokens=9,
                tool_choice="required",
                reasoning={"effort": "low"},
                top_p=0.5,
                store=False,
                include=["reasoning.encrypted_content"],
                extra_body={"top_k": 4},
                **({} if stream is None else {"stream": True}),
            )
        _, streamed, _ = model.request_body(history, options, stream=True)
    ours, again, sdks, sdk_streamed = server.requests
    assert ours.body == again.body == sdks.body
    assert streamed == sdk_streamed.body
    assert ours.path == sdks.path


# --- The body over a changing conversation ----------------------------------------------

# Text with no lone surrogate: the SDK cannot send one.
sdk_text = st.text(st.characters(categories=["L", "N", "P", "S", "Z", "Cc"]), max_size=6)


def messages_of(text: st.SearchStrategy[str]) -> st.SearchStrategy[ChatMessage]:
    """Any message the client can send, its texts drawn from ``text``."""
    maybe = st.none() | text
    calls = st.lists(st.builds(ToolCall, text, text, text), min_size=1, max_size=2)
    return st.one_of(
        st.builds(ChatMessage, st.sampled_from(["system", "user", "assistant"]), maybe, name=maybe),
        st.builds(ChatMessage.assistant, maybe, tool_calls=calls),
        st.builds(ChatMessage, st.just("tool"), maybe, tool_call_id=text, name=maybe),
    )


def expected_body(model: OpenAIResponsesClient, messages: list[ChatMessage]) -> dict[str, Any]:
    """The body of a plain call: :func:`input_items`, the reasoning the messages carry."""
    return {
        "model": model.model,
        "include": ["reasoning.encrypted_content"],
        "input": input_items(messages),
        "store": False,
    }


# Steps of a random conversation as the client sees it: what changes between two calls.
# "call c1" is a reply that calls tools with reasoning, its first call's id c1: ids repeat,
# so a later reply can take the key of a turn already in the history. Five steps reach every
# kind of message and edit; each step's SDK call walks the whole history through the SDK's
# typed transform, so a longer conversation costs its square and adds no new case.
call_steps = st.lists(
    st.sampled_from(["call c1", "call c2", *HISTORY_EDITS]),
    min_size=1,
    max_size=5,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(call_steps, st.lists(messages_of(sdk_text), min_size=1, max_size=5))
@pytest.mark.slow
async def test_bodies_over_a_changing_conversation_are_the_sdks(
    server: ResponsesServer, steps: list[str], pool: list[ChatMessage]
) -> None:
    messages: list[ChatMessage] = [ChatMessage.system("rules"), *pool]
    # The body's form is pinned here (a history cut anywhere), not what the API accepts.
    server.checks = False
    async with client_for(server) as model:
        for n, step in enumerate(steps):
            if step.startswith("call"):
                key = step.split()[1]
                server.answer(
                    text=None if n % 2 else f"thinking {n}",
                    calls=[(key, "add", f'{{"a": {n}}}'), (f"x{n}", "add", "{}")][: n % 2 + 1],
                    reasoning=f"rs_{n}",
                )
            messages = edit_history(step, n, messages, pool)
            if not step.startswith("call"):
                server.answer()
            sent = tuple(messages) if n % 2 else list(messages)
            expected = expected_body(model, messages)
            items = input_items(messages)
            response = await model.complete(sent, ChatOptions())
            assert server.requests[-1].body == expected
            server.answer()
            await model.client.responses.create(
                model="test-model",
                input=items,  # type: ignore[arg-type]
                store=False,
                include=["reasoning.encrypted_content"],
            )
            assert server.requests[-1].body == expected
            messages.append(response.messages[0])
            messages += [ChatMessage.tool(c.id, "5") for c in response.messages[0].tool_calls]


async def test_replayed_reasoning_follows_its_turn_when_a_later_reply_takes_its_key(
    server: ResponsesServer,
) -> None:
    server.answer(text=None, calls=[("c1", "add", "{}")], reasoning="rs_1")
    for _ in range(3):
        server.answer()
    server.answer(text=None, calls=[("c1", "add", '{"a": 1}')], reasoning="rs_2")
    server.answer()
    async with client_for(server) as model:
        history = [ChatMessage.user(f"q{n}") for n in range(100)]
        reply = (await model.complete(history, ChatOptions())).messages[0]
        history += [reply, ChatMessage.tool("c1", "1")]
        for _ in range(2):
            history.append(ChatMessage.user("again"))
            await model.complete(history, ChatOptions())
            assert server.requests[-1].body == expected_body(model, history)
            assert b"rs_1" in server.requests[-1].raw
        history.append(ChatMessage.user("more"))
        await model.complete(history, ChatOptions())
        # A later reply takes the key c1 (ids repeat): the earlier turn gets the reasoning
        # of the later one's calls only if they are its own.
        other = await model.complete([ChatMessage.user("other")], ChatOptions())
        assert other.messages[0].tool_calls[0].id == "c1"
        history.append(ChatMessage.user("last"))
        await model.complete(history, ChatOptions())
    assert server.requests[-1].body == expected_body(model, history)
    # The reasoning lives on its turn: a later reply with the same call id changes nothing.
    assert b"rs_1" in server.requests[-1].raw
    assert b"rs_2" not in server.requests[-1].raw


async def test_every_turn_of_a_long_loop_replays_its_own_reasoning(
    server: ResponsesServer,
) -> None:
    history: list[ChatMessage] = [ChatMessage.user("x")]
    async with client_for(server) as model:
        for n in range(5):
            server.answer(text=None, calls=[(f"c{n}", "add", "{}")], reasoning=f"rs_{n}")
            expected = expected_body(model, history)
            reply = (await model.complete(history, ChatOptions())).messages[0]
            assert server.requests[-1].body == expected
            history += [reply, ChatMessage.tool(f"c{n}", "5")]
        server.answer()
        expected = expected_body(model, history)
        await model.complete(history, ChatOptions())
    assert server.requests[-1].body == expected
    assert all(f"gAAAA-rs_{n}-secret".encode() in server.requests[-1].raw for n in range(5))


async def test_bad_input_is_refused_before_sending(server: ResponsesServer) -> None:
    async with client_for(server) as model:
        for messages, extra, match in [
            ([ChatMessage("tool", "orphan")], {}, r"messages\[0\].*tool_call_id"),
            ([{"role": "user"}], {}, r"messages\[0\] must be a ChatMessage"),
            ([ChatMessage.user("x")], {"input": []}, "'input' is not allowed"),
            ([ChatMessage.user("x")], {"stream": True}, "'stream' is not allowed"),
            ([ChatMessage.user("x")], {"extra_body": 3}, "must be a mapping"),
            ([ChatMessage.user("x")], {"include": "all"}, "'include' must be a list"),
            ([ChatMessage.user("x")], {"top_p": float("nan")}, "cannot be sent as JSON"),
        ]:
            with pytest.raises(BadRequestError, match=match):
                await model.complete(messages, ChatOptions(extra=extra))  # type: ignore[arg-type]
    assert server.requests == []


# --- Errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    ("status", "error_class", "retryable"),
    [
        (400, BadRequestError, False),
        (401, AuthenticationError, False),
        (403, AuthenticationError, False),
        (404, BadRequestError, False),
        (408, ChatTimeoutError, True),
        (409, ServerError, True),
        (429, RateLimitError, True),
        (500, ServerError, True),
        (503, ServerError, True),
    ],
)
async def test_http_errors_map_to_chat_client_errors(
    server: ResponsesServer,
    status: int,
    error_class: type[ChatClientError],
    retryable: bool,
    streamed: bool,
) -> None:
    import openai

    server.fail(status, "the server says no")
    async with client_for(server) as model:
        with pytest.raises(error_class) as caught:
            await call(model, streamed)
    error = caught.value
    assert type(error) is error_class
    assert error.retryable is retryable
    assert error.status_code == status
    assert "the server says no" in str(error)
    assert str(error).startswith("OpenAI response (model 'test-model')")
    assert isinstance(error.__cause__, openai.APIStatusError)
    if status == 429:
        assert error.retry_after == 0.001


@pytest.mark.parametrize("streamed", [False, True])
async def test_unreachable_and_dropped_are_connection_errors(
    server: ResponsesServer, streamed: bool
) -> None:
    import openai

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server.reply(Answer(drop=True))
    async with (
        OpenAIResponsesClient(
            "m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0
        ) as nowhere,
        client_for(server) as model,
    ):
        for client in (nowhere, model):
            with pytest.raises(ChatConnectionError) as caught:
                await call(client, streamed)
            assert caught.value.retryable
            assert type(caught.value.__cause__) is openai.APIConnectionError


@pytest.mark.parametrize("streamed", [False, True])
async def test_the_whole_call_timeout_is_a_retryable_timeout(
    server: ResponsesServer, streamed: bool
) -> None:
    server.reply(Answer(body=response_body(), delay=30))
    async with client_for(server, timeout=0.3) as model:
        with anyio.fail_after(20), pytest.raises(ChatTimeoutError, match=r"within 0\.3 s") as e:
            await call(model, streamed)
    assert e.value.retryable


async def test_a_stream_without_a_terminal_event_is_a_connection_error(
    server: ResponsesServer,
) -> None:
    server.reply(Answer(events=events_of(response_body("a b c"), terminal=False)))
    async with client_for(server) as model:
        with pytest.raises(ChatConnectionError, match=r"ended before response\.completed"):
            await collect(model, [ChatMessage.user("x")])


async def test_a_stream_stalled_mid_way_times_out(server: ResponsesServer) -> None:
    server.reply(Answer(body=response_body("one two three"), stall_after=3))
    async with client_for(server, timeout=0.5, idle_timeout=0.5) as model:
        seen: list[Update] = []
        with anyio.fail_after(20), pytest.raises(ChatTimeoutError, match="of waiting"):
            await collect(model, [ChatMessage.user("x")], seen)
    assert [u.text for u in seen] == ["one "]


@pytest.mark.slow
async def test_a_stream_kept_open_after_completed_is_still_an_answer(
    server: ResponsesServer,
) -> None:
    events = [*events_of(response_body("done here")), {"type": "response.keepalive"}]
    server.reply(Answer(events=events, stall_after=len(events) - 1))
    server.answer(text="next")
    async with client_for(server, timeout=60) as model:
        with anyio.fail_after(20):
            updates = await collect(model, [ChatMessage.user("x")])
            assert AgentResponse.from_updates(updates).text == "done here"
            assert (await model.complete([ChatMessage.user("x")], ChatOptions())).text == "next"


@pytest.mark.slow
async def test_the_consumers_time_is_not_the_servers(server: ResponsesServer) -> None:
    # The timeout bounds waiting on the server: a slow consumer does not use it up.
    server.answer(text="one two three four five")
    async with client_for(server, timeout=1.5) as model:
        texts = []
        async for update in model.stream([ChatMessage.user("x")], ChatOptions()):
            texts.append(update.text)
            await anyio.sleep(0.5)
    assert "".join(texts) == "one two three four five"


MALFORMED: list[tuple[Answer, str]] = [
    (Answer(raw=b"this is not json"), "not JSON"),
    (Answer(body=[1]), "a list, not a JSON object"),
    (Answer(body={"id": "x", "status": "completed"}), "output is missing"),
    (Answer(body={"output": [3]}), r"output\[0\] is a number"),
    (
        Answer(body={"output": [{"type": "function_call", "call_id": None, "name": "f"}]}),
        r"output\[0\]\.call_id is null",
    ),
    (
        Answer(body={"output": [{"type": "message", "content": [{"type": "output_text"}]}]}),
        r"content\[0\]\.text is missing",
    ),
    (Answer(body={**response_body(), "usage": {"input_tokens": -1}}), "usage.input_tokens"),
    # Keys the SDK's builder takes for its own arguments (was: a raw AttributeError).
    (Answer(body={**response_body(), "_fields_set": 1}), "cannot be built as the SDK's Response"),
]


@pytest.mark.parametrize(("answer", "match"), MALFORMED)
async def test_malformed_replies_are_protocol_errors(
    server: ResponsesServer, answer: Answer, match: str
) -> None:
    server.reply(answer)
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match=match) as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert not caught.value.retryable


async def test_a_reply_larger_than_the_bound_is_refused(server: ResponsesServer) -> None:
    big = response_body("x" * 5000)
    server.answer(big)
    server.answer(big)
    async with client_for(server, max_response_bytes=4096) as model:
        with pytest.raises(ChatProtocolError, match="max_response_bytes=4096"):
            await model.complete([ChatMessage.user("x")], ChatOptions())
        with pytest.raises(ChatProtocolError, match="max_response_bytes=4096"):
            await collect(model, [ChatMessage.user("x")])


# --- Stream endings -------------------------------------------------------------------------


async def test_a_stream_dropped_mid_way_is_a_connection_error(server: ResponsesServer) -> None:
    server.reply(Answer(body=response_body("one two three four"), drop_after=4))
    async with client_for(server) as model:
        seen: list[Update] = []
        with anyio.fail_after(20), pytest.raises(ChatConnectionError) as caught:
            await collect(model, [ChatMessage.user("x")], seen)
    assert caught.value.retryable
    assert [u.text for u in seen] == ["one ", "two "]


@pytest.mark.parametrize(
    ("events", "match"),
    [
        (
            [
                {"type": "response.output_text.delta", "delta": "par"},
                {
                    "type": "response.failed",
                    "response": {
                        "status": "failed",
                        "error": {"code": "server_error", "message": "the model broke"},
                    },
                },
            ],
            r"failed \(server_error\): the model broke",
        ),
        (
            [
                {
                    "type": "response.incomplete",
                    "response": {
                        "status": "incomplete",
                        "incomplete_details": {"reason": "max_output_tokens"},
                    },
                }
            ],
            r"incomplete \(max_output_tokens\)",
        ),
        (
            [{"type": "error", "code": "rate_limit_exceeded", "message": "slow", "param": None}],
            r"error event \(rate_limit_exceeded\): slow",
        ),
    ],
)
async def test_failed_incomplete_and_error_events_are_not_retryable(
    server: ResponsesServer, events: list[dict[str, Any]], match: str
) -> None:
    server.reply(Answer(events=events))
    async with client_for(server) as model:
        with pytest.raises(ChatClientError, match=match) as caught:
            await collect(model, [ChatMessage.user("x")])
    assert not caught.value.retryable


async def test_an_incomplete_reply_to_complete_is_the_same_error(server: ResponsesServer) -> None:
    body = response_body("cut sh", status="incomplete")
    body["incomplete_details"] = {"reason": "max_output_tokens"}
    server.answer(body)
    async with client_for(server) as model:
        with pytest.raises(ChatClientError, match="incomplete") as caught:
            await model.complete([ChatMessage.user("x")], ChatOptions())
    assert not caught.value.retryable


async def test_a_json_answer_to_a_stream_request_is_a_protocol_error(
    server: ResponsesServer,
) -> None:
    server.reply(Answer(status=200, raw=b'{"output": []}', content_type="application/json"))
    async with client_for(server) as model:
        with pytest.raises(ChatProtocolError, match="not an event stream"):
            await collect(model, [ChatMessage.user("x")])


async def test_early_close_releases_the_connection(server: ResponsesServer) -> None:
    server.answer(text="Once upon a time there was a model")
    server.answer(text="again")
    async with client_for(server) as model:
        agent = Agent(model)
        async with agent.stream("story") as stream:
            async for update in stream:
                if update.text == "upon ":
                    break
        assert stream.response is None
        # The client still works: the connection went back or was closed.
        with anyio.fail_after(20):
            assert (await agent.run("again")).text == "again"


async def test_a_cancellation_from_outside_mid_stream_is_not_a_timeout(
    server: ResponsesServer,
) -> None:
    server.reply(Answer(body=response_body("one two three"), stall_after=3))
    server.answer(text="still fine")
    async with client_for(server, timeout=60) as model:
        agent = Agent(model)
        with anyio.fail_after(20), anyio.move_on_after(0.5) as scope:
            await agent.run("x", on_update=_ignore)
        assert scope.cancelled_caught
        assert (await agent.run("again")).text == "still fine"


async def _ignore(update: Update) -> None:
    pass


# --- Middleware -----------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
async def test_retry_and_logging_middleware_in_the_chat_stack(
    server: ResponsesServer, streamed: bool
) -> None:
    server.fail(429, "slow down")
    server.answer(text="after the retry")
    async with client_for(server) as model:
        agent = Agent(
            model,
            chat_stack=[LoggingMiddleware(), RetryMiddleware(attempts=2, wait_initial=0)],
        )
        with structlog.testing.capture_logs() as logs:
            if streamed:
                updates: list[Update] = []

                async def keep(update: Update) -> None:
                    updates.append(update)

                response = await agent.run("x", on_update=keep)
                assert "".join(u.text for u in updates) == "after the retry"
            else:
                response = await agent.run("x")
    assert response.text == "after the retry"
    assert len(server.requests) == 2
    assert any(entry.get("output_tokens") == 2 for entry in logs)


async def test_a_stream_error_is_retried_by_the_middleware(server: ResponsesServer) -> None:
    """Dropped before its first text delta: nothing was sent onward, so it is retried."""
    server.reply(Answer(body=response_body("lost"), drop_after=2))
    server.answer(text="made it")
    async with client_for(server) as model:
        agent = Agent(model, chat_stack=[RetryMiddleware(attempts=2, wait_initial=0)])
        async with agent.stream("x") as stream:
            texts = [update.text async for update in stream if update.kind == "text"]
    assert stream.response is not None
    assert stream.response.text == "made it"
    assert texts == ["made ", "it"]


async def test_a_stream_dropped_after_an_update_is_not_retried(server: ResponsesServer) -> None:
    """The consumer already saw 'lost': a retry would send a second answer after it."""
    server.reply(Answer(body=response_body("lost"), drop_after=3))
    server.answer(text="made it")
    async with client_for(server) as model:
        agent = Agent(model, chat_stack=[RetryMiddleware(attempts=2, wait_initial=0)])
        texts: list[str] = []

        async def read() -> None:
            async with agent.stream("x") as stream:
                async for update in stream:
                    texts.append(update.text)

        with pytest.raises(ChatConnectionError):
            await read()
    assert texts == ["lost"]


# --- The client itself ----------------------------------------------------------------------


async def test_aclose_closes_its_own_client_but_not_a_given_one(server: ResponsesServer) -> None:
    import openai

    own = client_for(server)
    async with own:
        pass
    assert own.client.is_closed()
    sdk = openai.AsyncOpenAI(base_url=server.base_url, api_key="k")
    given = OpenAIResponsesClient("test-model", client=sdk)
    await given.aclose()
    assert not sdk.is_closed()
    await sdk.close()


def test_bad_constructor_arguments_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import openai

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(AuthenticationError, match="OPENAI_API_KEY"):
        OpenAIResponsesClient("m")
    for kwargs, match in [
        ({"model": ""}, "model"),
        ({"store": "no"}, "store"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout": 0}, "timeout"),
        ({"max_response_bytes": 0}, "max_response_bytes"),
    ]:
        with pytest.raises(ValueError, match=match):
            OpenAIResponsesClient(**{"model": "m", "api_key": "k", **kwargs})
    with pytest.raises(ValueError, match="client="):
        OpenAIResponsesClient("m", client=openai.AsyncOpenAI(api_key="k"), api_key="other")


# --- The raf command ------------------------------------------------------------------------

SHOUT = '''
import raf

@raf.tool
def shout(text: str) -> str:
    """Say it louder."""
    return text.upper() + "!"
'''


@pytest.mark.slow
def test_raf_run_with_the_responses_client(tmp_path: Path, server: ResponsesServer) -> None:
    (tmp_path / "loud_tools.py").write_text(SHOUT)
    config = tmp_path / "agent.toml"
    config.write_text(
        f"""
[agent]
instructions = "Shout when asked."
tools = ["loud_tools:shout"]

[model]
client = "openai-responses"
model = "test-model"
base_url = "{server.base_url}"
api_key_env = "RESPONSES_KEY"
max_tokens = 50
"""
    )
    server.answer(text=None, calls=[("c1", "shout", '{"text": "hello"}')], reasoning="rs_7")
    server.reply(Answer(body=response_body("They said HELLO!"), require=_replays("rs_7")))
    done = subprocess.run(
        [sys.executable, "-m", "raf", "run", str(config), "shout hello"],
        capture_output=True,
        text=True,
        env={**os.environ, "RESPONSES_KEY": "sk-cli", "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "They said HELLO!"
    first, second = server.requests
    assert first.path == "/v1/responses"
    assert first.headers["authorization"] == "Bearer sk-cli"
    assert first.body["max_output_tokens"] == 50
    assert first.body["input"][0] == {"role": "system", "content": "Shout when asked."}
    assert second.body["input"][-1] == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": "HELLO!",
    }


def test_raf_run_refuses_an_unknown_client(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[model]\nclient = "openai-chat"\n')
    done = subprocess.run(
        [sys.executable, "-m", "raf", "run", str(config), "hi"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=120,
    )
    assert done.returncode != 0
    assert '"openai-responses"' in done.stderr


def test_the_docs_real_model_example_runs_against_the_loopback_server(
    server: ResponsesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/responses.md's first example, as written, its key and URL from the environment."""
    from tests.package.test_docs_run import blocks_of

    [block] = [b for b in blocks_of(ROOT / "docs" / "responses.md") if 'gpt-5-mini")' in b.code]
    server.answer(text=None, calls=[("c1", "add", '{"a": 1234, "b": 4321}')], reasoning="rs_1")
    server.reply(Answer(body=response_body("It is 5555.", usage=(30, 4)), require=_replays("rs_1")))
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block.code, block.where, "exec"), {"__name__": "__main__"})
    assert output.getvalue() == "It is 5555.\nUsage(input_tokens=35, output_tokens=6)\n"
    assert all(request.body["stream"] is True for request in server.requests)


async def test_empty_text_deltas_keep_nothing(server: ResponsesServer) -> None:
    # A server that sends empty deltas by the million made the stream keep one update (and
    # its raw event) each: ten times max_response_bytes in memory. They say nothing.
    empty = {"type": "response.output_text.delta", "delta": ""}
    completed = {"type": "response.completed", "response": response_body("hi")}
    server.reply(Answer(events=[empty] * 500 + [completed]))
    async with client_for(server) as model:
        updates = await collect(model, [ChatMessage.user("x")])
    assert [u.text for u in updates if u.kind == "text"] == ["hi"]
