"""Approvals over POST /ag-ui on asyncio and trio: a pending call's events, a resume by decision.

The events are read back with ag-ui-protocol's own types, as in ``test_serve_agui.py``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from ag_ui.core import EventType, RunAgentInput, UserMessage

import raf.serve
from tests._harness.serve_agent import make_agent
from tests.serve.test_agui import events_of, run_input
from tests.serve.test_asgi import Exchange

pytestmark = pytest.mark.anyio


def decision_input(thread: str, *decisions: dict[str, Any]) -> dict[str, Any]:
    """A RunAgentInput with no new message and the decisions in ``forwardedProps``."""
    body = RunAgentInput(
        thread_id=thread,
        run_id="run-2",
        state=None,
        messages=[],
        tools=[],
        context=[],
        forwarded_props={"decisions": list(decisions)},
    )
    return json.loads(body.model_dump_json(by_alias=True))


async def pause(app: Any, thread: str) -> tuple[list[Any], dict[str, Any]]:
    """Ask for a delete: the events of the paused run, and its ``raf.approval`` value."""
    events = events_of(await Exchange()(app, "/ag-ui", run_input("delete my notes", thread)))
    (custom,) = [e for e in events if e.type == EventType.CUSTOM]
    return events, custom.value


async def stored(app: Any, thread: str) -> dict[str, Any]:
    reply = await Exchange()(app, f"/v1/sessions/{thread}/messages", method="GET")
    assert reply.status == 200
    body: dict[str, Any] = json.loads(reply.body)
    return body


async def test_a_pending_call_is_tool_call_events_with_no_result(anyio_backend: str) -> None:
    ran: list[str] = []
    app = raf.serve.app(make_agent(on_delete=ran.append))
    events, approval = await pause(app, "t-pause")
    assert [e.type for e in events] == [
        EventType.RUN_STARTED,
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
        EventType.CUSTOM,
        EventType.RUN_FINISHED,
    ]
    start, args, end, custom = events[1:5]
    assert (start.tool_call_id, start.tool_call_name) == ("call-del", "delete")
    assert json.loads(args.delta) == {"path": "notes.txt"}
    assert end.tool_call_id == "call-del"
    assert custom.name == "raf.approval"
    assert approval["toolCallId"] == "call-del"
    assert approval["toolCallName"] == "delete"
    assert json.loads(approval["arguments"]) == {"path": "notes.txt"}
    assert ran == []
    # The history route shows the call as pending, with the same token.
    listed = await stored(app, "t-pause")
    assert [m["role"] for m in listed["data"]] == ["user", "assistant"]
    assert listed["pending"] == [
        {
            "tool_call_id": "call-del",
            "name": "delete",
            "arguments": approval["arguments"],
            "token": approval["token"],
        }
    ]


async def test_an_approval_runs_the_call_once_and_the_answer_streams(anyio_backend: str) -> None:
    ran: list[str] = []
    app = raf.serve.app(make_agent(on_delete=ran.append))
    _, approval = await pause(app, "t-yes")
    decision = {"token": approval["token"], "approve": True}
    reply = await Exchange()(app, "/ag-ui", decision_input("t-yes", decision))
    assert reply.status == 200
    events = events_of(reply)
    kinds = [e.type for e in events]
    assert kinds[:2] == [EventType.RUN_STARTED, EventType.TOOL_CALL_RESULT]
    assert kinds[-1] == EventType.RUN_FINISHED
    assert EventType.CUSTOM not in kinds
    assert (events[1].tool_call_id, events[1].content) == ("call-del", "deleted notes.txt")
    text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text == "the tool said deleted notes.txt"
    assert ran == ["notes.txt"]
    listed = await stored(app, "t-yes")
    assert [m["role"] for m in listed["data"]] == ["user", "assistant", "tool", "assistant"]
    assert listed["pending"] == []
    # The same decision again matches nothing: a RUN_ERROR, and nothing runs.
    again = events_of(await Exchange()(app, "/ag-ui", decision_input("t-yes", decision)))
    assert [e.type for e in again] == [EventType.RUN_STARTED, EventType.RUN_ERROR]
    assert again[-1].code == "approval_mismatch"
    assert approval["token"] in again[-1].message
    assert ran == ["notes.txt"]


async def test_a_denial_with_a_reason_reaches_the_model_and_nothing_runs(
    anyio_backend: str,
) -> None:
    ran: list[str] = []
    app = raf.serve.app(make_agent(on_delete=ran.append))
    _, approval = await pause(app, "t-no")
    decision = {"token": approval["token"], "approve": False, "reason": "keep them"}
    events = events_of(await Exchange()(app, "/ag-ui", decision_input("t-no", decision)))
    result = next(e for e in events if e.type == EventType.TOOL_CALL_RESULT)
    assert "did not approve" in result.content
    assert "keep them" in result.content
    text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text.startswith("the tool said The user did not approve")
    assert events[-1].type == EventType.RUN_FINISHED
    assert ran == []
    assert (await stored(app, "t-no"))["pending"] == []


async def test_decisions_are_checked_and_scoped_by_key(anyio_backend: str) -> None:
    ran: list[str] = []
    app = raf.serve.app(make_agent(on_delete=ran.append), api_keys=["ann", "bob"])
    ann = [(b"authorization", b"Bearer ann")]
    bob = [(b"authorization", b"Bearer bob")]
    paused = events_of(await Exchange()(app, "/ag-ui", run_input("delete", "t-k"), headers=ann))
    token = next(e for e in paused if e.type == EventType.CUSTOM).value["token"]
    # Bob's session of the same id has nothing pending: his decision matches nothing.
    listed = await Exchange()(app, "/v1/sessions/t-k/messages", method="GET", headers=bob)
    assert json.loads(listed.body)["pending"] == []
    decision = {"token": token, "approve": True}
    other = events_of(await Exchange()(app, "/ag-ui", decision_input("t-k", decision), headers=bob))
    assert other[-1].type == EventType.RUN_ERROR
    assert ran == []
    # Bad shapes are a 400 before any event.
    for bad in (
        {"token": token, "approve": "yes"},
        {"token": "", "approve": True},
        {"token": token, "approve": True, "reason": "no"},
        {"token": token, "approve": True, "extra": 1},
        {"approve": True},
    ):
        reply = await Exchange()(app, "/ag-ui", decision_input("t-k", bad), headers=ann)
        assert reply.status == 400, bad
        assert "forwardedProps.decisions[0]" in json.loads(reply.body)["error"]["message"]
    both = decision_input("t-k", decision)
    both["messages"] = [UserMessage(id="m", role="user", content="hi").model_dump(by_alias=True)]
    reply = await Exchange()(app, "/ag-ui", both, headers=ann)
    assert reply.status == 400
    assert ran == []
    # Ann's own decision runs it.
    events = events_of(
        await Exchange()(app, "/ag-ui", decision_input("t-k", decision), headers=ann)
    )
    assert events[-1].type == EventType.RUN_FINISHED
    assert ran == ["notes.txt"]


async def test_a_call_left_undecided_is_reported_again_by_the_resume(anyio_backend: str) -> None:
    ran: list[str] = []

    @raf.tool(approval=True)
    def remove(path: str) -> str:
        """Remove ``path``."""
        ran.append(path)
        return f"removed {path}"

    turn = raf.ScriptedChatClient.tool_turn(
        raf.ToolCall("c-a", "remove", '{"path": "a"}'),
        raf.ToolCall("c-b", "remove", '{"path": "b"}'),
    )
    agent = raf.Agent(raf.ScriptedChatClient([turn, "both done"]), tools=[remove], history=True)
    app = raf.serve.app(agent)
    first = events_of(await Exchange()(app, "/ag-ui", run_input("remove both", "t-two")))
    tokens = {e.value["toolCallId"]: e.value["token"] for e in first if e.type == EventType.CUSTOM}
    assert set(tokens) == {"c-a", "c-b"}
    # Deciding one: it runs, the other is reported again as waiting, the model is not called.
    decision = {"token": tokens["c-a"], "approve": True}
    second = events_of(await Exchange()(app, "/ag-ui", decision_input("t-two", decision)))
    assert [e.type for e in second] == [
        EventType.RUN_STARTED,
        EventType.TOOL_CALL_RESULT,
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
        EventType.CUSTOM,
        EventType.RUN_FINISHED,
    ]
    assert second[1].tool_call_id == "c-a"
    assert second[2].tool_call_id == "c-b"
    assert second[5].value["token"] == tokens["c-b"]
    assert ran == ["a"]
    decision = {"token": tokens["c-b"], "approve": True}
    third = events_of(await Exchange()(app, "/ag-ui", decision_input("t-two", decision)))
    text = "".join(e.delta for e in third if e.type == EventType.TEXT_MESSAGE_CONTENT)
    assert text == "both done"
    assert ran == ["a", "b"]
