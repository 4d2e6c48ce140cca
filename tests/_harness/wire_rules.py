"""The rules each vendor's server holds a conversation's tool calls to, with the words it
refuses them in: the loopback servers refuse what the real ones refuse.

Each function takes a request body as the vendor's SDK sent it and returns the
message of the 400 the real server answers, or ``None``. The rules and the
words are the vendors' own (their API references, and the errors their
servers send, as reported word for word in public issue threads):

- OpenAI chat completions: an assistant message with ``tool_calls`` is
  followed by one ``tool`` message per call; a ``tool`` message answers a
  call of the assistant message before its run of tool messages.
- OpenAI Responses: each ``function_call`` has a ``function_call_output``
  with its ``call_id``, and each output a call before it; a ``reasoning``
  item is followed by the output item it came with (a message of the
  assistant, a function call, or more reasoning), never by input.
- Anthropic Messages: each ``tool_use`` block of an assistant turn has its
  ``tool_result`` in the next turn, a user turn, and a ``tool_result``
  answers a ``tool_use`` of the turn before; a ``tool_use`` id matches
  ``^[a-zA-Z0-9_-]+$`` and is unique in the request (what a history made
  with another vendor's ids, such as ``functions.search:0`` or a ``call_0``
  in every turn, runs into).
- Gemini: a turn of function calls comes right after a user turn or a
  turn of function responses; the next turn holds as many function
  responses as it has calls (by id when they have ids), and a turn of
  function responses comes right after a turn of function calls.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["anthropic_problem", "gemini_problem", "openai_problem", "responses_problem"]

_TOOL_USE_ID = re.compile(r"[a-zA-Z0-9_-]+")


def openai_problem(body: Any) -> tuple[str, str] | None:
    """The chat completions server's refusal of ``body``: ``(message, param)``."""
    messages = _list(body, "messages")
    owed: list[str] = []  # the calls of the last assistant message still unanswered
    calls: set[str] = set()
    caller = -1
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in calls or call_id not in owed:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{index}].role",
                )
            owed.remove(call_id)
            continue
        if owed:
            return _unanswered(owed, caller)
        ids = [call.get("id") for call in message.get("tool_calls") or ()]
        calls, owed, caller = set(ids), list(ids), index
    if owed:
        return _unanswered(owed, caller)
    return None


def _unanswered(owed: Sequence[str], index: int) -> tuple[str, str]:
    return (
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(owed),
        f"messages.[{index}].role",
    )


def responses_problem(body: Any) -> str | None:
    """The Responses API server's refusal of ``body``'s ``input`` (a list of items)."""
    raw = body.get("input") if isinstance(body, Mapping) else None
    items = raw if isinstance(raw, list) else []
    called: set[str] = set()
    answered: set[str] = set()
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind == "function_call_output":
            if item.get("call_id") not in called:
                return (
                    "No tool call found for function call output with call_id "
                    f"{item.get('call_id')}."
                )
            answered.add(item["call_id"])
        elif kind == "function_call":
            called.add(item.get("call_id"))
        elif kind == "reasoning":
            following = items[index + 1] if index + 1 < len(items) else None
            if following is None or not _output_item(following):
                return (
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                    "required following item."
                )
    for call_id in sorted(called - answered):
        return f"No tool output found for function call {call_id}."
    return None


def _output_item(item: Mapping[str, Any]) -> bool:
    """Whether ``item`` is one a model's response holds (what reasoning comes before)."""
    if item.get("type") in ("reasoning", "function_call"):
        return True
    return item.get("role") == "assistant" and item.get("type", "message") == "message"


def anthropic_problem(body: Any) -> str | None:
    """The Messages API server's refusal of ``body``'s ``messages``."""
    messages = _list(body, "messages")
    seen: set[object] = set()
    for index, message in enumerate(messages):
        for number, block in enumerate(_blocks(message)):
            if block.get("type") != "tool_use":
                continue
            where = f"messages.{index}.content.{number}"
            ident = block.get("id")
            if not isinstance(ident, str) or not _TOOL_USE_ID.fullmatch(ident):
                return f"{where}.tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
            if ident in seen:
                return f"{where}: `tool_use` ids must be unique"
            seen.add(ident)
        uses = [b.get("id") for b in _blocks(message) if b.get("type") == "tool_use"]
        if uses:
            following = messages[index + 1] if index + 1 < len(messages) else None
            answered = set()
            if following is not None and following.get("role") == "user":
                answered = {
                    b.get("tool_use_id")
                    for b in _blocks(following)
                    if b.get("type") == "tool_result"
                }
            missing = [use for use in uses if use not in answered]
            if missing:
                return (
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message."
                )
        before = messages[index - 1] if index else None
        offered = (
            {b.get("id") for b in _blocks(before) if b.get("type") == "tool_use"}
            if before is not None and before.get("role") == "assistant"
            else set()
        )
        for number, block in enumerate(_blocks(message)):
            if block.get("type") == "tool_result" and block.get("tool_use_id") not in offered:
                return (
                    f"messages.{index}.content.{number}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` block "
                    "must have a corresponding `tool_use` block in the previous message."
                )
    return None


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def gemini_problem(body: Any) -> str | None:
    """The Gemini server's refusal of ``body``'s ``contents``."""
    contents = _list(body, "contents")
    for index, content in enumerate(contents):
        parts = [p for p in content.get("parts") or () if isinstance(p, Mapping)]
        calls = [p["functionCall"] for p in parts if "functionCall" in p]
        responses = [p["functionResponse"] for p in parts if "functionResponse" in p]
        before = contents[index - 1] if index else None
        if calls and (before is None or before.get("role") != "user"):
            return (
                "Please ensure that function call turn comes immediately after a user turn or "
                "after a function response turn."
            )
        if responses and (before is None or not _function_calls(before)):
            return (
                "Please ensure that function response turn comes immediately after a function "
                "call turn."
            )
        if calls:
            following = contents[index + 1] if index + 1 < len(contents) else None
            answers = [] if following is None else _function_responses(following)
            if len(answers) != len(calls) or _ids(answers) != _ids(calls):
                return (
                    "Please ensure that the number of function response parts is equal to the "
                    "number of function call parts of the function call turn."
                )
    return None


def _function_calls(content: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    parts = content.get("parts") or ()
    return [p["functionCall"] for p in parts if isinstance(p, Mapping) and "functionCall" in p]


def _function_responses(content: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    parts = content.get("parts") or ()
    return [
        p["functionResponse"] for p in parts if isinstance(p, Mapping) and "functionResponse" in p
    ]


def _ids(parts: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ids of calls or responses, sorted (those that have one)."""
    return sorted(str(p["id"]) for p in parts if p.get("id") is not None)


def _list(body: Any, key: str) -> list[Mapping[str, Any]]:
    value = body.get(key) if isinstance(body, Mapping) else None
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []
