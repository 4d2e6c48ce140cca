"""What the tests of approvals in a durable run share: DBOS launched on a SQLite file,
a durable agent whose tool needs approval, and the original run in a task of its own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
from dbos import DBOS, SetWorkflowID

import raf
from raf import Agent, AgentResponse, ScriptedChatClient, ToolCall, Update
from raf.durable import DurableAgent, dbos_agent, idempotency_key

BOUND = 10.0  # no test may hang: each wait is bounded

WIPE = ToolCall("c1", "wipe", '{"path": "/tmp/x"}')

_names = iter(range(1_000_000))


@contextmanager
def launched(folder: Path, name: str) -> Iterator[None]:
    """DBOS launched on a SQLite system database in ``folder``, destroyed after."""
    DBOS(
        config={
            "name": name,
            "system_database_url": f"sqlite:///{folder / 'dbos.sqlite'}",
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,
        }
    )
    DBOS.launch()
    try:
        yield
    finally:
        DBOS.destroy()


def wipe_agent(
    script: list[Any] | None = None, approval_timeout: float = 30.0, *, keyed: bool = False
) -> tuple[DurableAgent, ScriptedChatClient, list[str]]:
    """A durable agent whose tool ``wipe`` needs approval; ``ran`` gets each wiped path
    (``keyed``: with the step's idempotency key, ``"path@key"``)."""
    ran: list[str] = []

    @raf.tool(approval=True)
    async def wipe(path: str) -> str:
        """Wipe a path."""
        ran.append(f"{path}@{idempotency_key()}" if keyed else path)
        return f"wiped {path}"

    client = ScriptedChatClient(script or [ScriptedChatClient.tool_turn(WIPE), "all clean"])
    agent = Agent(client, tools=[wipe], history=True)
    name = f"test-durable-kit-{next(_names)}"
    return dbos_agent(agent, name=name, approval_timeout=approval_timeout), client, ran


class SlowWipe:
    """A durable agent whose tool ``slow_wipe`` needs approval and runs until released."""

    def __init__(self) -> None:
        self.started, self.release = anyio.Event(), anyio.Event()
        self.ran: list[str] = []

        @raf.tool(approval=True)
        async def slow_wipe(path: str) -> str:
            """Wipe a path, slowly."""
            self.ran.append(path)
            self.started.set()
            await self.release.wait()
            return f"wiped {path}"

        call = ToolCall("c1", "slow_wipe", '{"path": "/tmp/x"}')
        client = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "all clean"])
        self.agent = dbos_agent(
            Agent(client, tools=[slow_wipe], history=True),
            name=f"test-durable-kit-slow-{next(_names)}",
            approval_timeout=30,
        )


class Run:
    """The original run in a task of its own: its response (or error) and the tokens it
    was asked to decide; ``waiting`` is set once ``calls`` calls were asked for."""

    def __init__(self, agent: DurableAgent, session: Any, workflow_id: str, text: str) -> None:
        self.agent, self.session, self.workflow_id, self.text = agent, session, workflow_id, text
        self.kinds: list[str] = []
        self.tokens: list[str] = []
        self.waiting = anyio.Event()
        self.response: AgentResponse | None = None
        self.error: BaseException | None = None
        self.calls = 1
        self.streams = True  # False: the run is given no on_update

    async def on_update(self, update: Update) -> None:
        self.kinds.append(update.kind)
        if update.kind == "approval":
            assert update.pending is not None
            self.tokens.append(update.pending.token)
            if len(self.tokens) >= self.calls:
                self.waiting.set()

    async def __call__(self) -> None:
        try:
            with SetWorkflowID(self.workflow_id):
                self.response = await self.agent.run(
                    self.text,
                    session=self.session,
                    on_update=self.on_update if self.streams else None,
                )
        except Exception as exc:
            self.error = exc


async def ended(workflow_id: str) -> str:
    """The status of ``workflow_id`` once it has ended (not waiting any more), within BOUND."""
    with anyio.fail_after(BOUND):
        while True:
            status = await DBOS.get_workflow_status_async(workflow_id)
            if status is not None and status.status not in ("PENDING", "ENQUEUED"):
                return str(status.status)
            await anyio.sleep(0.02)
