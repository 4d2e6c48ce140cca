"""raf.serve over a real uvicorn process, called by the real openai SDK and raf's own client."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anyio
import httpx2 as httpx
import pytest

from raf import Agent, OpenAIChatClient, Update
from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent, started

if TYPE_CHECKING:
    import openai  # imported where used: collecting this module stays cheap

pytestmark = pytest.mark.slow
MODEL = "word-agent"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServedAgent, ...]]:
    # Both start at once: one without keys, one with two keys.
    with started(
        ServedAgent(delay=0.005, max_body=64 * 1024), ServedAgent(keys=["key-one", "key-two"])
    ) as running:
        yield running


@pytest.fixture
def server(servers: tuple[ServedAgent, ...]) -> ServedAgent:
    return servers[0]


@pytest.fixture
def keyed(servers: tuple[ServedAgent, ...]) -> ServedAgent:
    return servers[1]


def sdk(server: ServedAgent, key: str = "unused") -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_the_sdk_gets_a_plain_answer_with_usage(server: ServedAgent) -> None:
    reply = sdk(server).chat.completions.create(model=MODEL, messages=user("hello there"))
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == "seen 1: hello there "
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (1, 3)


def test_the_usage_says_the_cached_and_the_reasoning_tokens(server: ServedAgent) -> None:
    client = sdk(server)
    whole = client.chat.completions.create(model=MODEL, messages=user("cached"))
    streamed = list(
        client.chat.completions.create(
            model=MODEL, messages=user("cached"), stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    responded = client.responses.create(model=MODEL, input="cached")
    for usage in (whole.usage, streamed[-1].usage):
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (12, 5, 17)
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 8
        assert usage.completion_tokens_details is not None
        assert usage.completion_tokens_details.reasoning_tokens == 2
    assert responded.usage is not None
    assert (responded.usage.input_tokens, responded.usage.output_tokens) == (12, 5)
    assert responded.usage.input_tokens_details.cached_tokens == 8
    assert responded.usage.output_tokens_details.reasoning_tokens == 2


def test_the_sdk_streams_chunks_then_usage_in_a_last_chunk_without_choices(
    server: ServedAgent,
) -> None:
    chunks = list(
        sdk(server).chat.completions.create(
            model=MODEL,
            messages=user("hello there"),
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "seen 1: hello there "
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 4
    # Without include_usage, no usage chunk; the raw stream ends with [DONE].
    with httpx.Client(verify=TLS) as client:
        raw = client.post(
            f"{server.url}/v1/chat/completions",
            json={"model": MODEL, "messages": user("hi"), "stream": True},
        )
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [line for line in raw.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["choices"] for e in events[:-1])


def test_the_models_route_lists_the_agent(server: ServedAgent) -> None:
    assert [m.id for m in sdk(server).models.list()] == [MODEL]


def test_a_session_keeps_the_history_and_takes_only_the_new_messages(server: ServedAgent) -> None:
    client, session = sdk(server), {"X-Session-Id": uuid.uuid4().hex}
    first = client.chat.completions.create(model=MODEL, messages=user("one"), extra_headers=session)
    assert first.choices[0].message.content == "seen 1: one "
    # The client sends the whole conversation, as OpenAI clients do: only the message
    # after the last assistant message is new; the stored history gives the rest once.
    conversation = [
        *user("one"),
        {"role": "assistant", "content": first.choices[0].message.content},
        *user("two"),
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=conversation, extra_headers=session
    )
    assert second.choices[0].message.content == "seen 3: two "
    # Without a session the body is the request: three messages, nothing stored.
    stateless = client.chat.completions.create(model=MODEL, messages=conversation)
    assert stateless.choices[0].message.content == "seen 3: two "
    with httpx.Client(verify=TLS) as raw:
        stored = raw.get(f"{server.url}/v1/sessions/{session['X-Session-Id']}/messages").json()
    assert [m["role"] for m in stored["data"]] == ["user", "assistant", "user", "assistant"]


BAD_BODIES: list[tuple[str, bytes, int]] = [
    ("malformed JSON", b'{"model": ', 400),
    ("not UTF-8", b'{"model": "\xff\xfe"}', 400),
    ("not an object", b"[1, 2]", 400),
    ("no messages", json.dumps({"model": MODEL}).encode(), 400),
    ("messages not a list", json.dumps({"model": MODEL, "messages": "hi"}).encode(), 400),
    ("a message not an object", json.dumps({"model": MODEL, "messages": ["hi"]}).encode(), 400),
    (
        "an unknown role",
        json.dumps({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}).encode(),
        400,
    ),
    (
        "an image part",
        json.dumps(
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            }
        ).encode(),
        400,
    ),
    (
        "content a number",
        json.dumps({"model": MODEL, "messages": [{"role": "user", "content": 3}]}).encode(),
        400,
    ),
    (
        "stream not a boolean",
        json.dumps({"model": MODEL, "messages": user("x"), "stream": "yes"}).encode(),
        400,
    ),
    ("an unknown model", json.dumps({"model": "gpt-9", "messages": user("x")}).encode(), 404),
    ("over the limit", json.dumps({"model": MODEL, "messages": user("x" * 70_000)}).encode(), 413),
    ("nested too deeply", b"[" * 20_000 + b"]" * 20_000, 400),
    ("a huge number", b'{"model": ' + b"9" * 5000 + b"}", 400),
]


@pytest.mark.parametrize(("why", "body", "status"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_is_a_4xx_in_the_openai_shape_and_the_server_goes_on(
    server: ServedAgent, why: str, body: bytes, status: int
) -> None:
    with httpx.Client(verify=TLS) as client:
        reply = client.post(
            f"{server.url}/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        assert error["message"]
        assert isinstance(error["type"], str)
        assert "code" in error
        assert "Traceback" not in reply.text
        assert client.get(f"{server.url}/healthz").status_code == 200


def test_a_chunked_body_over_the_limit_is_a_413_while_reading(server: ServedAgent) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "word-agent", "messages": [{"role": "user", "content": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}]}'

    with httpx.Client(verify=TLS) as client:
        reply = client.post(
            f"{server.url}/v1/chat/completions",
            content=chunks(),
            headers={"content-type": "application/json"},  # else a 415 before any reading
        )
    assert reply.status_code == 413
    assert "limit" in reply.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("text", "status", "error_name"),
    [
        ("fail:model", 502, "InternalServerError"),
        ("fail:timeout", 504, "InternalServerError"),
        ("fail:rate", 429, "RateLimitError"),
    ],
)
def test_upstream_failures_map_to_502_504_and_429_with_retry_after(
    server: ServedAgent, text: str, status: int, error_name: str, stream: bool
) -> None:
    import openai

    error: type[openai.APIStatusError] = getattr(openai, error_name)

    def call() -> None:
        reply = sdk(server).chat.completions.create(model=MODEL, messages=user(text), stream=stream)
        if stream:
            list(reply)  # type: ignore[call-overload]

    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, openai.APIStatusError)
    assert raised.value.status_code == status
    if status == 429:
        assert raised.value.response.headers["retry-after"] == "7"


def test_raf_calls_the_served_agent_as_a_model(server: ServedAgent) -> None:
    async def main() -> tuple[str, list[str], str]:
        client = OpenAIChatClient(MODEL, base_url=f"{server.url}/v1", api_key="unused")
        async with client:
            caller = Agent(client, instructions="You call another agent.")
            plain = await caller.run("agents calling agents")
            async with caller.stream("streamed too") as stream:
                texts = [u.text async for u in stream if isinstance(u, Update) and u.text]
            assert stream.response is not None
            return plain.text, texts, stream.response.text

    plain, texts, streamed = anyio.run(main)
    assert plain == "seen 2: agents calling agents "  # the caller's system message + the user's
    assert "".join(texts) == streamed == "seen 2: streamed too "
    assert len(texts) == 3


def test_a_client_that_disconnects_mid_stream_leaves_a_partial_answer(
    server: ServedAgent,
) -> None:
    session = uuid.uuid4().hex
    body = json.dumps({"model": MODEL, "stream": True, "messages": user("long")}).encode()
    # A real socket, closed after a few events: what a closed browser tab does.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + b"Content-Type: application/json\r\n"
            + f"X-Session-Id: {session}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        received = b""
        while received.count(b"data: ") < 6:
            received += raw.recv(4096)
    stored = _stored(server, session, wait_for=2)
    assert [m["role"] for m in stored] == ["user", "assistant"]
    partial = stored[1]["content"]
    assert partial.startswith("w0 w1 w2 w3 ")
    assert len(partial.split()) < 200  # it stopped: the partial answer, not the whole one
    # The next turn in that session sees it.
    reply = sdk(server).chat.completions.create(
        model=MODEL, messages=user("again"), extra_headers={"X-Session-Id": session}
    )
    assert reply.choices[0].message.content == "seen 3: again "


def _stored(server: ServedAgent, session: str, *, wait_for: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    with httpx.Client(verify=TLS) as client:
        while True:
            data: list[dict[str, Any]] = client.get(
                f"{server.url}/v1/sessions/{session}/messages"
            ).json()["data"]
            if len(data) >= wait_for or time.monotonic() > deadline:
                return data
            time.sleep(0.05)


def test_keys_guard_every_route_but_healthz_and_scope_the_sessions(keyed: ServedAgent) -> None:
    import openai

    with httpx.Client(verify=TLS) as client:
        assert client.get(f"{keyed.url}/healthz").status_code == 200
        for path in ("/v1/models", "/", "/v1/sessions/s/messages"):
            reply = client.get(f"{keyed.url}{path}")
            assert reply.status_code == 401, path
            assert reply.json()["error"]["type"] == "authentication_error"
        wrong = client.get(f"{keyed.url}/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    with pytest.raises(openai.AuthenticationError):
        sdk(keyed, "nope").chat.completions.create(model=MODEL, messages=user("x"))
    same = {"X-Session-Id": "shared-name"}
    one, two = sdk(keyed, "key-one"), sdk(keyed, "key-two")
    one.chat.completions.create(model=MODEL, messages=user("secret"), extra_headers=same)
    # The same session id under another key is another conversation: it sees nothing.
    reply = two.chat.completions.create(model=MODEL, messages=user("hello"), extra_headers=same)
    assert reply.choices[0].message.content == "seen 1: hello "
    again = one.chat.completions.create(model=MODEL, messages=user("more"), extra_headers=same)
    assert again.choices[0].message.content == "seen 3: more "
