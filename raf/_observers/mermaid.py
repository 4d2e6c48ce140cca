"""Traces as pictures: an observer that draws each run as a Mermaid sequence diagram."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from raf._agent.tool_loop import ToolRequest
from raf._observers.tracing import _count, _describe_arguments, _describe_result
from raf._onion.observe import Observer, ProviderStage, RunStage
from raf._values.context import ChatRequest, Invocation
from raf._values.messages import AgentResponse, ChatMessage

__all__ = ["MermaidObserver"]

#: How many characters of a message or an error a label shows.
LABEL_SHOWN = 100


class MermaidObserver(Observer):
    """An observer that draws each run as a Mermaid sequence diagram (``raf run --trace=mermaid``).

    Lanes: the caller, raf (the engine), each provider in the order it first
    acts, the model, each tool. Each provider stage, model call and tool call
    is a call from raf and a return to it, drawn as it starts and as it ends,
    so the diagram shows what happened in the order it happened (concurrent
    tool calls interleave); a return that raised is a crossed arrow that
    names the error. ``emit`` gets the diagram's text when the run ends,
    however it ends. One run at a time: give each concurrent run its own.

    >>> import anyio
    >>> from raf import Agent, EchoChatClient
    >>> agent = Agent(EchoChatClient(), observers=[MermaidObserver(print)])
    >>> anyio.run(agent.run, "hi").text
    sequenceDiagram
        participant caller
        participant raf
        participant model
        caller->>raf: run: hi
        raf->>model: complete: 1 message, 0 tools
        model-->>raf: ok
        raf-->>caller: answer: hi
    'hi'
    """

    #: The post stages that providers inherit (no-ops) are drawn too: the diagram shows
    #: every layer of the onion, each entered and left.
    inherited_post_stages = True

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._lanes: dict[int, tuple[str, str]] = {}  # id of what acts -> (lane id, label)
        self._lines: list[str] = []

    def _lane(self, key: object, label: str, prefix: str) -> str:
        found = self._lanes.get(id(key))
        if found is None:
            taken = sum(1 for lane, _ in self._lanes.values() if lane.startswith(prefix))
            lane_id = f"{prefix}{taken + 1}"
            found = self._lanes[id(key)] = (lane_id, label)
        return found[0]

    def _draw(self, source: str, arrow: str, target: str, text: str) -> None:
        self._lines.append(f"    {source}{arrow}{target}: {_label(text)}")

    async def run(
        self, invocation: Invocation, call_next: Callable[[Invocation], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """One diagram per run: the caller's request, everything inside, and how it ended."""
        self._lanes, self._lines = {}, []
        asked = invocation.request_messages[-1].content if invocation.request_messages else None
        self._draw("caller", "->>", "raf", f"run: {asked or ''}")
        try:
            response = await call_next(invocation)
        except BaseException as exc:
            self._draw("raf", "--x", "caller", _raised(exc))
            raise
        else:
            self._draw("raf", "-->>", "caller", f"answer: {response.text}")
            return response
        finally:
            self._emit(self._render())

    async def provider_stage(self, stage: ProviderStage, call_next: RunStage) -> Any:
        """A stage: the call into the provider, and what came back (a pre stage's additions)."""
        lane = self._lane(stage.provider, stage.name, "p")
        self._draw("raf", "->>", lane, stage.stage)
        try:
            result = await call_next()
        except BaseException as exc:
            self._draw(lane, "--x", "raf", _raised(exc))
            raise
        back = _describe_result(result) if stage.stage == "on_invoking" else "done"
        self._draw(lane, "-->>", "raf", back)
        return result

    async def model_attempt(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Each call that reaches the model (each attempt of a retried call)."""
        self._lanes.setdefault(id(_MODEL), ("model", "model"))
        counts = (
            f"{_count(len(request.messages), 'message')}, "
            f"{_count(len(request.options.tools), 'tool')}"
        )
        self._draw("raf", "->>", "model", f"complete: {counts}")
        try:
            response = await call_next(request)
        except BaseException as exc:
            self._draw("model", "--x", "raf", _raised(exc))
            raise
        calls = response.messages[-1].tool_calls if response.messages else ()
        if calls:
            self._draw("model", "-->>", "raf", "tool calls: " + ", ".join(c.name for c in calls))
        else:
            self._draw("model", "-->>", "raf", "ok")
        return response

    async def tool_call(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """A tool call: its arguments, and the size of its result."""
        name = str(request.tool.name)
        lane = self._lane(request.tool, f"tool {name}", "t")
        self._draw("raf", "->>", lane, f"{name} {_describe_arguments(request.arguments)}")
        try:
            message = await call_next(request)
        except BaseException as exc:
            self._draw(lane, "--x", "raf", _raised(exc))
            raise
        self._draw(lane, "-->>", "raf", _count(len(message.content or ""), "char"))
        return message

    def _render(self) -> str:
        lanes = ["    participant caller", "    participant raf"]
        for lane_id, label in self._lanes.values():
            lanes.append(
                f"    participant {lane_id}"
                if lane_id == label
                else f"    participant {lane_id} as {_label(label)}"
            )
        return "\n".join(["sequenceDiagram", *lanes, *self._lines])


_MODEL = object()  # the key of the model's lane


def _raised(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"raised {type(error).__name__}" + (f": {text}" if text else "")


# Characters that end or break a Mermaid statement, as its entity codes (#code;).
_SPECIAL = re.compile(r"[#;<>]")


def _label(text: str) -> str:
    """Text that Mermaid shows as it is: one line, bounded, its special characters escaped."""
    text = " ".join(text.split())
    if len(text) > LABEL_SHOWN:
        text = text[: LABEL_SHOWN - 1] + "…"
    return _SPECIAL.sub(lambda m: f"#{ord(m.group())};", text)
