"""A scripted A2A agent on 127.0.0.1: its card and its JSON-RPC answers, for the tests of
:class:`raf.A2AAgentTool` against an agent that lies, hangs or streams for ever.

Tests queue replies in the order the client asks (the card first, then each
JSON-RPC call) and read what it sent from :attr:`A2AServer.requests`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from tests._harness.loopback_server import Exchange, LoopbackServer, Received, sse

__all__ = ["A2AServer", "Received", "Reply", "card", "event"]


@attrs.frozen
class Reply:
    """One scripted answer: JSON ``body`` (or ``raw`` bytes), or a stream of ``events``
    (each a JSON-RPC result, ``pause`` seconds apart, then ``end``), maybe late or dropped."""

    status: int = 200
    body: Any = None
    raw: bytes | None = None
    events: tuple[Mapping[str, Any], ...] | None = None
    pause: float = 0.0
    end: Literal["done", "cut", "stall"] = "done"
    forever: bool = False  # the events again and again, until the client leaves
    delay: float = 0.0
    drop: bool = False
    headers: Mapping[str, str] = attrs.field(factory=dict)


class A2AServer(LoopbackServer[Reply]):
    """A scripted A2A agent; :attr:`url` is where it is served."""

    def __init__(self) -> None:
        super().__init__(lambda status, body, **kw: Reply(status, body, **kw))

    @property
    def url(self) -> str:
        return self.base_url.removesuffix("/v1")

    def respond(self, exchange: Exchange, request: Received, reply: Reply) -> None:
        ident = request.body.get("id") if isinstance(request.body, dict) else None
        if reply.events is not None:
            frames = (
                sse(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}))
                for result in _repeat(reply.events, reply.forever)
            )
            exchange.stream(
                frames, "text/event-stream", reply.headers, status=reply.status,
                pause=reply.pause, end=reply.end,
            )  # fmt: skip
            return
        data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
        exchange.send(reply.status, data, "application/json", reply.headers)


def _repeat(events: tuple[Mapping[str, Any], ...], forever: bool) -> Any:
    while True:
        yield from events
        if not forever:
            return


def card(rpc_url: str, name: str = "scripted") -> Reply:
    """The reply of a card whose JSON-RPC interface is ``rpc_url``."""
    body = {
        "name": name, "description": "a scripted agent", "version": "1",
        "supportedInterfaces": [
            {"url": rpc_url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        ],
        "capabilities": {"streaming": True}, "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"], "skills": [],
    }  # fmt: skip
    return Reply(body=body)


def event(state: str, task_id: str = "t1", text: str | None = None) -> dict[str, Any]:
    """A status update of task ``task_id`` (``TASK_STATE_...``), or an artifact chunk of
    ``text``."""
    if text is not None:
        artifact = {"artifactId": "a1", "parts": [{"text": text}]}
        return {"artifactUpdate": {"taskId": task_id, "contextId": "c1", "artifact": artifact,
                                   "append": True}}  # fmt: skip
    return {"statusUpdate": {"taskId": task_id, "contextId": "c1", "status": {"state": state}}}
