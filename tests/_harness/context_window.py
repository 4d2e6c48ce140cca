"""What a vendor's server does with the size of a prompt, for the loopback servers.

:class:`Window` refuses a prompt longer than the model's window in the vendor's own
words (OpenAI chat completions and Responses ``context_length_exceeded``, Anthropic's
``prompt is too long``, Gemini's ``INVALID_ARGUMENT``), before any scripted answer is
taken. :class:`ResponsesCompaction` and :class:`AnthropicCompaction` compact on the
server past the threshold a request asks for, as those wires do: the Responses API's
``context_management`` (and ``POST /responses/compact``), Anthropic's
``compact_20260112`` edit behind its beta. Both refuse, as a 400, what their vendor
refuses: fields the SDK's own request types do not have, a compaction item the server
never issued, Anthropic's edit without its beta or under its minimum trigger. What
they send is checked against the SDK's own response types first.

Sizes are a rough count (a token per four characters of what the prompt holds), the
same for every vendor, so a test can say how long a history is in the server's count.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import attrs

Vendor = Literal["openai", "responses", "anthropic", "gemini"]

#: The parts of a request body that are the prompt, on each wire.
_PROMPT = ("instructions", "input", "system", "messages", "tools", "systemInstruction", "contents")
#: Anthropic's smallest trigger for its compaction edit, in input tokens.
ANTHROPIC_MIN_TRIGGER = 50_000
ANTHROPIC_BETA = "compact-2026-01-12"


def prompt_tokens(body: Any, vendor: Vendor = "openai") -> int:
    """The server's count of a request's prompt. Anthropic bills nothing before a
    compaction block (it drops it), so its count starts at the last one."""
    if not isinstance(body, Mapping):
        return 0
    parts = {key: body.get(key) for key in _PROMPT if key in body}
    if vendor == "anthropic" and isinstance(parts.get("messages"), list):
        messages = parts["messages"]
        for index in range(len(messages) - 1, -1, -1):
            if _blocks_of(messages[index], "compaction"):
                parts["messages"] = messages[index:]
                break
    return len(json.dumps(parts)) // 4


@attrs.define
class Window:
    """A model's context window of ``max_tokens``: a longer prompt is refused with HTTP
    400 and the body ``vendor``'s server sends (:meth:`refusal`)."""

    vendor: Vendor
    max_tokens: int

    def refusal(self, path: str, body: Any) -> tuple[int, Any] | None:
        """The status and body of the refusal of a prompt past the window (a list: the
        events of a stream), else ``None`` (a compaction request is never refused:
        compacting is what it is for)."""
        if path.endswith("/compact"):
            return None
        size = prompt_tokens(body, self.vendor)
        if size <= self.max_tokens:
            return None
        if self.vendor == "openai":
            message = (
                f"This model's maximum context length is {self.max_tokens} tokens. However, "
                f"your messages resulted in {size} tokens. Please reduce the length of the "
                "messages."
            )
            return 400, _openai_error(message, "messages")
        if self.vendor == "responses":
            message = (
                "Your input exceeds the context window of this model. Please adjust your "
                "input and try again."
            )
            error = _openai_error(message, "input")
            if body.get("stream") is True:
                # Streamed, the API answers 200 and says it in an error event.
                created = {"type": "response.created", "sequence_number": 1}
                failed = {"type": "error", "sequence_number": 2, **error}
                failed["error"] = {"type": "invalid_request_error", **error["error"]}
                return 200, [created, failed]
            return 400, error
        if self.vendor == "anthropic":
            message = f"prompt is too long: {size} tokens > {self.max_tokens} maximum"
            return 400, {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": message},
            }
        message = (
            f"The input token count ({size}) exceeds the maximum number of tokens allowed "
            f"({self.max_tokens})."
        )
        return 400, {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}


def _openai_error(message: str, param: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": "context_length_exceeded",
        }
    }


def _keys(typed: Any) -> frozenset[str]:
    """The keys an SDK request type (a TypedDict) has."""
    return frozenset(typed.__required_keys__ | typed.__optional_keys__)


def _blocks_of(message: Any, kind: str) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == kind]


@attrs.define
class ResponsesCompaction:
    """The Responses API's compaction: past a request's ``compact_threshold`` the
    output opens with a compaction item; ``/responses/compact`` answers a compacted
    response; an input's compaction item must be one this server issued.

    ``issued`` maps each item's encrypted content to the input it replaced (what a
    test reads to see what was compacted)."""

    issued: dict[str, Any] = attrs.field(factory=dict)
    _count: Any = attrs.field(factory=lambda: itertools.count(1))

    def problem(self, body: Any) -> str | None:
        """Why the server refuses ``body`` (a 400), or ``None``."""
        from openai.types.responses import ResponseCompactionItemParamParam
        from openai.types.responses.response_create_params import ContextManagement

        for entry in body.get("context_management") or ():
            if set(entry) - _keys(ContextManagement) or entry.get("type") != "compaction":
                return f"context_management: unknown entry {entry!r}"
        for item in body.get("input") or ():
            if isinstance(item, dict) and item.get("type") == "compaction":
                if set(item) - _keys(ResponseCompactionItemParamParam):
                    return f"input: a compaction item with unknown fields: {sorted(item)}"
                if item.get("encrypted_content") not in self.issued:
                    return "The encrypted content could not be verified."
        return None

    def item(self, replaced: Any) -> dict[str, Any]:
        """A new compaction item standing for ``replaced``, checked as the SDK's type."""
        from openai.types.responses import ResponseCompactionItem

        number = next(self._count)
        item = {"type": "compaction", "id": f"cmp_{number}", "encrypted_content": f"enc-{number}"}
        item["created_by"] = "compaction"  # output metadata an input item does not take
        ResponseCompactionItem.model_validate(item)
        self.issued[item["encrypted_content"]] = replaced
        return item

    def answer(self, body: Any, answer: Mapping[str, Any]) -> dict[str, Any]:
        """``answer`` as the server sends it to ``body``: a compaction item first in its
        output when the input is past the threshold the request asked for."""
        from openai.types.responses import Response

        answer = dict(answer)
        thresholds = [
            entry.get("compact_threshold")
            for entry in body.get("context_management") or ()
            if entry.get("compact_threshold") is not None
        ]
        if thresholds and prompt_tokens(body, "responses") > min(thresholds):
            answer["output"] = [self.item(body.get("input")), *answer["output"]]
        Response.model_validate(answer)
        return answer

    def compacted(self, body: Any) -> dict[str, Any]:
        """The reply to ``POST /responses/compact``: a compacted response whose output is
        one compaction item (checked as the SDK's ``CompactedResponse``; its docstring
        speaks of the user messages before the item, which its output type, assistant
        messages only, cannot hold: the item alone it is)."""
        from openai.types.responses import CompactedResponse

        size = prompt_tokens(body)
        reply = {
            "id": "resp_compact",
            "object": "response.compaction",
            "created_at": 1700000000,
            "output": [self.item(body.get("input"))],
            "usage": {
                "input_tokens": size,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 40,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": size + 40,
            },
        }
        CompactedResponse.model_validate(reply)
        return reply


@attrs.define
class AnthropicCompaction:
    """Anthropic's ``compact_20260112`` edit: past its trigger (150,000 input tokens by
    default, 50,000 at least) the answer's content opens with a ``compaction`` block
    that carries a summary; the edit and a compaction block in the messages need the
    ``compact-2026-01-12`` beta; a block must be one this server issued.

    ``issued`` maps each block's encrypted content to the messages it replaced."""

    issued: dict[str, Any] = attrs.field(factory=dict)
    _count: Any = attrs.field(factory=lambda: itertools.count(1))

    def problem(self, body: Any, headers: Mapping[str, str]) -> str | None:
        """Why the server refuses ``body`` (a 400), or ``None``."""
        from anthropic.types.beta import (
            BetaCompact20260112EditParam,
            BetaCompactionBlockParam,
            BetaContextManagementConfigParam,
        )

        betas = {b.strip() for b in headers.get("anthropic-beta", "").split(",")}
        management = body.get("context_management")
        if management is not None:
            if set(management) - _keys(BetaContextManagementConfigParam):
                return f"context_management: unknown fields {sorted(management)}"
            for edit in management.get("edits") or ():
                if edit.get("type") != "compact_20260112":
                    continue
                if ANTHROPIC_BETA not in betas:
                    return f"context_management.edits: compact_20260112 needs {ANTHROPIC_BETA}"
                if set(edit) - _keys(BetaCompact20260112EditParam):
                    return f"context_management.edits: unknown fields {sorted(edit)}"
                trigger = (edit.get("trigger") or {}).get("value", 150_000)
                if trigger < ANTHROPIC_MIN_TRIGGER:
                    return (
                        "context_management.edits.0.trigger.value: Input should be greater "
                        f"than or equal to {ANTHROPIC_MIN_TRIGGER}"
                    )
        for message in body.get("messages") or ():
            for block in _blocks_of(message, "compaction"):
                if ANTHROPIC_BETA not in betas:
                    return f"messages: a compaction block needs the {ANTHROPIC_BETA} beta"
                if set(block) - _keys(BetaCompactionBlockParam):
                    return f"messages: a compaction block with unknown fields {sorted(block)}"
                if block.get("encrypted_content") not in self.issued:
                    return "messages: a compaction block this server did not issue"
        return None

    def answer(self, body: Any, answer: Mapping[str, Any]) -> dict[str, Any]:
        """``answer`` as the server sends it to ``body``: a compaction block first in its
        content when the prompt is past the edit's trigger."""
        from anthropic.types.beta import BetaMessage

        answer = dict(answer)
        triggers = [
            (edit.get("trigger") or {}).get("value", 150_000)
            for edit in (body.get("context_management") or {}).get("edits") or ()
            if edit.get("type") == "compact_20260112"
        ]
        if triggers and prompt_tokens(body, "anthropic") > min(triggers):
            number = next(self._count)
            block = {
                "type": "compaction",
                "content": f"Summary {number}: what was said before.",
                "encrypted_content": f"enc-a{number}",
            }
            self.issued[block["encrypted_content"]] = body.get("messages")
            answer["content"] = [block, *answer["content"]]
        BetaMessage.model_validate(answer)
        return answer


def summary_block_events(index: int, block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The events that stream a compaction block: started empty, one ``compaction_delta``
    with its summary and metadata, stopped."""
    delta = {"type": "compaction_delta", "content": block.get("content")}
    delta["encrypted_content"] = block.get("encrypted_content")
    started = {"type": "compaction", "content": None}
    return [
        {"type": "content_block_start", "index": index, "content_block": started},
        {"type": "content_block_delta", "index": index, "delta": delta},
        {"type": "content_block_stop", "index": index},
    ]


def sizes(messages: Sequence[Any]) -> int:
    """The server's count of a list of wire messages (for a test's bounds)."""
    return len(json.dumps(list(messages))) // 4
