"""How an answer ends, one rule for both OpenAI clients (docs/errors.md, "How an answer ends").

- An answer the model did not finish (chat completions' ``finish_reason`` ``length`` or
  ``content_filter``; a Responses reply ``incomplete``, or still ``in_progress``) is an
  :class:`raf.errors.IncompleteResponseError` carrying what was said, plain and streamed.
- Once the model's answer is finished (chat's ``finish_reason``, Responses'
  ``response.completed``), the answer is what the model finished with: text that comes
  after it is not added, and a dropped connection or an ``error`` after it is no error.
- A streamed answer assembles to the answer the server finished with.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from raf import (
    AgentResponse,
    ChatClientError,
    ChatMessage,
    ChatOptions,
    OpenAIChatClient,
    OpenAIResponsesClient,
    Update,
    Usage,
)
from raf.errors import ChatTimeoutError, IncompleteResponseError
from tests._harness.openai_server import OpenAIServer, Reply, chunk, completion, text_stream
from tests._harness.responses_server import Answer, ResponsesServer, events_of, response_body

pytestmark = pytest.mark.anyio


@pytest.fixture
def chat_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = OpenAIServer()
    yield running
    running.close()


@pytest.fixture
def responses_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ResponsesServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = ResponsesServer()
    yield running
    running.close()


@contextlib.asynccontextmanager
async def chat_client(server: OpenAIServer) -> AsyncIterator[OpenAIChatClient]:
    async with OpenAIChatClient(
        "test-model", base_url=server.base_url, api_key="sk-test", max_retries=0
    ) as model:
        yield model


@contextlib.asynccontextmanager
async def responses_client(server: ResponsesServer) -> AsyncIterator[OpenAIResponsesClient]:
    async with OpenAIResponsesClient(
        "test-model", base_url=server.base_url, api_key="sk-test", max_retries=0
    ) as model:
        yield model


async def call(model: Any, streamed: bool, seen: list[Update] | None = None) -> AgentResponse:
    messages = [ChatMessage.user("x")]
    if not streamed:
        response: AgentResponse = await model.complete(messages, ChatOptions())
        return response
    updates = [] if seen is None else seen
    with anyio.fail_after(20):
        async with contextlib.aclosing(model.stream(messages, ChatOptions())) as stream:
            async for update in stream:
                updates.append(update)
    return AgentResponse.from_updates(updates)


# --- An answer the model did not finish is an IncompleteResponseError ------------------------


@pytest.mark.parametrize("reason", ["length", "content_filter"])
async def test_a_chat_completion_cut_short_is_incomplete(
    chat_server: OpenAIServer, reason: str
) -> None:
    body = completion("cut sh", usage=(5, 2))
    body["choices"][0]["finish_reason"] = reason
    chat_server.answer(body)
    async with chat_client(chat_server) as model:
        with pytest.raises(IncompleteResponseError, match=rf"incomplete.*{reason}") as caught:
            await call(model, streamed=False)
    error = caught.value
    assert (error.reason, error.partial.text, error.partial.usage) == (
        reason,
        "cut sh",
        Usage(5, 2),
    )
    assert not error.retryable
    assert isinstance(error, ChatClientError)


@pytest.mark.parametrize("reason", ["length", "content_filter"])
async def test_a_streamed_chat_completion_cut_short_is_incomplete(
    chat_server: OpenAIServer, reason: str
) -> None:
    chat_server.reply(Reply(events=text_stream("cut", " sh", finish_reason=reason)))
    seen: list[Update] = []
    async with chat_client(chat_server) as model:
        with pytest.raises(IncompleteResponseError, match=reason) as caught:
            await call(model, streamed=True, seen=seen)
    error = caught.value
    assert [u.text for u in seen if u.kind == "text"] == ["cut", " sh"]
    assert (error.reason, error.partial.text, error.partial.usage) == (
        reason,
        "cut sh",
        Usage(5, 2),
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_an_incomplete_response_is_incomplete_with_what_was_said(
    responses_server: ResponsesServer, streamed: bool
) -> None:
    body = response_body("cut sh", status="incomplete", usage=(5, 2))
    body["incomplete_details"] = {"reason": "max_output_tokens"}
    events = events_of(body, terminal=False) + [{"type": "response.incomplete", "response": body}]
    responses_server.reply(Answer(body=body, events=events if streamed else None))
    async with responses_client(responses_server) as model:
        with pytest.raises(IncompleteResponseError, match="max_output_tokens") as caught:
            await call(model, streamed)
    error = caught.value
    assert (error.reason, error.partial.text) == ("max_output_tokens", "cut sh")
    assert error.partial.usage is not None
    assert (error.partial.usage.input_tokens, error.partial.usage.output_tokens) == (5, 2)
    assert not error.retryable


@pytest.mark.parametrize("status", ["in_progress", "queued"])
async def test_a_response_that_is_not_finished_is_not_an_answer(
    responses_server: ResponsesServer, status: str
) -> None:
    responses_server.answer(response_body("so far", status=status))
    async with responses_client(responses_server) as model:
        with pytest.raises(IncompleteResponseError, match=status) as caught:
            await call(model, streamed=False)
    assert (caught.value.reason, caught.value.partial.text) == (status, "so far")


# --- After the finish: the answer stands, and nothing is added to it --------------------------


@pytest.mark.parametrize(
    "after",
    [
        pytest.param({"cut": True}, id="connection dropped"),
        pytest.param({"events": ({"error": {"message": "late failure"}},)}, id="error chunk"),
        pytest.param({"events": (chunk(" and more"),)}, id="text after"),
        pytest.param({"events": ("not json",)}, id="garbage after"),
    ],
)
async def test_after_finish_reason_the_chat_answer_stands(
    chat_server: OpenAIServer, after: dict[str, Any]
) -> None:
    events = (chunk("Hel", role="assistant"), chunk("lo"), chunk(finish_reason="stop"))
    events += (chunk(usage=(5, 2), choices=False),) + after.get("events", ())
    chat_server.reply(Reply(events=events, done=not after.get("cut"), cut=bool(after.get("cut"))))
    async with chat_client(chat_server) as model:
        response = await call(model, streamed=True)
    assert response.text == "Hello"
    assert response.usage == Usage(5, 2)


async def test_a_usage_in_every_chunk_counts_once(chat_server: OpenAIServer) -> None:
    # vLLM's continuous usage stats: each chunk carries the call's usage so far; a run adds
    # up the usage updates it gets, so the stream sends one, the last.
    events = (
        chunk("Hel", role="assistant", usage=(5, 1)),
        chunk("lo", usage=(5, 2)),
        chunk(finish_reason="stop", usage=(5, 2)),
        chunk(usage=(5, 2), choices=False),
    )
    chat_server.reply(Reply(events=events))
    updates: list[Update] = []
    async with chat_client(chat_server) as model:
        response = await call(model, streamed=True, seen=updates)
    assert [u.usage for u in updates if u.kind == "usage"] == [Usage(5, 2)]
    assert (response.text, response.usage) == ("Hello", Usage(5, 2))


async def test_a_drop_after_the_finish_loses_only_the_usage(chat_server: OpenAIServer) -> None:
    events = (chunk("Hi", role="assistant"), chunk(finish_reason="stop"))
    chat_server.reply(Reply(events=events, done=False, cut=True))
    async with chat_client(chat_server) as model:
        response = await call(model, streamed=True)
    assert (response.text, response.usage) == ("Hi", None)


async def test_a_drop_after_a_length_finish_is_still_incomplete(chat_server: OpenAIServer) -> None:
    events = (chunk("cut", role="assistant"), chunk(finish_reason="length"))
    chat_server.reply(Reply(events=events, done=False, cut=True))
    async with chat_client(chat_server) as model:
        with pytest.raises(IncompleteResponseError) as caught:
            await call(model, streamed=True)
    assert caught.value.partial.text == "cut"


@pytest.mark.parametrize(
    "after",
    [
        pytest.param([{"type": "error", "code": "late", "message": "late failure"}], id="error"),
        pytest.param([{"type": "response.output_text.delta", "delta": " more"}], id="text after"),
    ],
)
async def test_after_completed_the_responses_answer_stands(
    responses_server: ResponsesServer, after: list[dict[str, Any]]
) -> None:
    responses_server.reply(Answer(events=events_of(response_body("Hello there")) + after))
    async with responses_client(responses_server) as model:
        assert (await call(model, streamed=True)).text == "Hello there"


# --- A streamed answer is the answer the server finished with --------------------------------


async def test_the_completed_text_finishes_what_the_deltas_began(
    responses_server: ResponsesServer,
) -> None:
    body = response_body("Hello world")
    events = [
        {"type": "response.output_text.delta", "delta": "Hel"},
        {"type": "response.completed", "response": body},
    ]
    responses_server.reply(Answer(events=events))
    seen: list[Update] = []
    async with responses_client(responses_server) as model:
        response = await call(model, streamed=True, seen=seen)
    assert response.text == "Hello world"
    assert [u.text for u in seen if u.kind == "text"] == ["Hel", "lo world"]


async def test_deltas_that_disagree_with_the_completed_text_are_an_error(
    responses_server: ResponsesServer,
) -> None:
    events = [
        {"type": "response.output_text.delta", "delta": "Goodbye"},
        {"type": "response.completed", "response": response_body("Hello world")},
    ]
    responses_server.reply(Answer(events=events))
    async with responses_client(responses_server) as model:
        with pytest.raises(ChatClientError, match=r"streamed text.*does not begin"):
            await call(model, streamed=True)


# --- Timeouts: a plain call has a whole-call deadline; a stream a start and an idle bound ----


async def test_a_stream_longer_than_timeout_is_fine_while_it_keeps_coming(
    chat_server: OpenAIServer,
) -> None:
    # 1.5 s of healthy stream against timeout=0.5: only silence is bounded, by idle_timeout.
    chat_server.reply(Reply(events=text_stream(*["x"] * 5), pause=0.25))
    async with OpenAIChatClient(
        "test-model",
        base_url=chat_server.base_url,
        api_key="k",
        max_retries=0,
        timeout=0.5,
        idle_timeout=1.0,
    ) as model:
        assert (await call(model, streamed=True)).text == "xxxxx"


@pytest.mark.parametrize("client", ["chat", "responses"])
async def test_a_silent_stream_is_an_idle_timeout(
    chat_server: OpenAIServer, responses_server: ResponsesServer, client: str
) -> None:
    model: Any
    if client == "chat":
        chat_server.reply(Reply(events=(chunk("Hel", role="assistant"),), pause=30, done=False))
        model = OpenAIChatClient(
            "m", base_url=chat_server.base_url, api_key="k", max_retries=0, idle_timeout=0.3
        )
    else:
        responses_server.reply(Answer(body=response_body("one two three"), stall_after=2))
        model = OpenAIResponsesClient(
            "m", base_url=responses_server.base_url, api_key="k", max_retries=0, idle_timeout=0.3
        )
    async with model:
        with anyio.fail_after(20), pytest.raises(ChatTimeoutError) as caught:
            await call(model, streamed=True)
    assert "sent nothing for 0.3 s" in str(caught.value)
    assert f"{type(model).__name__}(idle_timeout=0.3)" in str(caught.value)
    assert caught.value.retryable


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
async def test_the_timeout_message_names_its_value(
    chat_server: OpenAIServer, streamed: bool
) -> None:
    chat_server.reply(Reply(body=completion(), delay=30))
    async with OpenAIChatClient(
        "m", base_url=chat_server.base_url, api_key="k", max_retries=0, timeout=0.3
    ) as model:
        with anyio.fail_after(20), pytest.raises(ChatTimeoutError) as caught:
            await call(model, streamed)
    assert "OpenAIChatClient(timeout=0.3)" in str(caught.value)


def test_idle_timeout_is_checked() -> None:
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="idle_timeout"):
            OpenAIChatClient("m", api_key="k", idle_timeout=bad)
        with pytest.raises(ValueError, match="idle_timeout"):
            OpenAIResponsesClient("m", api_key="k", idle_timeout=bad)
    assert OpenAIChatClient("m", api_key="k").idle_timeout == 60.0
