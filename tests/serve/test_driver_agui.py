"""AG-UI over real uvicorn (issue 32): each event read back with ``ag-ui-protocol``'s own
models, and each run's sequence held to the protocol's ordering rules (those
``@ag-ui/client``'s ``verifyEvents`` applies: a run starts first and ends last, once;
a message's or tool call's events come between its start and its end; nothing is
left open when the run finishes; a call's parent message is one the run sent)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import httpx2 as httpx
import pydantic
import pytest
from ag_ui.core import (
    AssistantMessage,
    Event,
    EventType,
    FunctionCall,
    RunAgentInput,
    Tool,
    ToolCall,
    ToolMessage,
    UserMessage,
)

from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

pytestmark = pytest.mark.slow
EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Event)
WEATHER = Tool(
    name="get_weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
Message = UserMessage | AssistantMessage | ToolMessage


@pytest.fixture(scope="module")
def served() -> Iterator[ServedAgent]:
    with ServedAgent() as server:
        yield server


def run(served: ServedAgent, messages: Sequence[Message], thread: str = "") -> list[Any]:
    """One run, sent as the package's ``RunAgentInput``; its events as the package's models."""
    body = RunAgentInput(
        thread_id=thread or uuid.uuid4().hex, run_id=uuid.uuid4().hex, state=None,
        messages=list(messages), tools=[WEATHER], context=[], forwarded_props=None,
    )  # fmt: skip
    reply = httpx.post(
        f"{served.url}/ag-ui",
        content=body.model_dump_json(by_alias=True),
        headers={"content-type": "application/json", "accept": "text/event-stream"},
        timeout=30,
        verify=TLS,
    )
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    frames = [f for f in reply.text.split("\n\n") if f.strip()]
    assert all(f.startswith("data: ") for f in frames), frames
    events = [EVENTS.validate_json(f[len("data: ") :]) for f in frames]
    verify(events, body)
    return events


def verify(events: Sequence[Any], body: RunAgentInput) -> None:
    """The ordering rules of an AG-UI run; an ``AssertionError`` names the one broken."""
    kinds = [e.type for e in events]
    assert kinds[0] == EventType.RUN_STARTED, kinds
    assert (events[0].thread_id, events[0].run_id) == (body.thread_id, body.run_id)
    assert kinds[-1] in (EventType.RUN_FINISHED, EventType.RUN_ERROR), kinds
    ends = [k for k in kinds if k in (EventType.RUN_FINISHED, EventType.RUN_ERROR)]
    assert len(ends) == 1, kinds
    assert kinds.count(EventType.RUN_STARTED) == 1, kinds
    texts: set[str] = set()  # open messages
    calls: set[str] = set()  # open tool calls
    sent: set[str] = set()  # every message the run started
    for event in events[1:-1]:
        kind = event.type
        if kind == EventType.TEXT_MESSAGE_START:
            assert event.message_id not in texts, f"{event.message_id} started twice"
            texts.add(event.message_id)
            sent.add(event.message_id)
        elif kind == EventType.TEXT_MESSAGE_CONTENT:
            assert event.message_id in texts, f"content of {event.message_id}, not started"
            assert event.delta, "an empty TEXT_MESSAGE_CONTENT"
        elif kind == EventType.TEXT_MESSAGE_END:
            assert event.message_id in texts, f"end of {event.message_id}, not started"
            texts.remove(event.message_id)
        elif kind == EventType.TOOL_CALL_START:
            assert event.tool_call_id not in calls, f"{event.tool_call_id} started twice"
            if event.parent_message_id is not None:
                assert event.parent_message_id in sent, "a call's parent is no message sent"
            calls.add(event.tool_call_id)
        elif kind in (EventType.TOOL_CALL_ARGS, EventType.TOOL_CALL_END):
            assert event.tool_call_id in calls, f"{kind} of {event.tool_call_id}, not started"
            if kind == EventType.TOOL_CALL_END:
                calls.remove(event.tool_call_id)
        elif kind == EventType.TOOL_CALL_RESULT:
            assert event.tool_call_id not in calls, "a result before its call's end"
    if events[-1].type == EventType.RUN_FINISHED:
        assert not texts, f"messages left open at RUN_FINISHED: {texts}"
        assert not calls, f"tool calls left open at RUN_FINISHED: {calls}"
        assert (events[-1].thread_id, events[-1].run_id) == (body.thread_id, body.run_id)


def text_of(events: Sequence[Any]) -> str:
    return "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)


def test_a_plain_answer(served: ServedAgent) -> None:
    events = run(served, [UserMessage(id="u1", content="hi there")])
    assert text_of(events) == "seen 1: hi there "


def test_an_agent_tool_its_result_and_the_answer(served: ServedAgent) -> None:
    events = run(served, [UserMessage(id="u1", content="use the tool")])
    [result] = [e for e in events if e.type == EventType.TOOL_CALL_RESULT]
    assert result.content == "HI"
    assert text_of(events) == "the tool said HI"


def test_text_then_a_client_call_in_one_model_call_is_one_message(served: ServedAgent) -> None:
    events = run(served, [UserMessage(id="u1", content="check client weather")])
    [start] = [e for e in events if e.type == EventType.TEXT_MESSAGE_START]
    [call] = [e for e in events if e.type == EventType.TOOL_CALL_START]
    assert call.parent_message_id == start.message_id
    assert events[-1].type == EventType.RUN_FINISHED


def test_a_client_call_then_its_result_in_the_next_run(served: ServedAgent) -> None:
    thread = uuid.uuid4().hex
    asked = UserMessage(id="u1", content="client weather")
    first = run(served, [asked], thread)
    [call] = [e for e in first if e.type == EventType.TOOL_CALL_START]
    [args] = [e for e in first if e.type == EventType.TOOL_CALL_ARGS]
    called = AssistantMessage(
        id="a1",
        tool_calls=[ToolCall(id=call.tool_call_id, function=FunctionCall(
            name=call.tool_call_name, arguments=args.delta))],
    )  # fmt: skip
    answered = ToolMessage(id="t1", tool_call_id=call.tool_call_id, content="snow")
    second = run(served, [asked, called, answered], thread)
    assert text_of(second) == "the tool said snow"


def test_a_model_that_fails_is_run_error(served: ServedAgent) -> None:
    events = run(served, [UserMessage(id="u1", content="fail:model")])
    assert [e.type for e in events] == [EventType.RUN_STARTED, EventType.RUN_ERROR]
    assert "the model failed" in events[-1].message
    assert json.loads(events[-1].model_dump_json(by_alias=True))["type"] == "RUN_ERROR"
