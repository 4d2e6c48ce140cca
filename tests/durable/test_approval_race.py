"""A decision raced against the caller leaving: once accepted, the approved call runs once.

The outside red team's case: the caller that waits for its run's approval leaves a few
milliseconds after a decision was sent (its task cancelled). At every offset, on a SQLite
and on a Postgres system database, the decider gets no error, the tool runs exactly once,
and the history holds the turn once. DBOS is asyncio-only: these tests run on asyncio.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dbos import DBOS

from raf import AgentResponse, Decision, SqliteSessionStore
from tests._harness.durable_approval_kit import BOUND, Run, wipe_agent
from tests._harness.postgres_server import PostgresServer, postgres_bin

pytestmark = pytest.mark.slow

#: When the caller leaves, in seconds after the decision was sent: 0 to 60 ms.
OFFSETS = [ms / 1000 for ms in range(0, 61, 5)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # DBOS is asyncio-only


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def dbos(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('dbos') / 'dbos.sqlite'}"
        yield from _launched(url)
        return
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (make test installs it)")
    with PostgresServer() as server:
        yield from _launched(server.url("raf_race_test"))


def _launched(url: str) -> Iterator[str]:
    DBOS(
        config={
            "name": "raf-approval-race-tests",
            "system_database_url": url,
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,
        }
    )
    DBOS.launch()
    try:
        yield url
    finally:
        # The last trials' workflows finish first: a write still under way when the
        # Postgres server stops would retry in a DBOS thread until the worker exits.
        DBOS.destroy(workflow_completion_timeout_sec=5)


async def _trial(folder: Path, index: int, offset: float) -> tuple[Any, list[str], list[Any]]:
    agent, _, ran = wipe_agent()
    async with SqliteSessionStore(folder / f"s{index}.db") as store:
        session = await store.get("s")
        run = Run(agent, session, f"race-{folder.name}-{index}", "wipe")
        outcome: list[AgentResponse | BaseException] = []

        async def decide(token: str) -> None:
            try:
                decider = await store.get("s")
                outcome.append(await agent.run(Decision(token, approve=True), session=decider))
            except Exception as exc:
                outcome.append(exc)

        with anyio.fail_after(BOUND * 3):
            async with anyio.create_task_group() as deciders, anyio.create_task_group() as caller:
                caller.start_soon(run)
                await run.waiting.wait()  # held until the call is recorded: a decision finds it
                deciders.start_soon(decide, run.tokens[0])
                await anyio.sleep(offset)
                caller.cancel_scope.cancel()  # the caller leaves
            history = list(await (await store.get("s")).get_messages())
    return outcome[0], ran, history


@pytest.mark.anyio
async def test_a_decision_raced_against_the_caller_leaving_runs_the_call_once(
    dbos: str, tmp_path: Path
) -> None:
    for index, offset in enumerate(OFFSETS):
        outcome, ran, history = await _trial(tmp_path, index, offset)
        where = f"caller left {offset * 1000:.0f} ms after the decision ({dbos.split(':')[0]})"
        assert isinstance(outcome, AgentResponse), f"{where}: the decider got {outcome!r}"
        assert ran == ["/tmp/x"], f"{where}: the tool ran {len(ran)} times"
        tools = [m for m in history if m.role == "tool"]
        assert [m.tool_call_id for m in tools] == ["c1"], f"{where}: {history}"
        assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"], where
