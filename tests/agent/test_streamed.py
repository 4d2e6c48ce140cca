"""What a streamed run keeps of its model's stream: the answer, not the updates (their vendor
chunks), measured with tracemalloc against both OpenAI clients on loopback servers."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

import raf
from raf import ChatMessage, Update
from tests._harness.loopback_server import sse
from tests._harness.openai_server import OpenAIServer, Reply, chunk, text_stream
from tests._harness.responses_server import Answer, ResponsesServer, response_body

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

#: The deltas of one character the server sends, and the one after which the growth is counted.
#: What a run keeps is some 0.1 to 0.25 of the wire at 3,000 as at 6,000; it kept some 7 times.
DELTAS = 3000
FROM = 500


@pytest.fixture
def tracing() -> Iterator[None]:
    """Stops tracemalloc, which the test starts at its FROM-th delta."""
    try:
        yield
    finally:
        tracemalloc.stop()


def _responses(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, int]:
    delta = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
             "content_index": 0, "delta": "x", "sequence_number": 0}  # fmt: skip
    events = [{**delta, "sequence_number": i} for i in range(DELTAS)]
    events.append({"type": "response.completed", "response": response_body("x" * DELTAS)})
    server = ResponsesServer()
    server.reply(Answer(events=events))
    client = raf.OpenAIResponsesClient("m", base_url=server.base_url, api_key="k", max_retries=0)
    return server, client, len(sse(json.dumps(delta), delta["type"]))


def _chat(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, int]:
    server = OpenAIServer()
    server.reply(Reply(events=text_stream(*"x" * DELTAS)))
    client = raf.OpenAIChatClient("m", base_url=server.base_url, api_key="k", max_retries=0)
    return server, client, len(sse(json.dumps(chunk("x"))))


@pytest.mark.parametrize("streamed", [False, True], ids=["on_update", "agent.stream"])
@pytest.mark.parametrize("make", [_responses, _chat], ids=["responses", "chat"])
async def test_a_run_keeps_the_answer_not_each_update_and_its_chunk(
    make: Any, streamed: bool, monkeypatch: pytest.MonkeyPatch, tracing: None
) -> None:
    # A server sending its text a character at a time: the run kept every update and its
    # parsed chunk, some seven times the stream's size on the wire (and of
    # max_response_bytes, which bounds that).
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server, client, wire = make(monkeypatch)
    seen = 0
    traced: dict[int, int] = {}

    async def on_update(update: Update) -> None:
        nonlocal seen
        seen += update.kind == "text"
        # Traced from here only: the growth counted is of blocks allocated from here on, not
        # blurred by the set-up's blocks freed meanwhile, and the imports and the first deltas
        # run at full speed.
        if seen == FROM and not traced:
            tracemalloc.start()
        if seen in (FROM, DELTAS) and seen not in traced:
            traced[seen] = tracemalloc.get_traced_memory()[0]

    try:
        async with client:
            agent = raf.Agent(client)
            if streamed:  # the consumer lets go of each update; the stream keeps what it needs
                async with agent.stream([ChatMessage.user("hi")]) as stream:
                    async for update in stream:
                        await on_update(update)
                answer = stream.response
            else:
                answer = await agent.run([ChatMessage.user("hi")], on_update=on_update)
    finally:
        server.close()
    assert answer.text == "x" * DELTAS
    kept = traced[DELTAS] - traced[FROM]  # what the deltas between the two left in memory
    sent = wire * (DELTAS - FROM)
    assert kept < sent / 2, f"{kept} bytes kept for {sent} bytes of deltas on the wire"
