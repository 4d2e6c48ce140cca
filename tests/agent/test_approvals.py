"""Approvals: declaring, pausing, resuming, refusing, and the errors of a decision."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import pytest

import raf
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ContextProvider,
    ContextResult,
    Decision,
    InMemorySession,
    PendingCall,
    ScriptedChatClient,
    ToolCall,
    Update,
)
from raf.compression import check_tool_pairing
from raf.errors import ApprovalError

pytestmark = pytest.mark.anyio


class Tools:
    """A delete tool that needs approval and a list tool that does not, counting runs."""

    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.listed = 0
        self.gate: anyio.Event | None = None

        @raf.tool(approval=True)
        async def delete(path: str) -> str:
            """Delete a file."""
            if self.gate is not None:
                await self.gate.wait()
            self.deleted.append(path)
            return f"deleted {path}"

        @raf.tool
        def listing() -> str:
            """List the files."""
            self.listed += 1
            return "a.txt b.txt"

        self.delete, self.listing = delete, listing


# What the model reads for a call that did not run (docs/approvals.md): the text is the behaviour.
DENIED = "The user did not approve this call; it was not run."
SUPERSEDED = "The user did not approve this call (they sent a new message instead); it was not run."
INTERRUPTED = "This call was interrupted before its result was stored; it may or may not have run."


def delete_call(path: str, call_id: str | None = None) -> ToolCall:
    return ToolCall(call_id or f"call_{path}", "delete", json.dumps({"path": path}))


def agent_for(script: list[Any], tools: Tools, **kwargs: Any) -> Agent:
    return Agent(
        ScriptedChatClient(script), tools=[tools.delete, tools.listing], history=True, **kwargs
    )


async def token_of(call: ToolCall, session_id: str) -> str:
    """The token a paused run gives ``call`` in a fresh session ``session_id``."""
    agent = agent_for([ScriptedChatClient.tool_turn(call), "done"], Tools())
    (pending,) = (await agent.run("clean up", session=InMemorySession(session_id))).pending
    return pending.token


async def paused(
    tools: Tools, session: InMemorySession, *paths: str
) -> tuple[Agent, AgentResponse]:
    calls = [delete_call(path) for path in paths]
    turn = ScriptedChatClient.tool_turn(*calls, ToolCall("call_ls", "listing"), text="On it.")
    agent = agent_for([turn, "All done."], tools)
    return agent, await agent.run("clean up", session=session)


# -- declaring ---------------------------------------------------------------------------


def test_tool_approval_is_an_attribute_true_or_a_callable() -> None:
    @raf.tool(approval=lambda call: call.parsed_arguments["path"].startswith("/"))
    def rm(path: str) -> None:
        """Remove."""

    assert callable(rm.approval)
    assert raf.tool(lambda: None).approval is False  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="approval"):
        raf.tool(approval="yes")  # type: ignore[arg-type]


def test_decision_checks_its_fields() -> None:
    assert Decision("t", approve=False, reason="no").reason == "no"
    with pytest.raises(TypeError):
        Decision("t")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="approve"):
        Decision("t", approve="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="approve=False"):
        Decision("t", approve=True, reason="why")
    with pytest.raises(TypeError, match="token"):
        Decision("", approve=True)


def test_an_approval_tool_without_a_history_provider_is_refused_at_build_time() -> None:
    tools = Tools()
    with pytest.raises(ApprovalError, match="HistoryProvider"):
        Agent(ScriptedChatClient(), tools=[tools.delete])


async def test_a_provider_offered_approval_tool_without_history_fails_before_it_runs() -> None:
    tools = Tools()

    class Offers(ContextProvider):
        async def on_invoking(self, *args: Any) -> ContextResult:
            return ContextResult(tools=[tools.delete])

    agent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(delete_call("a"))]), stack=[Offers()]
    )
    with pytest.raises(ApprovalError, match="needs approval"):
        await agent.run("go")
    assert tools.deleted == []


async def test_a_callable_approval_gets_the_tool_call_and_decides_per_call() -> None:
    asked: list[ToolCall] = []

    def risky(call: ToolCall) -> bool:
        asked.append(call)
        return bool(call.parsed_arguments["path"].startswith("/"))

    ran: list[str] = []

    @raf.tool(approval=risky)
    def rm(path: str) -> str:
        """Remove."""
        ran.append(path)
        return "ok"

    safe, root = ToolCall("1", "rm", '{"path": "tmp"}'), ToolCall("2", "rm", '{"path": "/etc"}')
    agent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(safe, root)]), tools=[rm], history=True
    )
    response = await agent.run("go", session=InMemorySession())
    assert asked == [safe, root]
    assert ran == ["tmp"]
    assert [p.call for p in response.pending] == [root]


async def test_any_tool_with_an_approval_attribute_waits() -> None:
    class Hand:
        name, description, parameters = "hand", "A hand-made tool.", {"type": "object"}
        approval = True

        async def invoke(self, arguments: Any) -> str:
            raise AssertionError("must not run")

    agent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "hand"))]),
        tools=[Hand()],
        history=True,
    )
    assert [p.call.name for p in (await agent.run("go")).pending] == ["hand"]


# -- pausing ------------------------------------------------------------------------------


async def test_the_run_stops_before_an_approval_call_and_the_rest_of_the_turn_runs() -> None:
    tools, session = Tools(), InMemorySession("s")
    agent, response = await paused(tools, session, "a")
    assert tools.deleted == []
    assert tools.listed == 1
    (pending,) = response.pending
    assert pending.call == delete_call("a")
    assert re.fullmatch("[0-9a-f]{64}", pending.token)  # a SHA-256 (docs/approvals.md)
    # The same call in a session of the same id gets the same token (any process, any run).
    assert await token_of(delete_call("a"), "s") == pending.token
    assert len(agent.chat_client.requests) == 1  # type: ignore[attr-defined]
    stored = await session.get_messages()
    assert [m.role for m in stored] == ["user", "assistant", "tool"]
    assert stored[1].tool_calls[0] == delete_call("a")
    assert await session.list_pending() == (pending,)


async def test_every_post_stage_runs_with_the_paused_response() -> None:
    seen: list[tuple[AgentResponse | None, BaseException | None]] = []

    class Watch(ContextProvider):
        async def on_invoked(
            self, agent: Any, session: Any, request: Any, response: Any, error: Any
        ) -> None:
            seen.append((response, error))

    tools = Tools()
    agent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(delete_call("a"))]),
        tools=[tools.delete],
        history=True,
        stack=[Watch()],
    )
    response = await agent.run("go", session=InMemorySession())
    assert seen == [(response, None)]
    assert response.pending


async def test_streamed_an_approval_update_carries_each_pending_call() -> None:
    tools = Tools()
    turn = ScriptedChatClient.tool_turn(
        delete_call("a"), delete_call("b"), ToolCall("l", "listing")
    )
    agent = agent_for([turn], tools)
    updates: list[Update] = []

    async def collect(update: Update) -> None:
        updates.append(update)

    response = await agent.run("go", session=InMemorySession(), on_update=collect)
    approvals = [u.pending for u in updates if u.kind == "approval"]
    assert approvals == list(response.pending)
    assert len(approvals) == 2
    assert updates[-2:] == [Update("approval", pending=p) for p in response.pending]
    agent2 = agent_for([turn], Tools())
    async with agent2.stream("go", session=InMemorySession()) as stream:
        kinds = [update.kind async for update in stream]
    assert kinds[-2:] == ["approval", "approval"]
    assert stream.response is not None
    assert len(stream.response.pending) == 2


# -- resuming -----------------------------------------------------------------------------


async def test_an_approved_call_runs_once_and_the_loop_goes_on() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a")
    done = await agent.run(Decision(response.pending[0].token, approve=True), session=session)
    assert tools.deleted == ["a"]
    assert done.text == "All done."
    assert done.pending == ()
    model_saw = agent.chat_client.requests[-1].messages  # type: ignore[attr-defined]
    assert check_tool_pairing(model_saw) is None
    assert model_saw[-1] == ChatMessage.tool("call_a", "deleted a", name="delete")
    history = await session.get_messages()
    assert check_tool_pairing(history) is None
    assert history[-1].content == "All done."
    with pytest.raises(ApprovalError, match="no pending call"):
        await agent.run(Decision(response.pending[0].token, approve=True), session=session)
    assert tools.deleted == ["a"]


async def test_a_denied_call_becomes_a_tool_message_with_the_reason() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a")
    token = response.pending[0].token
    done = await agent.run(Decision(token, approve=False, reason="keep it"), session=session)
    assert tools.deleted == []
    refusal = done.messages[0]
    assert refusal.tool_call_id == "call_a"
    assert DENIED in (refusal.content or "")
    assert "keep it" in (refusal.content or "")
    assert done.text == "All done."


async def test_undecided_calls_stay_pending_and_the_model_waits_for_them() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a", "b")
    first, second = response.pending
    partly = await agent.run(Decision(first.token, approve=True), session=session)
    assert partly.pending == (second,)
    assert tools.deleted == ["a"]
    assert len(agent.chat_client.requests) == 1  # type: ignore[attr-defined]
    rest = await agent.run(Decision(second.token, approve=False), session=session)
    assert rest.text == "All done."
    assert tools.deleted == ["a"]
    assert check_tool_pairing(await session.get_messages()) is None


async def test_a_sequence_of_decisions_is_all_or_nothing() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a", "b")
    first, second = response.pending
    decisions = [Decision(first.token, approve=True), Decision("f" * 64, approve=True)]
    with pytest.raises(ApprovalError) as caught:
        await agent.run(decisions, session=session)
    assert caught.value.tokens == ("f" * 64,)
    assert tools.deleted == []
    assert await session.list_pending() == (first, second)
    with pytest.raises(ApprovalError, match="two decisions"):
        await agent.run([Decision(first.token, approve=True)] * 2, session=session)
    both = [Decision(first.token, approve=True), Decision(second.token, approve=True)]
    assert (await agent.run(both, session=session)).text == "All done."
    assert sorted(tools.deleted) == ["a", "b"]


async def test_a_token_that_matches_nothing_raises_before_any_model_call_or_tool() -> None:
    tools, session = Tools(), InMemorySession("mine")
    agent, response = await paused(tools, session, "a")
    calls = len(agent.chat_client.requests)  # type: ignore[attr-defined]
    other_session = await token_of(delete_call("a"), "yours")
    changed = await token_of(delete_call("/"), "mine")
    changed_id = await token_of(delete_call("a", "call_other"), "mine")
    for token in ("unknown", other_session, changed, changed_id):
        with pytest.raises(ApprovalError) as caught:
            await agent.run(Decision(token, approve=True), session=session)
        assert type(caught.value) is ApprovalError  # as itself, never wrapped
    assert tools.deleted == []
    assert len(agent.chat_client.requests) == calls
    assert await session.list_pending() == response.pending


async def test_a_stored_call_whose_arguments_changed_is_refused_and_never_runs() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a")
    (pending,) = response.pending
    (_claimed,) = await session.claim_all_pending()
    altered = PendingCall(delete_call("/", "call_a"), pending.token)
    await session.record_pending((), [altered])
    with pytest.raises(ApprovalError, match="arguments changed"):
        await agent.run(Decision(pending.token, approve=True), session=session)
    assert tools.deleted == []
    assert check_tool_pairing(await session.get_messages()) is None


async def test_a_new_message_denies_the_calls_that_wait() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a")
    answer = await agent.run("never mind", session=session)
    assert answer.text == "All done."
    assert tools.deleted == []
    model_saw = agent.chat_client.requests[-1].messages  # type: ignore[attr-defined]
    assert check_tool_pairing(model_saw) is None
    assert [m.content for m in model_saw if m.role == "tool"] == ["a.txt b.txt", SUPERSEDED]
    history = await session.get_messages()
    assert check_tool_pairing(history) is None
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "user", "assistant"]
    with pytest.raises(ApprovalError):
        await agent.run(Decision(response.pending[0].token, approve=True), session=session)


def test_decisions_and_messages_do_not_mix() -> None:
    agent = agent_for([], Tools())
    with pytest.raises(TypeError, match="not both"):
        agent.stream([Decision("t", approve=True), ChatMessage.user("hi")])  # type: ignore[list-item]
    with pytest.raises(ApprovalError, match="session"):
        agent.stream(Decision("t", approve=True))


async def test_two_concurrent_resumes_with_one_decision_run_the_tool_once() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a")
    agent.chat_client.script.append("again")  # type: ignore[attr-defined]
    tools.gate = anyio.Event()
    outcomes: list[object] = []

    async def resume() -> None:
        try:
            outcomes.append(
                await agent.run(Decision(response.pending[0].token, approve=True), session=session)
            )
        except ApprovalError as exc:
            outcomes.append(exc)
            assert tools.gate is not None
            tools.gate.set()

    async with anyio.create_task_group() as group:
        group.start_soon(resume)
        group.start_soon(resume)
    assert tools.deleted == ["a"]
    assert sorted(type(o).__name__ for o in outcomes) == ["AgentResponse", "ApprovalError"]


async def test_a_cancelled_resume_leaves_its_calls_answered_as_interrupted() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a")
    tools.gate = anyio.Event()  # the approved call hangs
    with anyio.move_on_after(0.2):
        await agent.run(Decision(response.pending[0].token, approve=True), session=session)
    history = await session.get_messages()
    assert check_tool_pairing(history) is None
    assert history[-1] == ChatMessage.tool("call_a", INTERRUPTED, name="delete")
    assert await session.list_pending() == ()
    assert (await agent.run("and now?", session=session)).text == "All done."


async def test_an_unanswered_call_left_by_a_crash_is_answered_as_interrupted() -> None:
    tools, session = Tools(), InMemorySession()
    agent, _response = await paused(tools, session, "a")
    await session.claim_all_pending()  # a claimer that died before storing the result
    await agent.run("hello?", session=session)
    assert check_tool_pairing(agent.chat_client.requests[-1].messages) is None  # type: ignore[attr-defined]
    history = await session.get_messages()
    assert check_tool_pairing(history) is None
    assert history[3] == ChatMessage.tool("call_a", INTERRUPTED, name="delete")


async def test_a_store_without_the_pending_operations_says_so() -> None:
    class Plain:
        """A session of a store written before approvals: the four first methods only."""

        def __init__(self) -> None:
            self.inner = InMemorySession()
            self.id = self.inner.id
            self.get_messages = self.inner.get_messages
            self.add_messages = self.inner.add_messages
            self.touch_request_hash = self.inner.touch_request_hash
            self.request_hashes = self.inner.request_hashes

    tools = Tools()
    agent = agent_for([ScriptedChatClient.tool_turn(delete_call("a"))], tools)
    with pytest.raises(raf.ProviderError) as caught:
        await agent.run("go", session=Plain())  # type: ignore[arg-type]
    assert isinstance(caught.value.__cause__, TypeError)
    assert "record_pending()" in str(caught.value.__cause__)
    with pytest.raises(TypeError, match=r"list_pending\(\), claim_pending\(\)"):
        await agent.run(Decision("t", approve=True), session=Plain())  # type: ignore[arg-type]


async def test_a_decision_to_an_agent_without_history_is_refused() -> None:
    agent = Agent(ScriptedChatClient())
    with pytest.raises(ApprovalError, match="keeps no history"):
        await agent.run(Decision("t", approve=True), session=InMemorySession())


async def test_a_new_message_while_an_approved_call_runs_keeps_the_history_valid() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a")
    agent.chat_client.script.append("Answer to the new message.")  # type: ignore[attr-defined]
    tools.gate = anyio.Event()
    async with anyio.create_task_group() as group:
        group.start_soon(
            lambda: agent.run(Decision(response.pending[0].token, approve=True), session=session)
        )
        await anyio.wait_all_tasks_blocked()  # the approved call runs (and waits)
        await agent.run("something else", session=session)  # answers it as interrupted
        tools.gate.set()
    assert tools.deleted == ["a"]
    for request in agent.chat_client.requests:  # type: ignore[attr-defined]
        assert check_tool_pairing(request.messages) is None
    history = await session.get_messages()
    assert check_tool_pairing(history) is None
    assert [m.content for m in history if m.tool_call_id == "call_a"] == [INTERRUPTED]


@pytest.mark.parametrize("decide", ["resume", "new message"])
async def test_with_compression_the_waiting_turn_stays_in_view(decide: str) -> None:
    tools, session = Tools(), InMemorySession()
    turn = ScriptedChatClient.tool_turn(delete_call("a"), ToolCall("call_ls", "listing"))
    agent = Agent(
        ScriptedChatClient([turn, "All done."]),
        tools=[tools.delete, tools.listing],
        stack=[
            raf.HistoryProvider(inject=False),
            raf.CompressionProvider(raf.compression.TruncationStrategy(keep_last=2)),
        ],
    )
    response = await agent.run("clean up", session=session)
    if decide == "resume":
        done = await agent.run(Decision(response.pending[0].token, approve=True), session=session)
        assert tools.deleted == ["a"]
    else:
        done = await agent.run("forget it", session=session)
        assert tools.deleted == []
    assert done.text == "All done."
    assert check_tool_pairing(agent.chat_client.requests[-1].messages) is None  # type: ignore[attr-defined]
    assert check_tool_pairing(await session.get_messages()) is None


async def test_a_resume_streams_in_the_iterator_form() -> None:
    tools, session = Tools(), InMemorySession()
    agent, response = await paused(tools, session, "a", "b")
    first, second = response.pending
    async with agent.stream(Decision(first.token, approve=True), session=session) as stream:
        updates = [update async for update in stream]
    assert [u.kind for u in updates] == ["tool_result", "approval"]
    assert updates[1].pending == second
    assert stream.response is not None
    assert stream.response.pending == (second,)
    async with agent.stream(Decision(second.token, approve=False), session=session) as stream:
        kinds = [update.kind async for update in stream]
    assert kinds[0] == "tool_result"
    assert "text" in kinds
    assert tools.deleted == ["a"]


async def test_a_run_that_asks_for_structured_output_pauses_and_resumes_like_any_other() -> None:
    tools = Tools()
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(delete_call("a.txt")), '{"value": 3}']
    )
    agent = Agent(client, tools=[tools.delete], history=True)
    session = InMemorySession()
    paused = await agent.run("delete a.txt", session=session, output_type=int)
    assert [pending.call.name for pending in paused.pending] == ["delete"]
    assert paused.output is None  # no final answer yet: nothing was validated
    resumed = await agent.run(
        Decision(paused.pending[0].token, approve=True), session=session, output_type=int
    )
    assert tools.deleted == ["a.txt"]
    assert resumed.output == 3
    check_tool_pairing(await session.get_messages())  # raises on a call without its result


async def test_a_tool_message_cannot_answer_a_call_that_waits(anyio_backend: str) -> None:
    # Only a decision answers a call that waits for a person: a tool message for it (a
    # result the caller made up) is an ApprovalError before the model reads it, and the
    # call still waits for its decision.
    tools, session = Tools(), InMemorySession("forged")
    agent, first = await paused(tools, session, "a.txt")
    (pending,) = first.pending
    model = agent.chat_client
    assert isinstance(model, ScriptedChatClient)
    calls = len(model.requests)
    with pytest.raises(ApprovalError, match="waits for a person"):
        await agent.run(ChatMessage.tool(pending.call.id, "deleted a.txt"), session=session)
    assert len(model.requests) == calls
    assert [p.token for p in await session.list_pending()] == [pending.token]
    done = await agent.run(Decision(pending.token, approve=True), session=session)
    assert done.text == "All done."
    assert tools.deleted == ["a.txt"]
    answers = [m for m in await session.get_messages() if m.tool_call_id == pending.call.id]
    assert [m.content for m in answers] == ["deleted a.txt"]
