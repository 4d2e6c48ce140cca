"""Tracing reports every stage in the order it ran, with the provider's own name."""

from __future__ import annotations

from typing import Any

import pytest

from raf import (
    Agent,
    ContextProvider,
    ContextResult,
    ProviderError,
    ScriptedChatClient,
    ToolCall,
    parallel,
    tool,
)
from raf.observe import StageEvent, TraceObserver

pytestmark = pytest.mark.anyio


class Named(ContextProvider):
    kind = "test"

    def __init__(self, name: str, *, fail: bool = False) -> None:
        self.name = name
        self.fail = fail

    async def on_invoking(self, *args: Any) -> ContextResult:
        if self.fail:
            raise RuntimeError("boom")
        return ContextResult(instructions=self.name)


async def test_trace_lists_stages_in_run_order() -> None:
    events: list[StageEvent] = []
    agent = Agent(
        ScriptedChatClient(["ok"]),
        stack=[Named("a"), Named("b")],
        observers=[TraceObserver(events.append)],
    )
    await agent.run("hi")
    assert [(e.provider, e.stage, e.outcome) for e in events] == [
        ("a", "on_invoking", "ok"),
        ("b", "on_invoking", "ok"),
        ("model", "complete", "ok"),
        ("b", "on_invoked", "ok"),
        ("a", "on_invoked", "ok"),
    ]
    assert all(e.duration_ms >= 0 for e in events)
    assert str(events[0]).startswith("a [test] on_invoking ")


async def test_a_traced_failure_still_names_the_real_provider() -> None:
    events: list[StageEvent] = []
    agent = Agent(
        ScriptedChatClient([]),
        stack=[Named("x", fail=True)],
        observers=[TraceObserver(events.append)],
    )
    with pytest.raises(ProviderError) as info:
        await agent.run("hi")
    assert info.value.provider == "x"
    assert [(e.provider, e.outcome) for e in events] == [("x", "raised RuntimeError")]


async def test_members_of_a_parallel_group_are_traced_one_by_one() -> None:
    events: list[StageEvent] = []
    stack = [parallel(Named("a"), Named("b")), Named("c")]
    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=stack, observers=[TraceObserver(events.append)]).run("hi")
    assert sorted(e.provider for e in events if e.stage == "on_invoking") == ["a", "b", "c"]
    assert client.requests[0].messages[0].content == "a\nb\nc"


class Tools(ContextProvider):
    def __init__(self) -> None:
        @tool
        def count(items: list[int]) -> dict[str, int]:
            """Count the items."""
            return {"count": len(items)}

        @tool
        def fail() -> str:
            """Always fails."""
            raise ValueError("nope")

        self.tools = (count, fail)

    async def on_invoking(self, *args: Any) -> ContextResult:
        return ContextResult(tools=self.tools)


async def test_tool_calls_are_traced_with_arguments_and_result_size() -> None:
    @tool
    def echo(text: str) -> str:
        """Say it back."""
        return text

    events: list[StageEvent] = []
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(
                ToolCall("1", "count", '{"items": [1, 2, 3]}'),
                ToolCall("2", "echo", '{"text": "' + "x" * 300 + '"}'),
                ToolCall("3", "fail", "{}"),
            ),
            "done",
        ]
    )
    agent = Agent(
        client,
        tools=[echo],
        stack=[Tools()],
        observers=[TraceObserver(events.append)],
    )
    response = await agent.run("hi")
    assert response.text == "done"
    calls = sorted((e for e in events if e.stage == "call"), key=lambda e: e.provider)
    assert [(e.provider, e.kind, e.outcome) for e in calls] == [
        ("count", "tool", "ok"),
        ("echo", "tool", "ok"),
        ("fail", "tool", "raised ValueError"),
    ]
    assert calls[0].detail == 'arguments {"items": [1, 2, 3]}; result 12 chars'
    assert calls[1].detail.startswith('arguments {"text": "xxx')
    assert calls[1].detail.endswith("... (312 chars); result 300 chars")
    assert calls[2].detail == "arguments {}"
    assert str(calls[0]).startswith("count [tool] call ")
    # The model saw the tools as they are: names, schemas, results.
    assert [t.name for t in client.requests[0].options.tools] == ["echo", "count", "fail"]
    assert client.requests[1].messages[-3].content == '{"count": 3}'
    assert "Error: tool 'fail' failed: ValueError: nope" in client.requests[1].messages[-1].content


async def test_a_streamed_model_call_is_one_event_with_its_update_count() -> None:
    events: list[StageEvent] = []
    model = ScriptedChatClient([["one ", "two ", "three"], ["cut", RuntimeError("dropped")]])
    agent = Agent(model, observers=[TraceObserver(events.append)])
    seen: list[str] = []

    async def on_update(update: Any) -> None:
        seen.append(update.text)

    await agent.run("hi", on_update=on_update)
    with pytest.raises(RuntimeError):
        await agent.run("again", on_update=on_update)
    assert seen == ["one ", "two ", "three", "cut"]  # the wrapped on_update passes them on
    ok, failed = events
    assert ok.detail.startswith("1 message, 0 tools; streamed 3 updates, first after ")
    assert ok.detail.endswith(" ms")
    assert failed.outcome == "raised RuntimeError"
    assert "streamed 1 update, first after " in failed.detail


async def test_an_unstreamed_model_call_says_nothing_of_updates() -> None:
    events: list[StageEvent] = []
    agent = Agent(ScriptedChatClient(["ok"]), observers=[TraceObserver(events.append)])
    await agent.run("hi")
    (event,) = events
    assert event.detail == "1 message, 0 tools"
