"""Make docs/replay.md's example: a stored conversation replayed with ``raf replay``.

A support agent answered 40 questions (an order lookup every third turn, whose
result is long) and its store kept the conversation, as a served agent's does.
Then ``raf replay`` runs that conversation through the agent's config and
through a changed one (a window of 30 messages), offline. This script records
the conversation, writes the two configs, runs the command, and puts what it
printed into docs/replay.md (between the ``replay-output`` markers) and its
chart into docs/images/replay.svg.

    python docs/_replay_demo.py
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    HistoryProvider,
    SqliteSessionStore,
    ToolCall,
    tool,
)
from raf._cli import main

DOCS = Path(__file__).parent
TURNS = 40
TOOLS = '''
import raf


@raf.tool
def lookup_order(order: str) -> str:
    """The order's status and shipping history."""
    raise RuntimeError("a replay never runs a tool")
'''
CONFIG = """\
[agent]
name = "support"
instructions = "You are ACME's support agent. Be precise and kind."
tools = ["support_tools:lookup_order"]

[model]
client = "openai"
model = "gpt-4o-mini"
api_key_env = "ACME_KEY"

[[providers]]
kind = "memory"
"""


@tool
def lookup_order(order: str) -> str:
    """The order's status and shipping history."""
    return "\n".join(f"day {day}: parcel {order} scanned at hub {day % 7}" for day in range(30))


class Model:
    """The model of the recorded conversation: every third turn asks for the order first."""

    turn = 0

    async def complete(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        if self.turn % 3 == 2 and messages[-1].role == "user":
            call = ToolCall(f"c{self.turn}", "lookup_order", '{"order": "1234"}')
            return AgentResponse((ChatMessage.assistant(tool_calls=[call]),))
        return AgentResponse((ChatMessage.assistant(f"Here is what I found ({self.turn}). " * 6),))


async def record(db: Path) -> None:
    """The conversation, as the served agent stored it."""
    model = Model()
    agent = Agent(
        model,
        name="support",
        instructions="You are ACME's support agent. Be precise and kind.",
        tools=[lookup_order],
        stack=[HistoryProvider()],
    )
    async with SqliteSessionStore(db) as store:
        session = await store.get("ticket-4711")
        for turn in range(TURNS):
            model.turn = turn
            await agent.run(f"Question {turn}: where is my order 1234, and when?", session=session)


def replayed(folder: Path) -> str:
    """What ``raf replay`` prints for the two configs (run in ``folder``)."""
    (folder / "support_tools.py").write_text(TOOLS)
    (folder / "support.toml").write_text(CONFIG)
    (folder / "window.toml").write_text(CONFIG + "max_messages = 30\n")
    argv = [
        "replay", "support.toml", "--db", "sessions.db", "--session", "ticket-4711",
        "--against", "window.toml", "--chart", "replay.svg",
    ]  # fmt: skip
    printed = io.StringIO()
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        with contextlib.redirect_stdout(printed):
            status = main(argv)
    finally:
        os.chdir(cwd)
    if status != 0:
        raise SystemExit(f"raf replay failed ({status})")
    return printed.getvalue()


def main_() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        anyio.run(record, folder / "sessions.db")
        sys.path.insert(0, str(folder))
        output = replayed(folder)
        (DOCS / "images" / "replay.svg").write_text((folder / "replay.svg").read_text())
    page = DOCS / "replay.md"
    block = (
        "<!-- replay-output -->\n```text\n$ raf replay support.toml --db sessions.db "
        "--session ticket-4711 \\\n    --against window.toml --chart replay.svg\n"
        f"{output.rstrip()}\n```\n<!-- /replay-output -->"
    )
    text = page.read_text()
    page.write_text(
        re.sub(
            r"<!-- replay-output -->.*?<!-- /replay-output -->", lambda _: block, text, flags=re.S
        )
    )
    print(output)


if __name__ == "__main__":
    main_()
