"""A cut tool result spilled in one process's store and read back after a restart.

Shared by the tests of every store (tests/sessions/test_*_spill.py): the
first agent's tool returns a long log, which ToolOutputLimit cuts and spills;
the store is closed, opened again, and a second agent reads the full log back
with read_tool_result.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from raf import Agent, ScriptedChatClient, ToolCall, ToolOutputLimit, tool

#: The long result: 3,000 lines, one of which the second agent looks for.
LOG = "\n".join(f"row {number}" for number in range(3000))

turn = ScriptedChatClient.tool_turn


@tool
def dump() -> str:
    """The whole log."""
    return LOG


async def spill_survives_restart(open_store: Callable[[], AbstractAsyncContextManager[Any]]) -> str:
    """Run the two agents around a restart; the text read_tool_result gave the second."""
    first = ScriptedChatClient([turn(ToolCall("call_big", "dump", "{}")), "seen"])
    async with open_store() as store:
        session = await store.get("spilled")
        agent = Agent(first, tools=[dump], tool_stack=[ToolOutputLimit(1000)], history=True)
        await agent.run("dump the log", session=session)
        stored = [m.content for m in await session.get_messages() if m.role == "tool"]
    assert len(stored[0] or "") <= 1000  # the history holds the cut text
    arguments = json.dumps({"call_id": "call_big", "pattern": "^row 2999$"})
    second = ScriptedChatClient([turn(ToolCall("r1", "read_tool_result", arguments)), "found"])
    async with open_store() as store:
        session = await store.get("spilled")
        agent = Agent(second, tools=[dump], tool_stack=[ToolOutputLimit(1000)], history=True)
        response = await agent.run("find the last row", session=session)
        assert await session.spilled_tool_result("call_big") == LOG
        assert await session.spilled_tool_result("call_other") is None
    # The history holds a cut result: the read tool is offered from the first call on.
    assert [t.name for t in second.requests[0].options.tools] == ["dump", "read_tool_result"]
    return next(m.content or "" for m in response.messages if m.role == "tool")
