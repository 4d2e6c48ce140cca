"""The tool loop's caller tools (``runs_on_client``), a run's own tools, and tool_choice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest

from raf import (
    Agent,
    AgentRunOptions,
    ChatMessage,
    InMemorySession,
    ScriptedChatClient,
    ToolCall,
    tool,
)
from raf.errors import ToolConflictError

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@attrs.frozen
class CallerTool:
    """A tool the caller runs: raf must never invoke it."""

    name: str = "lookup"
    description: str = "Look a word up."
    parameters: Mapping[str, Any] = attrs.field(factory=lambda: {"type": "object"})
    runs_on_client: bool = True

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        raise AssertionError("a caller's tool was invoked")


async def test_a_call_of_a_caller_tool_ends_the_run_after_the_agents_own_calls() -> None:
    mine, theirs = ToolCall("c1", "add", '{"a": 1, "b": 2}'), ToolCall("c2", "lookup", "{}")
    client = ScriptedChatClient([turn(mine, theirs, text="Working.")])
    agent = Agent(client, tools=[add])
    response = await agent.run("go", options=AgentRunOptions(tools=[CallerTool()]))
    assert [m.role for m in response.messages] == ["assistant", "tool"]
    assert response.messages[1].content == "3"
    assert response.tool_calls == (mine, theirs)
    assert len(client.requests) == 1
    assert [t.name for t in client.requests[0].options.tools] == ["add", "lookup"]


async def test_the_callers_result_in_the_next_request_goes_on_in_a_session() -> None:
    call = ToolCall("c2", "lookup", "{}")
    client = ScriptedChatClient([turn(call), "It means 'cat'."])
    agent = Agent(client, history=True)
    session = InMemorySession()
    options = AgentRunOptions(tools=[CallerTool()])
    await agent.run("what is 'neko'?", session=session, options=options)
    answer = await agent.run([ChatMessage.tool("c2", "cat")], session=session, options=options)
    assert answer.text == "It means 'cat'."
    sent = client.requests[1].messages
    # The caller's result answers the call once: no refusal of an "interrupted" call.
    assert [(m.role, m.content) for m in sent[-2:]] == [("assistant", None), ("tool", "cat")]


async def test_a_run_tool_named_like_an_agent_tool_is_a_conflict() -> None:
    agent = Agent(ScriptedChatClient(["x"]), tools=[add])
    with pytest.raises(ToolConflictError, match="add"):
        await agent.run("go", options=AgentRunOptions(tools=[CallerTool(name="add")]))


async def test_tool_choice_goes_with_the_first_model_call_only() -> None:
    call = ToolCall("c1", "add", '{"a": 1, "b": 2}')
    client = ScriptedChatClient([turn(call), "3"])
    await Agent(client, tools=[add]).run("go", options=AgentRunOptions(tool_choice="required"))
    assert [r.options.tool_choice for r in client.requests] == ["required", "auto"]
