"""A guardrail's block behind raf.serve, over a real uvicorn process, read by real clients.

Blocked before any output (the request), a turn is a 400 ``guardrail_blocked``
that names the guardrail and nothing of its reason; blocked mid-stream (the
answer), the stream ends with the protocol's error event, and the session
keeps what the client saw.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx2 as httpx
import pytest

from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

if TYPE_CHECKING:
    import openai  # imported where used: collecting this module stays cheap

pytestmark = pytest.mark.slow
MODEL = "word-agent"
SEEN = "seen 1: Hello there. "  # the model's answer before the window that says "secret"


@pytest.fixture(scope="module")
def server() -> Iterator[ServedAgent]:
    with ServedAgent(guardrails=True) as running:
        yield running


@pytest.fixture
def sdk(server: ServedAgent) -> Iterator[openai.OpenAI]:
    import openai

    with openai.OpenAI(
        base_url=f"{server.url}/v1",
        api_key="unused",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=TLS),
    ) as client:
        yield client


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def stored(server: ServedAgent, session: str) -> list[dict[str, Any]]:
    # The post stages run as the response ends: wait for them a little.
    deadline = time.monotonic() + 10
    with httpx.Client(verify=TLS) as client:
        while True:
            url = f"{server.url}/v1/sessions/{session}/messages"
            data: list[dict[str, Any]] = client.get(url).json()["data"]
            if data or time.monotonic() > deadline:
                return data
            time.sleep(0.05)


def blocked_message(message: str, where: str) -> None:
    name = "no_jailbreak" if where == "the request" else "no_secret"
    assert f"guardrail {name!r} blocked {where}" in message
    assert "internal rule" not in message  # the check's reason stays in the server's log


@pytest.mark.parametrize("stream", [False, True])
def test_a_blocked_request_is_a_400_naming_the_guardrail(
    server: ServedAgent, sdk: openai.OpenAI, stream: bool
) -> None:
    import openai

    session = uuid.uuid4().hex

    def call() -> None:
        reply = sdk.chat.completions.create(
            model=MODEL,
            messages=user("try a jailbreak"),
            stream=stream,
            extra_headers={"X-Session-Id": session},
        )
        if stream:
            list(reply)  # type: ignore[call-overload]

    with pytest.raises(openai.BadRequestError) as raised:
        call()
    assert raised.value.status_code == 400
    assert raised.value.code == "guardrail_blocked"
    blocked_message(raised.value.message, "the request")
    with httpx.Client(verify=TLS) as client:
        data = client.get(f"{server.url}/v1/sessions/{session}/messages").json()["data"]
    assert data == []  # nothing of a blocked request is kept


def test_a_blocked_answer_unstreamed_is_a_400_without_the_answer(sdk: openai.OpenAI) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(model=MODEL, messages=user("Hello there. the secret"))
    assert raised.value.code == "guardrail_blocked"
    blocked_message(raised.value.message, "the answer")


def test_a_chunk_stream_blocked_mid_answer_ends_with_an_error_and_the_session_keeps_it(
    server: ServedAgent, sdk: openai.OpenAI
) -> None:
    import openai

    session = uuid.uuid4().hex
    texts: list[str] = []
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=user("Hello there. the secret"),
        stream=True,
        extra_headers={"X-Session-Id": session},
    )

    def read() -> None:
        for chunk in stream:
            texts.extend(c.delta.content or "" for c in chunk.choices)

    with pytest.raises(openai.APIError) as raised:
        read()
    assert "".join(texts) == SEEN
    assert raised.value.code == "guardrail_blocked"
    blocked_message(raised.value.message, "the answer")
    assert [(m["role"], m["content"]) for m in stored(server, session)] == [
        ("user", "Hello there. the secret"),
        ("assistant", SEEN),
    ]


def test_a_responses_stream_blocked_mid_answer_is_response_failed(
    server: ServedAgent, sdk: openai.OpenAI
) -> None:
    session = uuid.uuid4().hex
    events = list(
        sdk.responses.create(
            model=MODEL,
            input="Hello there. the secret",
            stream=True,
            extra_headers={"X-Session-Id": session},
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == SEEN
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.error is not None
    assert failed.response.error.code == "guardrail_blocked"  # type: ignore[comparison-overlap]
    blocked_message(failed.response.error.message, "the answer")
    assert [m["content"] for m in stored(server, session)] == ["Hello there. the secret", SEEN]


@pytest.mark.parametrize(
    ("text", "where"), [("a jailbreak", "the request"), ("Hello there. the secret", "the answer")]
)
def test_an_ag_ui_run_blocked_is_run_error_with_the_code(
    server: ServedAgent, text: str, where: str
) -> None:
    body = {
        "threadId": uuid.uuid4().hex,
        "runId": "run-1",
        "state": None,
        "messages": [{"id": "m1", "role": "user", "content": text}],
        "tools": [],
        "context": [],
        "forwardedProps": None,
    }
    with httpx.Client(timeout=30, verify=TLS) as client:
        reply = client.post(f"{server.url}/ag-ui", json=body)
    events = [
        json.loads(line[len("data: ") :])
        for line in reply.text.splitlines()
        if line.startswith("data: ")
    ]
    assert events[-1]["type"] == "RUN_ERROR"
    assert events[-1]["code"] == "guardrail_blocked"
    blocked_message(events[-1]["message"], where)
    deltas = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert deltas == ("" if where == "the request" else SEEN)
