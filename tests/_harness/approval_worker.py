"""One agent process of the approval restart tests (``python -m tests._harness.approval_worker``).

    python -m tests._harness.approval_worker MODE DB SESSION MARKER BACKEND [TOKEN]

``DB`` is a SQLite file or a ``redis://`` URL. ``MODE`` ``pause`` runs a turn
whose model asks to delete ``a.txt`` (a tool that needs approval) and to
list the files, and prints the pending calls as JSON, then exits.
``resume`` (says it is ready with a file ``MARKER.ready.PID``, then waits
until the file ``MARKER.go`` exists, so that two processes start together)
approves ``TOKEN`` and prints ``{"text": ...}`` or ``{"error": "ApprovalError"}``.
The delete tool appends a line to ``MARKER`` each time it runs, so the test
counts runs across processes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio

import raf
from raf import Agent, Decision, ScriptedChatClient, ToolCall
from raf._sessions.stores import open_store
from raf.compression import check_tool_pairing
from raf.errors import ApprovalError

START_TIMEOUT = 60.0


async def main(mode: str, db: str, session_id: str, marker: str, token: str | None) -> None:
    @raf.tool(approval=True)
    async def delete(path: str) -> str:
        """Delete a file."""
        _note_run(marker, path)
        await anyio.sleep(0.2)  # the other process's claim comes while this one runs
        return f"deleted {path}"

    @raf.tool
    def listing() -> str:
        """List the files."""
        return "a.txt b.txt"

    turn = ScriptedChatClient.tool_turn(
        ToolCall("call_rm", "delete", '{"path": "a.txt"}'), ToolCall("call_ls", "listing")
    )
    model = ScriptedChatClient([turn] if mode == "pause" else ["All done."])
    agent = Agent(model, tools=[delete, listing], history=True)
    store = await open_store(db)
    try:
        session = await store.get(session_id)
        if mode == "pause":
            response = await agent.run("clean up", session=session)
            print(json.dumps([p.to_dict() for p in response.pending]))
            return
        assert token is not None
        await anyio.Path(f"{marker}.ready.{os.getpid()}").touch()
        with anyio.fail_after(START_TIMEOUT):
            # The signal comes from the test process: polling the file is the way to see it.
            while not await anyio.Path(f"{marker}.go").exists():  # noqa: ASYNC110
                await anyio.sleep(0.005)
        try:
            response = await agent.run(Decision(token, approve=True), session=session)
        except ApprovalError:
            print(json.dumps({"error": "ApprovalError"}))
            return
        sent = [m for m in model.requests[0].messages if m.role != "system"]
        print(json.dumps({"text": response.text, "valid": check_tool_pairing(sent) is None}))
    finally:
        await store.aclose()


def _note_run(marker: str, path: str) -> None:
    with Path(marker).open("a") as out:
        out.write(f"{path}\n")


if __name__ == "__main__":
    mode, db, session_id, marker, backend, *rest = sys.argv[1:]
    anyio.run(main, mode, db, session_id, marker, rest[0] if rest else None, backend=backend)
