"""A worker process for the durable-run crash tests and benchmark (tests/durable/test_recovery.py).

The tests kill it with SIGKILL and start another one. No pytest here:
benchmarks/bench_durable.py runs it too. Every model call, tool call and
provider stage appends a line to ``--log`` (with the process id), so the
test can tell what ran, where and how often.

    python tests/_harness/durable_worker.py run     --system-db URL --sessions F --log F --ids ID...
    python tests/_harness/durable_worker.py recover --system-db URL --sessions F --log F --ids ID...
    python tests/_harness/durable_worker.py decide  --system-db URL --sessions F --log F --ids ID...

``--sessions`` is a SQLite file or a ``postgresql://`` URL (the sessions in
PostgreSQL, perhaps the same database as DBOS's).
``run`` launches DBOS and runs one durable turn per workflow id (session id
= workflow id, or ``--session``), concurrently; ``recover`` launches DBOS (which recovers
this executor's pending runs), starts the ids DBOS has never seen, and
waits for all. Both print one JSON line per run: id, answer, history size.
A tool call logs ``tool start`` and ``tool done`` inside its step, and
``tool recorded`` from a tool middleware outside it, once DBOS has recorded
the step: a call with a ``tool recorded`` line has completed for DBOS.
``--hang model3`` makes the third model call hang (the test kills the
worker there: after the second of three tool calls); ``--hang post`` makes
the outermost post stage hang after the history was written.

``--approve`` makes the second tool call wait for approval: ``run`` logs
``waiting ID`` once the run waits for the decision inside DBOS (its wait
workflow has entered ``DBOS.recv``); ``decide`` (under an executor id of its
own, so its launch recovers nothing) approves every call that waits in each
session, and prints what the run did with the decision (when no run waits
for it, the new run it starts has the id ``ID-decided``).
``--approval-timeout 0`` makes a run end with its call pending, not wait.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from dbos import DBOS, SetWorkflowID

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ContextResult,
    Decision,
    HistoryProvider,
    PostgresSessionStore,
    SqliteSessionStore,
    ToolCall,
    tool,
)
from raf.durable import dbos_agent, idempotency_key

TOOL_CALLS = 3  # the model asks for three tool calls, one after the other, then answers


def _log(path: Path, line: str) -> None:
    # One short write per line in append mode: lines of concurrent writers do not interleave.
    with path.open("a") as file:
        file.write(f"{line} pid={os.getpid()} t={time.time():.3f}\n")


class CountingModel:
    """The scripted model: its answer follows from the messages, so any worker gives the same.

    Call n (n-1 tool results since the last user message: a session may hold
    earlier turns) asks for tool call n, up to three; then it answers with the
    sum of those tool results.
    """

    def __init__(self, log: Path, hang: str) -> None:
        self.log = log
        self.hang = hang

    async def complete(self, messages: Any, options: ChatOptions) -> AgentResponse:
        last = max(i for i, message in enumerate(messages) if message.role == "user")
        run = messages[last].content
        results = [message for message in messages[last:] if message.role == "tool"]
        number = len(results) + 1
        _log(self.log, f"model {run} {number}")
        if self.hang == "model3" and number == 3:
            await anyio.sleep_forever()
        if number <= TOOL_CALLS:
            call = ToolCall(f"call{number}", "square", json.dumps({"n": number}))
            return AgentResponse((ChatMessage.assistant(tool_calls=(call,)),))
        total = sum(int(message.content) for message in results)
        return AgentResponse((ChatMessage.assistant(f"sum={total}"),), raw={"calls": number})


class Journal:
    """A provider outside the history: logs its stages (and may hang after the history write)."""

    name = "journal"

    def __init__(self, log: Path, hang: str) -> None:
        self.log = log
        self.hang = hang

    async def on_invoking(
        self, agent: Any, session: Any, request: Any, options: Any
    ) -> ContextResult:
        return ContextResult()

    async def on_invoked(
        self, agent: Any, session: Any, request: Any, response: Any, error: Any
    ) -> None:
        _log(self.log, f"post {session.id} error={type(error).__name__}")
        if self.hang == "post":
            await anyio.sleep_forever()


def _second(call: ToolCall) -> bool:
    return bool(json.loads(call.arguments)["n"] == 2)


def square_tool(log: Path, seconds: float, approve: bool = False) -> Any:
    """The tool ``square``: logs its start and end with its idempotency key.

    With ``approve``, its call with n=2 waits for a person's approval.
    """

    @tool(approval=_second if approve else False)
    async def square(n: int) -> str:
        """The square of n."""
        _log(log, f"tool start {n} key={idempotency_key()}")
        if seconds:
            await anyio.sleep(seconds)  # a tool that takes a moment: a worker may die in it
        _log(log, f"tool done {n} key={idempotency_key()}")
        return str(n * n)

    return square


def build(
    log: Path,
    hang: str,
    tool_seconds: float = 0.05,
    approve: bool = False,
    approval_timeout: float = 600.0,
) -> Any:
    async def repeated(invocation: Any, call_next: Any) -> AgentResponse:
        _log(log, f"pre {invocation.session.id} repeated={invocation.repeated}")
        return await call_next(invocation)  # type: ignore[no-any-return]

    async def recorded(request: Any, call_next: Any) -> ChatMessage:
        # Outside the step: when this runs, DBOS has recorded the call (or replayed it).
        message = await call_next(request)
        run = request.invocation.session.id
        _log(log, f"tool recorded {request.arguments['n']} key={run}")
        return message  # type: ignore[no-any-return]

    agent = Agent(
        CountingModel(log, hang),
        name="durable-worker",
        tools=[square_tool(log, tool_seconds, approve)],
        tool_stack=[recorded],
        stack=[Journal(log, hang), HistoryProvider(), repeated],
    )
    return dbos_agent(agent, approval_timeout=approval_timeout)


def configure(system_db: str, executor: str) -> None:
    DBOS(
        config={
            "name": "raf-durable-worker",
            "system_database_url": system_db,
            "application_version": "raf-durable-worker-1",  # pinned: recovery matches it
            "executor_id": executor,
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,  # a quicker shutdown
        }
    )
    DBOS.launch()


async def run_one(agent: Any, store: Any, workflow_id: str, session_id: str) -> dict[str, Any]:
    session = await store.get(session_id)
    with SetWorkflowID(workflow_id):
        response = await agent.run(workflow_id, session=session)
    return {"id": workflow_id, "text": response.text, "history": len(await session.get_messages())}


async def wait_one(store: Any, workflow_id: str, session_id: str) -> dict[str, Any]:
    handle: Any = await DBOS.retrieve_workflow_async(workflow_id)
    response = await handle.get_result(polling_interval_sec=0.05)  # the whole turn
    session = await store.get(session_id)
    return {"id": workflow_id, "text": response.text, "history": len(await session.get_messages())}


async def decide_one(agent: Any, store: Any, workflow_id: str, session_id: str) -> dict[str, Any]:
    session = await store.get(session_id)
    listed = await session.list_pending()
    decisions = [Decision(call.token, approve=True) for call in listed]
    with SetWorkflowID(f"{workflow_id}-decided"):  # the id of a new run, if one starts
        response = await agent.run(decisions, session=session)
    return {"id": workflow_id, "text": response.text, "history": len(await session.get_messages())}


async def log_waiting(log: Path, workflow_id: str) -> None:
    """Log ``waiting ID`` once the run waits in ``DBOS.recv``."""
    while True:
        steps = await DBOS.list_workflow_steps_async(workflow_id)
        if any(step["function_name"] == "DBOS.sleep" for step in steps):  # recv's deadline
            _log(log, f"waiting {workflow_id}")
            return
        await anyio.sleep(0.02)


def sessions_store(sessions: str) -> Any:
    """The store of ``--sessions``: a SQLite file, or a PostgreSQL database's URL."""
    if sessions.startswith("postgresql://"):
        return PostgresSessionStore(sessions)
    return SqliteSessionStore(sessions)


async def main(args: argparse.Namespace) -> None:
    agent = build(Path(args.log), args.hang, args.tool_seconds, args.approve, args.approval_timeout)
    configure(args.system_db, args.executor)
    _log(Path(args.log), f"launched {args.mode}")  # DBOS has recovered this executor's runs
    async with sessions_store(args.sessions) as store:

        async def one(workflow_id: str) -> None:
            known = await DBOS.get_workflow_status_async(workflow_id)
            session_id = args.session or workflow_id
            if args.mode == "decide":
                result = await decide_one(agent, store, workflow_id, session_id)
            elif args.mode == "recover" and known is not None:
                result = await wait_one(store, workflow_id, session_id)
            else:
                result = await run_one(agent, store, workflow_id, session_id)
            print(json.dumps(result), flush=True)

        async with anyio.create_task_group() as group:
            for workflow_id in args.ids:
                group.start_soon(one, workflow_id)
                if args.approve and args.approval_timeout and args.mode == "run":
                    group.start_soon(log_waiting, Path(args.log), workflow_id)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["run", "recover", "decide"])
    parser.add_argument("--system-db", required=True)
    parser.add_argument("--sessions", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--executor", default="local")
    parser.add_argument("--hang", default="none", choices=["none", "model3", "post"])
    parser.add_argument("--tool-seconds", type=float, default=0.05)
    parser.add_argument("--approve", action="store_true")
    parser.add_argument("--approval-timeout", type=float, default=600.0)
    parser.add_argument("--ids", nargs="+", required=True)
    parser.add_argument("--session", help="every run's session (default: its own, its id)")
    arguments = parser.parse_args()
    try:
        anyio.run(main, arguments, backend="asyncio")
    finally:
        DBOS.destroy()
    sys.exit(0)
