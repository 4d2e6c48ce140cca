"""Drive a provider's tools through a real Agent run, the model calling them one turn at a time."""

from __future__ import annotations

import json
from typing import Any

from raf import Agent, ScriptedChatClient, ToolCall


async def call_tools(provider: Any, *calls: tuple[str, dict[str, Any]]) -> list[str]:
    """The model calls ``calls`` one turn after another; the tool results in order."""
    turns = [
        ScriptedChatClient.tool_turn(ToolCall(f"c{i}", name, json.dumps(arguments)))
        for i, (name, arguments) in enumerate(calls)
    ]
    client = ScriptedChatClient([*turns, "done"])
    response = await Agent(client, stack=[provider]).run("go")
    return [m.content or "" for m in response.messages if m.role == "tool"]
