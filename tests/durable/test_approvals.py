"""Approvals in a durable run: the run waits for the decision inside DBOS, in one process.

The run and the decision are two tasks here, each with its own session
object of one SQLite store (as two processes would be); the crash test
(a worker killed while it waits, real processes) is in
test_durable_recovery.py. DBOS is asyncio-only: these tests run on asyncio.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dbos import DBOS, SetWorkflowID

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    Decision,
    ScriptedChatClient,
    SqliteSessionStore,
    ToolCall,
)
from raf.durable import dbos_agent
from raf.errors import ApprovalError, DurableError
from tests._harness.durable_approval_kit import WIPE, Run, ended, launched, wipe_agent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # DBOS is asyncio-only


@pytest.fixture(scope="module", autouse=True)
def dbos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with launched(tmp_path_factory.mktemp("dbos"), "raf-approval-tests"):
        yield


async def _until_pending(store: SqliteSessionStore, run: Run) -> None:
    """Until the run asks for approval. A durable run holds its "approval" updates until
    the pass has stored its calls: a decision sent at once finds its call pending."""
    await run.waiting.wait()
    session = await store.get("s")
    listed = await session.list_pending()
    assert {call.token for call in listed} >= set(run.tokens)


@pytest.mark.anyio
async def test_an_approved_call_runs_inside_the_waiting_workflow(tmp_path: Path) -> None:
    agent, client, ran = wipe_agent(keyed=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "wf-approve", "wipe /tmp/x")
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await _until_pending(store, run)
            # Another session object, as another process would open it.
            decided = await agent.run(
                Decision(run.tokens[0], approve=True), session=await store.get("s")
            )
        history = await (await store.get("s")).get_messages()

    # The decider gets what the run did with its decision, as a plain agent's resume does.
    assert [m.role for m in decided.messages] == ["tool", "assistant"]
    assert decided.text == "all clean"
    assert decided.pending == ()
    # The original caller waited: it gets the whole turn, and saw it stream.
    assert run.response is not None
    assert run.response.text == "all clean"
    assert run.response.pending == ()
    assert [m.role for m in run.response.messages] == ["assistant", "tool", "assistant"]
    assert run.kinds == ["tool_call", "approval", "tool_result", "text"]
    # The approved call ran once, as a step of the run's own workflow.
    assert len(ran) == 1
    assert ran[0].startswith("/tmp/x@wf-approve:")
    assert len(client.requests) == 2
    # The history was written once: the turn with its call, then the result and the answer.
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[2] == ChatMessage.tool("c1", "wiped /tmp/x", name="wipe")
    # One workflow: the pass, its wait (recv), the pass the decision resumed.
    steps = {
        step["function_id"]: step["function_name"]
        for step in await DBOS.list_workflow_steps_async("wf-approve")
    }
    assert [step for step in steps.values() if step.startswith("raf.") or step == "DBOS.recv"] == [
        "raf.history", "raf.model", "DBOS.recv", "raf.history", "raf.tool.wipe", "raf.model",
        "raf.history",
    ]  # fmt: skip
    # Its idempotency key is the id of its step.
    (tool_step,) = [number for number, name in steps.items() if name == "raf.tool.wipe"]
    assert ran[0] == f"/tmp/x@wf-approve:{tool_step}"


@pytest.mark.anyio
async def test_a_denied_call_is_refused_with_the_reason_and_the_loop_goes_on(
    tmp_path: Path,
) -> None:
    agent, client, ran = wipe_agent(keyed=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "wf-deny", "wipe /tmp/x")
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await _until_pending(store, run)
            decision = Decision(run.tokens[0], approve=False, reason="not that folder")
            decided = await agent.run(decision, session=await store.get("s"))
    assert ran == []
    refusal = decided.messages[0]
    assert refusal.role == "tool"
    assert refusal.content == (
        "The user did not approve this call; it was not run. The user's reason: not that folder"
    )
    assert client.requests[1].messages[-1] == refusal  # the model read the refusal
    assert run.response is not None
    assert run.response.text == "all clean"


@pytest.mark.anyio
async def test_an_unknown_token_and_a_second_decision_are_approval_errors(tmp_path: Path) -> None:
    agent, client, ran = wipe_agent(keyed=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "wf-twice", "wipe /tmp/x")
        outcomes: list[object] = []

        async def decide(token: str) -> None:
            try:
                outcomes.append(
                    await agent.run(Decision(token, approve=True), session=await store.get("s"))
                )
            except ApprovalError as exc:
                outcomes.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await _until_pending(store, run)
            with pytest.raises(
                ApprovalError, match="no pending call has the token nope"
            ) as unknown:
                await agent.run(Decision("nope", approve=True), session=await store.get("s"))
            assert unknown.value.tokens == ("nope",)
            assert ran == []  # nothing ran: the run still waits
            async with anyio.create_task_group() as deciders:  # two at once: one wins
                deciders.start_soon(decide, run.tokens[0])
                deciders.start_soon(decide, run.tokens[0])
    errors = [outcome for outcome in outcomes if isinstance(outcome, ApprovalError)]
    responses = [outcome for outcome in outcomes if isinstance(outcome, AgentResponse)]
    assert len(errors) == 1
    assert len(responses) == 1
    assert responses[0].text == "all clean"
    assert len(ran) == 1
    assert ran[0].startswith("/tmp/x@wf-twice:")
    assert len(client.requests) == 2


@pytest.mark.anyio
async def test_a_wait_that_times_out_ends_the_run_pending_and_a_decision_resumes_it_later(
    tmp_path: Path,
) -> None:
    agent, client, ran = wipe_agent(approval_timeout=0.3, keyed=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        run = Run(agent, session, "wf-timeout", "wipe /tmp/x")
        await run()  # no decision comes: the wait ends after 0.3 s
        assert run.response is not None
        assert [p.token for p in run.response.pending] == run.tokens
        status = await DBOS.get_workflow_status_async("wf-timeout")
        assert status is not None
        assert status.status == "SUCCESS"
        # The calls stay pending in the session: a decision resumes them in a new durable run.
        with SetWorkflowID("wf-timeout-resumed"):
            decided = await agent.run(Decision(run.tokens[0], approve=True), session=session)
        assert decided.text == "all clean"
        # Its first steps read the history and claim the call from the store.
        assert ran == ["/tmp/x@wf-timeout-resumed:3"]
        history = await session.get_messages()
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert len(client.requests) == 2


@pytest.mark.anyio
async def test_an_agent_that_does_not_wait_ends_pending_as_a_plain_one(tmp_path: Path) -> None:
    agent, _, ran = wipe_agent(approval_timeout=0, keyed=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        with SetWorkflowID("wf-no-wait"):
            paused = await agent.run("wipe /tmp/x", session=session)
        assert len(paused.pending) == 1
        steps = await DBOS.list_workflow_steps_async("wf-no-wait")
        assert "DBOS.recv" not in [step["function_name"] for step in steps]  # it did not wait
        decided = await agent.run(
            [Decision(paused.pending[0].token, approve=True)], session=session
        )
        assert decided.text == "all clean"
        assert len(ran) == 1
        with pytest.raises(ApprovalError):  # decided already
            await agent.run(Decision(paused.pending[0].token, approve=True), session=session)


def test_a_decision_on_trio_is_a_durable_error() -> None:
    agent, client, _ = wipe_agent(keyed=True)

    async def decide() -> None:
        async with SqliteSessionStore(":memory:") as store:
            await agent.run(Decision("t", approve=True), session=await store.get("s"))

    with pytest.raises(DurableError, match="asyncio"):
        anyio.run(decide, backend="trio")
    assert client.requests == []


def test_the_approval_timeout_is_checked() -> None:
    for bad in (-1, float("inf"), float("nan"), "10", True):
        with pytest.raises(ValueError, match="approval_timeout"):
            dbos_agent(Agent(ScriptedChatClient()), name=f"bad-{bad}", approval_timeout=bad)  # type: ignore[arg-type]
    agent = dbos_agent(Agent(ScriptedChatClient()), name="test-durable-timeout", approval_timeout=5)
    assert agent.approval_timeout == 5.0


@pytest.mark.anyio
async def test_calls_decided_one_by_one_and_a_streamed_original_run(tmp_path: Path) -> None:
    second = ToolCall("c2", "wipe", '{"path": "/tmp/y"}')
    agent, client, ran = wipe_agent(
        [ScriptedChatClient.tool_turn(WIPE, second), "both handled"], keyed=True
    )
    kinds: list[str] = []
    tokens: list[str] = []
    decided: list[AgentResponse] = []
    async with SqliteSessionStore(tmp_path / "s.db") as store:

        async def decide() -> None:
            session = await store.get("s")
            decided.append(await agent.run(Decision(tokens[1], approve=True), session=session))
            refused = Decision(tokens[0], approve=False)
            decided.append(await agent.run(refused, session=session))

        async with anyio.create_task_group() as group:
            stream = agent.stream("wipe both", session=await store.get("s"))
            async with stream:
                async for update in stream:
                    kinds.append(update.kind)
                    if update.pending is not None:
                        tokens.append(update.pending.token)
                        if len(tokens) == 2:
                            group.start_soon(decide)
        history = await (await store.get("s")).get_messages()

    # The first decision leaves one call waiting: its answer says so, as a plain agent's does.
    assert [m.role for m in decided[0].messages] == ["tool"]
    assert [p.token for p in decided[0].pending] == tokens[:1]
    assert decided[1].text == "both handled"
    assert len(ran) == 1  # the approved one, once, as a step of the wait
    assert ran[0].startswith("/tmp/y@")
    # The original stream saw both calls wait, then the rest of the run, decided elsewhere
    # (A resumed pass tells again of the call that still waits, as a plain agent's does.)
    assert kinds == [
        "tool_call", "tool_call", "approval", "approval",  # the first pass
        "tool_result", "approval",  # the approved call ran; the other still waits
        "tool_result", "text",  # refused; the model answers
    ]  # fmt: skip
    assert stream.response is not None
    assert stream.response.text == "both handled"
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert len(client.requests) == 2


@pytest.mark.anyio
async def test_an_original_caller_that_gives_up_ends_the_wait_and_a_decision_resumes_later(
    tmp_path: Path,
) -> None:
    agent, _, ran = wipe_agent(approval_timeout=5, keyed=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        run = Run(agent, session, "wf-give-up", "wipe /tmp/x")
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await _until_pending(store, run)
            group.cancel_scope.cancel()  # the caller's way out: its own deadline, a closed page
        # Ended, not left waiting (nor resumed at the next launch).
        # Its wait had begun (the "approval" update says so): it ends, as one that timed out.
        assert await ended("wf-give-up") == "SUCCESS"
        # The call still waits in the session: a decision resumes it in a new durable run.
        decided = await agent.run(Decision(run.tokens[0], approve=True), session=session)
        assert decided.text == "all clean"
        assert len(ran) == 1


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_a_turn_with_pending_calls_is_written_once_and_a_decided_call_stays_decided(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from raf import PendingCall, RedisSessionStore

    store: Any
    if kind == "sqlite":
        store = SqliteSessionStore(tmp_path / "s.db")
    else:
        server = request.getfixturevalue("redis_server")
        store = RedisSessionStore(server.url, prefix=f"once-{tmp_path.name}", ttl=60)
    turn = [ChatMessage.user("wipe"), ChatMessage.assistant(tool_calls=(WIPE,))]
    pending = [PendingCall(WIPE, "token-1")]
    async with store:
        session = await store.get("s")
        assert await session.add_once("wf:1", turn, pending) is True
        assert await session.list_pending() == tuple(pending)  # recorded with the turn
        assert await session.claim_pending(["token-1"]) == (tuple(pending), ())  # decided
        # The run replayed after a crash makes the same write: nothing is stored again, and
        # the decided call is not brought back.
        assert await session.add_once("wf:1", turn, pending) is False
        assert await session.list_pending() == ()
        assert await session.get_messages() == tuple(turn)
        with pytest.raises(TypeError, match="PendingCall"):
            await session.add_once("wf:2", turn, ["token-2"])
        assert await session.get_messages() == tuple(turn)  # nothing half-written
