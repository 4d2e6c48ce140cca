"""A2AAgentTool: a raf agent calling another raf agent, served over A2A by real uvicorn (one
server for the module), with the a2a-sdk client."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import ListTasksRequest, Task, TaskState

import raf
from raf import ScriptedChatClient, ToolCall
from tests._harness.a2a_server import A2AServer, Reply, card, event
from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LONG = "".join(f"w{i} " for i in range(200))  # what the served model says to "long"


@pytest.fixture(scope="module")
def server() -> Iterator[ServedAgent]:
    with ServedAgent(a2a=True, keys=["key-a"], delay=0.01) as served:
        yield served


def caller(tool: raf.A2AAgentTool, message: str) -> tuple[raf.Agent, ScriptedChatClient]:
    """An agent whose model calls ``tool`` with ``message``, then says ``done``."""
    call = ToolCall("c1", tool.name, json.dumps({"message": message}))
    model = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "done"])
    return raf.Agent(model, tools=[tool]), model


def told(model: ScriptedChatClient) -> str:
    """What the tool's result said to the model (its second call's last message)."""
    return model.requests[1].messages[-1].content or ""


async def test_an_agent_calls_an_agent(server: ServedAgent) -> None:
    tool = raf.A2AAgentTool(server.url, name="helper", api_key="key-a")
    agent, model = caller(tool, "hello from one")
    response = await agent.run("go")
    assert response.text == "done"
    assert told(model) == "seen 1: hello from one "


async def test_a_remote_failure_is_told_to_the_model(server: ServedAgent) -> None:
    tool = raf.A2AAgentTool(server.url, name="helper", api_key="key-a")
    agent, model = caller(tool, "fail:model")
    await agent.run("go")
    assert told(model) == (
        f"Error: tool 'helper' failed: ToolError: the agent at {server.url} ended its task failed: "
        "the model failed (bad_gateway)"
    )
    away = raf.A2AAgentTool("http://127.0.0.1:1", api_key="key-a")
    agent, model = caller(away, "hi")
    await agent.run("go")
    assert told(model).startswith(
        "Error: tool 'a2a_127_0_0_1_1' failed: ToolError: the agent at http://127.0.0.1:1 failed: "
        "AgentCardResolutionError"
    )


async def test_a_wrong_key_and_a_pause_are_answers_the_model_reads(server: ServedAgent) -> None:
    tool = raf.A2AAgentTool(server.url, name="helper", api_key="wrong")
    with pytest.raises(raf.ToolError, match=r"failed: .*401"):
        await tool.invoke({"message": "hi"})
    keyed = raf.A2AAgentTool(server.url, name="helper", api_key="key-a")
    paused = await keyed.invoke({"message": "please delete notes"})
    assert paused.startswith("[the agent waits: waiting for a person's approval: delete(")


# asyncio only: a stream of the a2a-sdk client left early (here, by the cancellation) leaves
# its inner generators unclosed, which trio reports as a ResourceWarning (an error here).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_cancelled_run_cancels_the_remote_task(server: ServedAgent) -> None:
    tool = raf.A2AAgentTool(server.url, name="helper", api_key="key-a")
    agent, _ = caller(tool, "long")
    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run, "go")
            await _task("TASK_STATE_WORKING", server)
            group.cancel_scope.cancel()
        task = await _task("TASK_STATE_CANCELED", server)
    # Cancelled there as an early close: the remote history kept the partial answer.
    async with httpx.AsyncClient(headers={"Authorization": "Bearer key-a"}, verify=TLS) as http:
        url = f"{server.url}/v1/sessions/{task.context_id}/messages"
        stored = (await http.get(url)).json()["data"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert LONG.startswith(stored[1]["content"])
    assert len(stored[1]["content"]) < len(LONG)


async def _task(state: str, server: ServedAgent) -> Task:
    """The served agent's task of ``long`` once it is in ``state``."""
    async with httpx.AsyncClient(headers={"Authorization": "Bearer key-a"}, verify=TLS) as http:
        card = await A2ACardResolver(http, server.url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        while True:
            listed = await client.list_tasks(ListTasksRequest())
            for task in listed.tasks:
                if TaskState.Name(task.status.state) == state:
                    return task
            await anyio.sleep(0.02)


def test_the_tool_is_described_and_checked() -> None:
    tool = raf.A2AAgentTool("http://127.0.0.1:8000/")
    assert (tool.name, tool.url) == ("a2a_127_0_0_1_8000", "http://127.0.0.1:8000")
    assert tool.parameters["required"] == ["message"]
    assert isinstance(tool, raf.Tool)
    with pytest.raises(ValueError, match="must be an http"):
        raf.A2AAgentTool("ftp://example")
    with pytest.raises(ValueError, match="name must be"):
        raf.A2AAgentTool("http://127.0.0.1:8000", name="a b")


def test_a_card_naming_another_server_gets_no_key() -> None:
    agent, elsewhere = A2AServer(), A2AServer()
    try:
        agent.reply(card(f"{elsewhere.url}/a2a"))
        answer = (event("", text="hi"), event("TASK_STATE_COMPLETED"))
        elsewhere.reply(Reply(events=answer))
        tool = raf.A2AAgentTool(agent.url, name="helper", api_key="secret")
        with pytest.raises(raf.ToolError, match="names another server"):
            anyio.run(tool.invoke, {"message": "hi"})
        assert elsewhere.requests == []  # the key stays with the server it was given for
        # Without a key there is nothing to keep: the card says where the agent answers.
        agent.reply(card(f"{elsewhere.url}/a2a"))
        free = raf.A2AAgentTool(agent.url, name="helper")
        assert anyio.run(free.invoke, {"message": "hi"}) == "hi"
    finally:
        agent.close()
        elsewhere.close()


# asyncio only: the a2a-sdk client's stream, left by the deadline, leaves its inner
# generators unclosed, which trio reports as a ResourceWarning (an error here).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_answer_that_never_ends_is_bounded_by_the_timeout() -> None:
    remote = A2AServer()
    try:
        working = (event("TASK_STATE_WORKING", text="more "),)
        cancelled = {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_CANCELED"}}
        remote.reply(
            card(f"{remote.url}/a2a"),
            Reply(events=working, pause=0.01, forever=True),
            Reply(body={"jsonrpc": "2.0", "id": 1, "result": cancelled}),
        )
        tool = raf.A2AAgentTool(remote.url, name="helper", timeout=0.5)
        with anyio.fail_after(20), pytest.raises(raf.ToolError, match=r"within 0\.5 s"):
            await tool.invoke({"message": "hi"})
    finally:
        remote.close()
    assert [r.body["method"] for r in remote.requests[1:]] == ["SendStreamingMessage", "CancelTask"]


# asyncio only, as above: the stream is left before its end.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_answer_past_max_answer_chars_cancels_the_task() -> None:
    remote = A2AServer()
    try:
        chunk = (event("TASK_STATE_WORKING", text="x" * 1000),)
        cancelled = {"id": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_CANCELED"}}
        remote.reply(
            card(f"{remote.url}/a2a"),
            Reply(events=chunk, pause=0.001, forever=True),
            Reply(body={"jsonrpc": "2.0", "id": 1, "result": cancelled}),
        )
        tool = raf.A2AAgentTool(remote.url, name="helper", max_answer_chars=5000)
        with anyio.fail_after(20), pytest.raises(raf.ToolError, match="more than 5000 char"):
            await tool.invoke({"message": "hi"})
    finally:
        remote.close()
    assert [r.body["method"] for r in remote.requests[1:]] == ["SendStreamingMessage", "CancelTask"]
    with pytest.raises(ValueError, match="max_answer_chars must be a positive int"):
        raf.A2AAgentTool(remote.url, max_answer_chars=0)


# asyncio only, as above: the stream is left before its end.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_event_past_the_bound_is_refused_before_it_is_kept() -> None:
    remote = A2AServer()
    try:
        huge = (event("TASK_STATE_WORKING", text="x" * 200_000),)
        remote.reply(card(f"{remote.url}/a2a"), Reply(events=huge))
        tool = raf.A2AAgentTool(remote.url, name="helper", max_answer_chars=1000)
        with (
            anyio.fail_after(20),
            pytest.raises(raf.ToolError, match="an event is over 73536 bytes"),
        ):
            await tool.invoke({"message": "hi"})
    finally:
        remote.close()


# asyncio only, as above: the card's reply is left before its end.
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_card_past_the_bound_is_refused() -> None:
    remote = A2AServer()
    try:
        big = card(f"{remote.url}/a2a").body | {"description": "x" * 2_000_000}
        remote.reply(Reply(body=big))
        tool = raf.A2AAgentTool(remote.url, name="helper")
        with anyio.fail_after(20), pytest.raises(raf.ToolError, match="its card is over"):
            await tool.invoke({"message": "hi"})
    finally:
        remote.close()


async def test_a_compressed_reply_is_refused() -> None:
    import gzip

    remote = A2AServer()
    try:
        data = gzip.compress(json.dumps(card(f"{remote.url}/a2a").body).encode())
        remote.reply(Reply(raw=data, headers={"content-encoding": "gzip"}))
        tool = raf.A2AAgentTool(remote.url, name="helper")
        with anyio.fail_after(20), pytest.raises(raf.ToolError, match="'gzip'-encoded"):
            await tool.invoke({"message": "hi"})
    finally:
        remote.close()
    assert remote.requests[0].headers["accept-encoding"] == "identity"
