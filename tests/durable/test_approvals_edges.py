"""Approvals in a durable run, at their edges: several runs and deciders at once, a new
message while calls wait, a failure after the decision, a decision after a timeout.

DBOS is asyncio-only: these tests run on asyncio. Every wait is bounded (fail_after).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dbos import DBOS, SetWorkflowID

import raf
from raf import Agent, AgentResponse, Decision, ScriptedChatClient, SqliteSessionStore, ToolCall
from raf._agent.deferred import claim_decided
from raf.durable import dbos_agent
from raf.durable._agent import answer_of
from raf.durable._workflow import TOPIC, Delivery
from raf.errors import ApprovalError, ServerError
from tests._harness.durable_approval_kit import BOUND, WIPE, Run, launched, wipe_agent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # DBOS is asyncio-only


@pytest.fixture(scope="module", autouse=True)
def dbos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with launched(tmp_path_factory.mktemp("dbos"), "raf-approval-edge-tests"):
        yield


@pytest.mark.anyio
async def test_a_refusal_with_a_reason_then_the_model_asks_again(tmp_path: Path) -> None:
    again = ToolCall("c2", "wipe", '{"path": "/tmp/x/only-logs"}')
    agent, client, ran = wipe_agent(
        [ScriptedChatClient.tool_turn(WIPE), ScriptedChatClient.tool_turn(again), "done"]
    )
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-ask-again", "wipe /tmp/x")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                refused = Decision(run.tokens[0], approve=False, reason="too much")
                first = await agent.run(refused, session=await store.get("s"))
                assert len(first.pending) == 1
                assert first.pending[0].call == again
                second = await agent.run(
                    Decision(first.pending[0].token, approve=True), session=await store.get("s")
                )
        history = await (await store.get("s")).get_messages()
    assert "The user's reason: too much" in (client.requests[1].messages[-1].content or "")
    assert second.text == "done"
    assert ran == ["/tmp/x/only-logs"]
    assert run.response is not None
    assert run.response.text == "done"
    assert run.tokens[1:] == [first.pending[0].token]  # the original caller saw it ask again
    assert [m.role for m in history] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


@pytest.mark.anyio
async def test_two_sessions_waiting_at_once_and_a_crossed_decision(tmp_path: Path) -> None:
    agent, _, ran = wipe_agent(
        [ScriptedChatClient.tool_turn(WIPE), ScriptedChatClient.tool_turn(WIPE), "a", "b"]
    )
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run_a = Run(agent, await store.get("a"), "edge-two-a", "wipe")
        run_b = Run(agent, await store.get("b"), "edge-two-b", "wipe")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run_a)
                await run_a.waiting.wait()
                group.start_soon(run_b)
                await run_b.waiting.wait()
                assert run_a.tokens != run_b.tokens  # the session is in the token
                # B's token sent with A's session: an error, nothing runs.
                with pytest.raises(ApprovalError, match="no pending call"):
                    await agent.run(
                        Decision(run_b.tokens[0], approve=True), session=await store.get("a")
                    )
                # A mixed sequence: all or nothing.
                with pytest.raises(ApprovalError, match="none of the 2 decisions"):
                    await agent.run(
                        [Decision(run_a.tokens[0], approve=True), Decision("nope", approve=True)],
                        session=await store.get("a"),
                    )
                assert ran == []
                decided_b = await agent.run(
                    Decision(run_b.tokens[0], approve=False), session=await store.get("b")
                )
                decided_a = await agent.run(
                    Decision(run_a.tokens[0], approve=True), session=await store.get("a")
                )
    assert ran == ["/tmp/x"]
    assert decided_b.text == "a"
    assert decided_a.text == "b"
    assert run_a.response is not None
    assert run_a.response.text == "b"
    assert run_b.response is not None
    assert run_b.response.text == "a"


@pytest.mark.anyio
@pytest.mark.parametrize("answered", [True, False])
async def test_a_new_message_while_calls_wait_denies_them_and_ends_the_wait(
    answered: bool, tmp_path: Path
) -> None:
    """The original caller returns at once (not at its approval timeout), with the calls
    pending as when it paused; nothing of them runs. Also when the new message's run fails."""
    second: Any = "ok, I will not" if answered else ServerError("down", status_code=503)
    agent, _, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE), second])
    workflow_id = f"edge-new-message-{answered}"
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), workflow_id, "wipe /tmp/x")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                if answered:
                    answer = await agent.run("no, stop", session=await store.get("s"))
                    assert answer.text == "ok, I will not"
                else:
                    with pytest.raises(ServerError):
                        await agent.run("no, stop", session=await store.get("s"))
        with pytest.raises(ApprovalError):
            await agent.run(Decision(run.tokens[0], approve=True), session=await store.get("s"))
    assert ran == []
    assert run.error is None
    assert run.response is not None
    assert [p.token for p in run.response.pending] == run.tokens
    status = await DBOS.get_workflow_status_async(workflow_id)
    assert status is not None
    assert status.status == "SUCCESS"


@pytest.mark.anyio
async def test_a_model_failure_after_the_decision_reaches_both(tmp_path: Path) -> None:
    agent, _, ran = wipe_agent(
        [ScriptedChatClient.tool_turn(WIPE), ServerError("the model is down", status_code=503)]
    )
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-fail", "wipe /tmp/x")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                with pytest.raises(ServerError, match="the model is down"):
                    await agent.run(
                        Decision(run.tokens[0], approve=True), session=await store.get("s")
                    )
        history = await (await store.get("s")).get_messages()
    assert isinstance(run.error, ServerError), run.error
    assert ran == ["/tmp/x"]
    assert [m.role for m in history] == ["user", "assistant", "tool"]


@pytest.mark.anyio
async def test_two_deciders_of_two_calls_of_one_wait_at_once(tmp_path: Path) -> None:
    second = ToolCall("c2", "wipe", '{"path": "/tmp/y"}')
    agent, client, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE, second), "both handled"])
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-two-deciders", "wipe both")
        decided: list[AgentResponse] = []

        async def decide(token: str) -> None:
            session = await store.get("s")
            decided.append(await agent.run(Decision(token, approve=True), session=session))

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                run.calls = 2
                group.start_soon(run)
                await run.waiting.wait()
                async with anyio.create_task_group() as deciders:
                    deciders.start_soon(decide, run.tokens[0])
                    deciders.start_soon(decide, run.tokens[1])
        history = await (await store.get("s")).get_messages()
    assert sorted(ran) == ["/tmp/x", "/tmp/y"]
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert "both handled" in [d.text for d in decided]
    assert len(client.requests) == 2
    assert run.response is not None
    assert run.response.text == "both handled"  # the original caller gets the final answer


@pytest.mark.anyio
async def test_a_decider_slow_between_its_claim_and_its_send_still_reaches_the_wait(
    tmp_path: Path,
) -> None:
    """Two people decide the two calls of one turn at once; B claims its call, then is slow
    to send it (deliver() below, cut at that point). A's pass answers its call without
    calling the model (B's call has no answer yet): the wait goes on for B's decision,
    which ends the turn, and the original caller gets the final answer."""
    second = ToolCall("c2", "wipe", '{"path": "/tmp/y"}')
    agent, client, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE, second), "both handled"])
    wait_id = "edge-claimed-elsewhere"  # the run waits in its own workflow
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-claimed-elsewhere", "wipe both")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                run.calls = 2
                group.start_soon(run)
                await run.waiting.wait()
                late = Decision(run.tokens[1], approve=True)
                claimed_b = await claim_decided(await store.get("s"), [late])
                first = await agent.run(
                    Decision(run.tokens[0], approve=True), session=await store.get("s")
                )
                assert run.response is None  # the original caller still waits for B's decision
                await DBOS.send_async(wait_id, Delivery("b", (late,), claimed_b), TOPIC)
                answer = await answer_of(wait_id, "b")
        history = await (await store.get("s")).get_messages()
    assert [m.role for m in first.messages] == ["tool"]  # A's answer: its call's result
    assert first.pending == ()
    assert sorted(ran) == ["/tmp/x", "/tmp/y"]
    assert answer is not None
    assert answer.text == "both handled"
    assert run.response is not None
    assert run.response.text == "both handled"
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert len(client.requests) == 2


@pytest.mark.anyio
async def test_a_run_resumed_by_a_decision_after_a_timeout_waits_in_the_background(
    tmp_path: Path,
) -> None:
    second = ToolCall("c2", "wipe", '{"path": "/tmp/y"}')
    agent, client, ran = wipe_agent(
        [ScriptedChatClient.tool_turn(WIPE, second), "both handled"], approval_timeout=0.5
    )
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-background", "wipe both")
        with anyio.fail_after(BOUND):
            await run()  # no decision in time: it ends with both calls pending
            assert run.response is not None
            first, other = run.response.pending
            with SetWorkflowID("edge-background-2"):
                decided = await agent.run(
                    Decision(first.token, approve=False), session=await store.get("s")
                )
            assert decided.pending == (other,)  # at once, not after its wait
            status = await DBOS.get_workflow_status_async("edge-background-2")
            assert status is not None
            assert status.status == "PENDING"  # the wait goes on in the background
            last = await agent.run(
                Decision(other.token, approve=True), session=await store.get("s")
            )
        history = await (await store.get("s")).get_messages()
    assert last.text == "both handled"
    assert ran == ["/tmp/y"]
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert len(client.requests) == 2


@pytest.mark.anyio
async def test_a_streamed_decision_gets_the_answer_of_the_wait(tmp_path: Path) -> None:
    agent, _, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE), "all clean"])
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-streamed-decision", "wipe")
        kinds: list[str] = []
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                decision = Decision(run.tokens[0], approve=True)
                async with agent.stream(decision, session=await store.get("s")) as stream:
                    kinds.extend([update.kind async for update in stream])
    assert kinds == []  # the run's updates go to its original caller
    assert stream.response is not None
    assert stream.response.text == "all clean"
    assert ran == ["/tmp/x"]


@pytest.mark.anyio
async def test_the_model_asks_the_same_call_again_after_a_refusal(tmp_path: Path) -> None:
    """The same call id and arguments again: the same token, pending again in the same wait."""
    agent, _, ran = wipe_agent(
        [ScriptedChatClient.tool_turn(WIPE), ScriptedChatClient.tool_turn(WIPE), "done"]
    )
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-same-again", "wipe /tmp/x")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                refused = Decision(run.tokens[0], approve=False, reason="are you sure?")
                first = await agent.run(refused, session=await store.get("s"))
                assert [p.token for p in first.pending] == run.tokens[:1]  # the same token
                second = await agent.run(
                    Decision(run.tokens[0], approve=True), session=await store.get("s")
                )
    assert second.text == "done"
    assert ran == ["/tmp/x"]
    assert run.response is not None
    assert run.response.text == "done"


@pytest.mark.anyio
async def test_an_approved_tool_that_raises_is_told_to_the_model(tmp_path: Path) -> None:
    """A tool's own failure is its call's answer, as in a plain run: both callers get the
    model's final answer, and the failure is in the history."""

    @raf.tool(approval=True)
    async def wipe(path: str) -> str:
        """Wipe a path."""
        raise PermissionError(f"cannot wipe {path}")

    client = ScriptedChatClient([ScriptedChatClient.tool_turn(WIPE), "it failed, sorry"])
    agent = dbos_agent(
        Agent(client, tools=[wipe], history=True), name="edge-tool-raises", approval_timeout=30
    )
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        run = Run(agent, await store.get("s"), "edge-tool-raises", "wipe")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                decided = await agent.run(
                    Decision(run.tokens[0], approve=True), session=await store.get("s")
                )
    assert decided.text == "it failed, sorry"
    assert "cannot wipe /tmp/x" in (decided.messages[0].content or "")
    assert client.requests[1].messages[-1] == decided.messages[0]
    assert run.response is not None
    assert run.response.text == "it failed, sorry"


@pytest.mark.anyio
async def test_a_run_waits_and_is_decided_on_redis(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The wait reopens the session from its reference: a Redis one too."""
    from raf import RedisSessionStore

    server = request.getfixturevalue("redis_server")
    agent, _, ran = wipe_agent([ScriptedChatClient.tool_turn(WIPE), "all clean"])
    prefix = f"edge-{tmp_path.name}"
    async with RedisSessionStore(server.url, prefix=prefix, ttl=60) as store:
        run = Run(agent, await store.get("s"), "edge-redis", "wipe")
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                await run.waiting.wait()
                decided = await agent.run(
                    Decision(run.tokens[0], approve=True), session=await store.get("s")
                )
        history = await (await store.get("s")).get_messages()
    assert decided.text == "all clean"
    assert run.response is not None
    assert run.response.text == "all clean"
    assert ran == ["/tmp/x"]
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
