"""raf.testing.strategies: each strategy draws what it says, usable with @given."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import pytest
from hypothesis import given, settings

import raf
from raf import (
    AgentResponse,
    ChatMessage,
    ContextResult,
    Invocation,
    ScriptedChatClient,
    ToolCall,
    Update,
    merge,
)
from raf.compression import check_tool_pairing
from raf.testing.journal import RecordingStack
from raf.testing.strategies import (
    chat_messages,
    context_results,
    histories,
    stacks,
    tool_calls,
    updates,
)


@given(chat_messages())
def test_chat_messages_are_plain_messages(message: ChatMessage) -> None:
    assert type(message) is ChatMessage
    assert message.role in ("system", "user", "assistant")
    assert not message.tool_calls


@given(chat_messages(tool_traffic=True))
def test_chat_messages_with_tool_traffic(message: ChatMessage) -> None:
    if message.role == "tool":
        assert message.tool_call_id


@given(tool_calls())
def test_tool_calls_have_json_object_arguments(call: ToolCall) -> None:
    assert call.id
    assert call.name
    assert isinstance(json.loads(call.arguments), dict)


@given(histories())
@pytest.mark.slow
def test_histories_are_well_formed(history: tuple[ChatMessage, ...]) -> None:
    assert check_tool_pairing(history) is None


@given(context_results())
def test_context_results_merge(result: ContextResult) -> None:
    start = Invocation(None, raf.InMemorySession("s"), (), raf.AgentRunOptions())
    merged = merge(start, result)
    assert merged.tools == tuple(result.tools)


@given(updates())
def test_updates_assemble(script: list[Update]) -> None:
    assert all(type(update) is Update for update in script)
    response = AgentResponse.from_updates(script)
    assert AgentResponse.from_updates(list(response.to_updates())) == response


@settings(max_examples=60, deadline=None)
@given(stacks())
@pytest.mark.slow
def test_a_stack_run_keeps_the_journal_law(stack: RecordingStack) -> None:
    agent = raf.Agent(ScriptedChatClient(["ok"]), stack=stack.items)

    async def run() -> None:
        with contextlib.suppress(raf.ProviderError):  # a drawn stage failed
            await agent.run("hi")

    anyio.run(run)
    stack.check_journal()
    posts = [entry[1] for entry in stack.journal if entry[0] == "post"]
    assert sorted(posts) == sorted(stack.entered)


@settings(max_examples=30, deadline=None)
@given(stacks(failures=False))
@pytest.mark.slow
def test_a_stack_without_failures_never_fails(stack: RecordingStack) -> None:
    agent = raf.Agent(ScriptedChatClient(["ok"]), stack=stack.items)
    assert anyio.run(agent.run, "hi").text == "ok"
    stack.check_journal()


class Twice:
    """A broken middleware: calls the rest of the stack twice."""

    async def __call__(self, invocation: Invocation, call_next: Any) -> AgentResponse:
        await call_next(invocation)
        response: AgentResponse = await call_next(invocation)
        return response


@settings(max_examples=30, deadline=None)
@given(stacks(failures=False))
def test_check_journal_catches_a_middleware_that_runs_the_rest_twice(
    stack: RecordingStack,
) -> None:
    if not stack.entered:
        return
    agent = raf.Agent(ScriptedChatClient(["ok", "ok"]), stack=[Twice(), *stack.items])
    anyio.run(agent.run, "hi")
    with pytest.raises(AssertionError, match="the journal law says"):
        stack.check_journal()
