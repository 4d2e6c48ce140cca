"""The Anthropic loopback server checked against the real ``anthropic`` SDK: what it sends
is what the SDK parses into its own types, plain, streamed and failed, so the client
tests cannot agree with a wrong server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests._harness.anthropic_server import Answer, AnthropicServer, events_of, message_body
from tests._harness.tls import TLS

if TYPE_CHECKING:
    # The SDK is imported where it is used, so collecting this module stays cheap.
    import anthropic
    from anthropic.types import Message

pytestmark = pytest.mark.anyio

BODY = message_body(
    "two words",
    calls=[("toolu_1", "add", {"a": 1, "b": 2}), ("toolu_2", "add", {"a": 3, "b": 4})],
    thinking=[("Let me add.", "sig-1")],
    redacted="opaque",
    usage=(10, 7),
    cache_read=100,
    cache_write=20,
)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[AnthropicServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = AnthropicServer()
    yield running
    running.close()


def sdk(server: AnthropicServer) -> anthropic.AsyncAnthropic:
    import anthropic

    return anthropic.AsyncAnthropic(
        base_url=server.root_url,
        api_key="sk-ant",
        max_retries=0,
        http_client=anthropic.DefaultAsyncHttpxClient(verify=TLS),
    )


def check(message: Message) -> None:
    from anthropic.types import RedactedThinkingBlock, TextBlock, ThinkingBlock, ToolUseBlock

    thinking, redacted, text, first, second = message.content
    assert isinstance(thinking, ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == ("Let me add.", "sig-1")
    assert isinstance(redacted, RedactedThinkingBlock)
    assert redacted.data == "opaque"
    assert isinstance(text, TextBlock)
    assert text.text == "two words"
    assert isinstance(first, ToolUseBlock)
    assert (first.id, first.name, first.input) == ("toolu_1", "add", {"a": 1, "b": 2})
    assert isinstance(second, ToolUseBlock)
    assert second.input == {"a": 3, "b": 4}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (10, 7)
    assert message.usage.cache_read_input_tokens == 100
    assert message.usage.cache_creation_input_tokens == 20


async def test_the_sdk_parses_a_message(server: AnthropicServer) -> None:
    from anthropic.types import Message

    server.answer(BODY)
    async with sdk(server) as client:
        message = await client.messages.create(
            model="test-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert isinstance(message, Message)
    check(message)
    (request,) = server.requests
    assert request.path == "/v1/messages"


async def test_the_sdk_assembles_a_stream(server: AnthropicServer) -> None:
    server.answer(BODY)
    async with (
        sdk(server) as client,
        client.messages.stream(
            model="test-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        kinds = [event.type async for event in stream]
        message = await stream.get_final_message()
    check(message)
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    assert "text" in kinds  # the SDK's own event of a text delta
    assert server.requests[0].body["stream"] is True


async def test_the_sdk_reads_a_stream_without_message_stop_as_whole(
    server: AnthropicServer,
) -> None:
    # Why raf checks for message_stop itself (see the design).
    server.reply(Answer(events=events_of(message_body("cut"), terminal=False)))
    async with (
        sdk(server) as client,
        client.messages.stream(
            model="test-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        message = await stream.get_final_message()
    assert message.content[0].type == "text"


@pytest.mark.parametrize(
    ("status", "error_name", "kind"),
    [
        (400, "BadRequestError", "invalid_request_error"),
        (401, "AuthenticationError", "authentication_error"),
        (403, "PermissionDeniedError", "permission_error"),
        (404, "NotFoundError", "not_found_error"),
        (413, "ContentTooLargeError", "request_too_large"),
        (429, "RateLimitError", "rate_limit_error"),
        (500, "InternalServerError", "api_error"),
        (529, "OverloadedError", "overloaded_error"),
    ],
)
async def test_the_sdk_reads_an_error(
    server: AnthropicServer, status: int, error_name: str, kind: str
) -> None:
    import anthropic

    error: type[anthropic.APIStatusError] = getattr(anthropic, error_name)
    server.fail(status, "it went wrong", headers={"retry-after": "3"})
    async with sdk(server) as client:
        with pytest.raises(error) as caught:
            await client.messages.create(
                model="test-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
    assert caught.value.status_code == status
    assert caught.value.type == kind
    assert caught.value.api_message == "it went wrong"
    assert caught.value.response.headers["retry-after"] == "3"
