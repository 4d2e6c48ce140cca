"""Approvals in a durable run: the original caller leaves (cancelled, its stream closed,
its on_update raising, its store closed) before or while a decision is applied, and an
operator cancels a wait mid-decision. Nothing hangs, nothing runs twice.

DBOS is asyncio-only: these tests run on asyncio. Every wait is bounded (fail_after).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dbos import DBOS, SetWorkflowID

from raf import AgentResponse, Decision, ScriptedChatClient, SqliteSessionStore, Update
from raf.errors import DurableError
from tests._harness.durable_approval_kit import (
    BOUND,
    WIPE,
    Run,
    SlowWipe,
    ended,
    launched,
    wipe_agent,
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # DBOS is asyncio-only


@pytest.fixture(scope="module", autouse=True)
def dbos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with launched(tmp_path_factory.mktemp("dbos"), "raf-approval-leaving-tests"):
        yield


@pytest.mark.anyio
async def test_a_stream_closed_while_its_run_waits(tmp_path: Path) -> None:
    agent, _, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE), "all clean"])
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        token = None
        with anyio.fail_after(BOUND), SetWorkflowID("edge-stream-close"):
            # The consumer leaves on seeing the approval: the run's pass has ended, its
            # wait has begun; the block ends now, not when the wait would time out.
            async with agent.stream("wipe", session=await store.get("s")) as stream:
                async for update in stream:
                    if update.pending is not None:
                        token = update.pending.token
                        break
        assert token is not None
        assert await ended("edge-stream-close") in ("SUCCESS", "CANCELLED")
        with anyio.fail_after(BOUND):
            decided = await agent.run(Decision(token, approve=True), session=await store.get("s"))
    assert decided.text == "all clean"
    assert ran == ["/tmp/x"]


@pytest.mark.anyio
async def test_a_stream_left_after_a_read_timed_out_while_its_run_waits(tmp_path: Path) -> None:
    agent, _, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE), "all clean"])
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        with anyio.fail_after(BOUND), SetWorkflowID("edge-stream-read-timeout"):
            async with agent.stream("wipe", session=await store.get("s")) as stream:
                async for update in stream:
                    if update.pending is not None:
                        break
                with anyio.move_on_after(0.3):  # no decision comes: the consumer gives up
                    await stream.__anext__()
        assert await ended("edge-stream-read-timeout") in ("SUCCESS", "CANCELLED")
        assert await (await store.get("s")).list_pending()  # still pending
    assert ran == []


@pytest.mark.anyio
async def test_an_on_update_that_raises_on_the_approval_leaves_no_wait_behind(
    tmp_path: Path,
) -> None:
    agent, _, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE), "all clean"])

    async def broken(update: Update) -> None:
        if update.kind == "approval":
            raise RuntimeError("the page is gone")

    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        with (
            anyio.fail_after(BOUND),
            SetWorkflowID("edge-broken-callback"),
            pytest.raises(RuntimeError, match="the page is gone"),
        ):
            await agent.run("wipe", session=session, on_update=broken)
        # Not left waiting, calling a broken callback.
        assert await ended("edge-broken-callback") in ("SUCCESS", "CANCELLED")
        listed = await session.list_pending()
        with anyio.fail_after(BOUND):
            decided = await agent.run(Decision(listed[0].token, approve=True), session=session)
    assert decided.text == "all clean"
    assert ran == ["/tmp/x"]


async def _until_waiting(run_id: str) -> None:
    """Until the run ``run_id`` waits for decisions (its calls are stored by then)."""
    if not await DBOS.get_event_async(run_id, "raf.waiting", timeout_seconds=BOUND):
        raise AssertionError(f"{run_id} did not begin to wait")


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["cancelled", "cancelled, no on_update", "stream closed"])
async def test_the_original_caller_leaves_while_an_approved_call_runs(
    how: str, tmp_path: Path
) -> None:
    """The person approves and closes the page at once: the wait applying the decision is
    let finish (the call runs once, the decider gets the answer), then it ends."""
    slow = SlowWipe()
    agent, started, release, ran = slow.agent, slow.started, slow.release, slow.ran
    run_id = f"edge-leave-{how}"
    decided: list[AgentResponse] = []
    async with SqliteSessionStore(tmp_path / "s.db") as store:

        async def decide(token: str) -> None:
            session = await store.get("s")
            decided.append(await agent.run(Decision(token, approve=True), session=session))

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as deciders:
                if how.startswith("cancelled"):
                    run = Run(agent, await store.get("s"), run_id, "wipe")
                    async with anyio.create_task_group() as group:
                        if how == "cancelled":
                            group.start_soon(run)
                            await run.waiting.wait()
                            deciders.start_soon(decide, run.tokens[0])
                        else:  # a caller that streams nothing: the token is read in the store
                            run.streams = False
                            group.start_soon(run)
                            await _until_waiting(run_id)
                            listed = await (await store.get("s")).list_pending()
                            deciders.start_soon(decide, listed[0].token)
                        await started.wait()
                        group.cancel_scope.cancel()  # the caller leaves while the call runs
                else:
                    with SetWorkflowID(run_id):
                        async with agent.stream("wipe", session=await store.get("s")) as stream:
                            async for update in stream:
                                if update.pending is not None:
                                    deciders.start_soon(decide, update.pending.token)
                                    await started.wait()
                                    break  # the consumer leaves while the call runs
                release.set()
            while True:  # the wait ends after that pass
                status = await DBOS.get_workflow_status_async(run_id)
                assert status is not None
                if status.status not in ("PENDING", "ENQUEUED"):
                    break
                await anyio.sleep(0.02)
        history = await (await store.get("s")).get_messages()
    assert ran == ["/tmp/x"]  # once: the decider did not run it again
    assert decided[0].text == "all clean"
    assert status.status == "SUCCESS"
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2].content == "wiped /tmp/x"


@pytest.mark.anyio
async def test_a_wait_cancelled_while_it_applies_a_decision_is_not_run_again(
    tmp_path: Path,
) -> None:
    """An operator cancels the wait (DBOS.cancel_workflow) while the approved call runs:
    the decider is told, and does not run the call a second time."""
    slow = SlowWipe()
    agent, started, release, ran = slow.agent, slow.started, slow.release, slow.ran
    outcome: list[object] = []
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-operator", "wipe")

        async def decide() -> None:
            session = await store.get("s")
            try:
                outcome.append(
                    await agent.run(Decision(run.tokens[0], approve=True), session=session)
                )
            except DurableError as exc:
                outcome.append(exc)

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                group.start_soon(decide)
                await started.wait()
                await DBOS.cancel_workflow_async("edge-operator")
                release.set()
        history = await (await store.get("s")).get_messages()
    assert ran == ["/tmp/x"]
    assert isinstance(outcome[0], DurableError), outcome
    assert "cancelled" in str(outcome[0])
    assert [m.role for m in history] == ["user", "assistant", "tool"]


@pytest.mark.anyio
async def test_a_caller_that_leaves_and_closes_its_store_while_a_call_runs(
    tmp_path: Path,
) -> None:
    slow = SlowWipe()
    agent, started, release, ran = slow.agent, slow.started, slow.release, slow.ran
    decided: list[AgentResponse] = []
    async with SqliteSessionStore(tmp_path / "s.db") as decider_store:

        async def decide(token: str) -> None:
            session = await decider_store.get("s")
            decided.append(await agent.run(Decision(token, approve=True), session=session))

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as deciders:
                async with SqliteSessionStore(tmp_path / "s.db") as caller_store:
                    with SetWorkflowID("edge-closes-store"):
                        session = await caller_store.get("s")
                        async with agent.stream("wipe", session=session) as stream:
                            async for update in stream:
                                if update.pending is not None:
                                    deciders.start_soon(decide, update.pending.token)
                                    await started.wait()
                                    break
                release.set()  # the caller's store is closed now
        history = await (await decider_store.get("s")).get_messages()
    assert ran == ["/tmp/x"]
    assert decided[0].text == "all clean"
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]


class _SlowClaim:
    """A session whose claims take a while after they are made (a slow store's answer)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim_pending(self, tokens: Any) -> Any:
        claimed = await self.inner.claim_pending(tokens)
        await anyio.sleep(0.3)
        return claimed


@pytest.mark.anyio
async def test_a_decider_cancelled_between_its_claim_and_its_send_still_sends(
    tmp_path: Path,
) -> None:
    """A claimed call is always sent to its wait: a decider's own deadline that passes in
    between does not strand it (the run would wait for it until its timeout)."""
    agent, _, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE), "all clean"])
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-decider-deadline", "wipe")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                session = _SlowClaim(await store.get("s"))
                with anyio.move_on_after(0.1):  # passes while the claim is answered
                    await agent.run(Decision(run.tokens[0], approve=True), session=session)
    assert run.response is not None
    assert run.response.text == "all clean"
    assert ran == ["/tmp/x"]
