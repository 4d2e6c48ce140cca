"""Message content in the GenAI conventions' JSON shape, recorded only when asked for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry.trace import Span

from raf._values.messages import ChatMessage

__all__ = ["messages_json", "record_input"]

# Content, when asked for --------------------------------------------------------------------


def record_input(span: Span, messages: Sequence[ChatMessage], tools: Sequence[Any]) -> None:
    system = [message.content or "" for message in messages if message.role == "system"]
    if system:
        span.set_attribute(
            "gen_ai.system_instructions",
            json.dumps([{"type": "text", "content": text} for text in system], ensure_ascii=False),
        )
    others = [message for message in messages if message.role != "system"]
    span.set_attribute("gen_ai.input.messages", messages_json(others))
    if tools:
        span.set_attribute(
            "gen_ai.tool.definitions",
            json.dumps(
                [
                    {
                        "type": "function",
                        "name": str(tool.name),
                        "description": str(getattr(tool, "description", "")),
                        "parameters": dict(getattr(tool, "parameters", {})),
                    }
                    for tool in tools
                ],
                ensure_ascii=False,
                default=str,
            ),
        )


def messages_json(messages: Sequence[ChatMessage]) -> str:
    """Messages in the GenAI conventions' JSON shape: a role and a list of parts."""
    return json.dumps([_message_parts(message) for message in messages], ensure_ascii=False)


def _message_parts(message: ChatMessage) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.role == "tool":
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.content}
        )
    elif message.content is not None:
        parts.append({"type": "text", "content": message.content})
    for call in message.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    return {"role": message.role, "parts": parts}
