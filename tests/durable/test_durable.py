"""raf.durable in one process: steps in call order, idempotency keys, sessions, errors, pickling.

DBOS runs here on its SQLite system database in a temporary folder (one
DBOS per module: it is a process-wide singleton). DBOS is asyncio-only, so
these tests run on asyncio; on trio a durable run is a DurableError.
The crash tests (real processes, SIGKILL) are in test_durable_recovery.py.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from dbos import DBOS, SetWorkflowID

import raf
from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatMessage,
    InMemorySession,
    ProviderError,
    ScriptedChatClient,
    SqliteSessionStore,
    ToolCall,
    Usage,
)
from raf._values.run import KEY_SCOPE
from raf.durable import DurableAgent, SessionRef, dbos_agent, idempotency_key
from raf.errors import DurableError, ToolLoopError

# Declared before DBOS.launch() (the module fixture), as DBOS asks of workflows.
_QUEUED = dbos_agent(Agent(ScriptedChatClient(["from the queue"])), name="test-durable-queued")


@DBOS.workflow(name="test.durable.from_queue")
async def _from_queue(text: str) -> str:
    """A workflow of the application's own that runs a durable agent: a child workflow."""
    return (await _QUEUED.run(text)).text


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # DBOS is asyncio-only: the trio case is test_on_trio_*


@pytest.fixture(scope="module", autouse=True)
def dbos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    folder = tmp_path_factory.mktemp("dbos")
    DBOS(
        config={
            "name": "raf-tests",
            "system_database_url": f"sqlite:///{folder / 'dbos.sqlite'}",
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,
        }
    )
    DBOS.launch()
    yield
    DBOS.destroy()  # the registry (raf's workflow) stays


_names = iter(range(1_000_000))


def _agent(script: list[Any], **kwargs: Any) -> tuple[DurableAgent, ScriptedChatClient, list[str]]:
    """A durable agent with a tool ``add`` that records its idempotency key per call."""
    keys: list[str] = []

    @raf.tool
    async def add(a: int, b: int) -> str:
        """a + b."""
        keys.append(f"{a}+{b}@{idempotency_key()}")
        return str(a + b)

    client = ScriptedChatClient(script)
    agent = Agent(client, tools=[add], **kwargs)
    return dbos_agent(agent, name=f"test-durable-{next(_names)}"), client, keys


def _two_adds() -> list[Any]:
    calls = (ToolCall("1", "add", '{"a": 1, "b": 2}'), ToolCall("2", "add", '{"a": 3, "b": 4}'))
    return [ScriptedChatClient.tool_turn(*calls), "3 and 7"]


async def _steps(workflow_id: str) -> list[str]:
    steps = await DBOS.list_workflow_steps_async(workflow_id)
    return [step["function_name"] for step in steps]


@pytest.mark.anyio
async def test_the_run_is_a_workflow_of_model_and_tool_steps_in_call_order(
    tmp_path: Path,
) -> None:
    agent, client, keys = _agent(_two_adds(), history=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        with SetWorkflowID("wf-order"):
            response = await agent.run("add", session=session)
        assert response.text == "3 and 7"
        assert len(await session.get_messages()) == 5  # user, assistant, two tool results, answer
    # The history's length as the run read it is a step too (a replay reads it the same).
    steps = await _steps("wf-order")
    assert steps == ["raf.history", "raf.model", "raf.tool.add", "raf.tool.add", "raf.model"]
    # The key is the step id, drawn in call order even though the calls run concurrently.
    assert sorted(keys) == ["1+2@wf-order:3", "3+4@wf-order:4"]
    status = await DBOS.get_workflow_status_async("wf-order")
    assert status is not None
    assert status.status == "SUCCESS"
    assert len(client.requests) == 2


@pytest.mark.anyio
async def test_step_ids_follow_the_call_order_whatever_order_the_calls_enter_in() -> None:
    second_entered = anyio.Event()

    async def second_first(request: Any, call_next: Any) -> Any:
        if request.call.id == "1":
            await second_entered.wait()  # the first call enters the step after the second
        else:
            second_entered.set()
        return await call_next(request)

    agent, _, keys = _agent(_two_adds(), tool_stack=[second_first])
    with SetWorkflowID("wf-entry-order"):
        assert (await agent.run("add")).text == "3 and 7"
    assert sorted(keys) == ["1+2@wf-entry-order:2", "3+4@wf-entry-order:3"]


@pytest.mark.anyio
async def test_a_tool_that_runs_in_a_thread_reads_its_key_too() -> None:
    @raf.tool
    def blocking() -> str:
        """A plain function: raf runs it in a worker thread."""
        return f"key {idempotency_key()}"

    client = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "blocking")), "ok"])
    agent = dbos_agent(Agent(client, tools=[blocking]), name="test-durable-thread")
    with SetWorkflowID("wf-thread"):
        await agent.run("go")
    assert client.requests[1].messages[-1].content == "key wf-thread:2"
    assert idempotency_key() is None  # outside a step


@pytest.mark.anyio
async def test_a_durable_run_inside_a_queued_workflow_is_its_child() -> None:
    queue = await DBOS.register_queue_async("raf-test-runs", polling_interval_sec=0.05)
    handle = await queue.enqueue_async(_from_queue, "hi")
    assert await handle.get_result(polling_interval_sec=0.05) == "from the queue"
    children = await DBOS.list_workflow_steps_async(handle.get_workflow_id())
    assert children[0]["function_name"] == "raf.durable.run"


@pytest.mark.anyio
async def test_a_workflow_id_run_again_replays_its_steps_and_writes_nothing_twice(
    tmp_path: Path,
) -> None:
    agent, client, keys = _agent(_two_adds(), history=True)
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        with SetWorkflowID("wf-again"):
            first = await agent.run("add", session=session)
        with SetWorkflowID("wf-again"):
            again = await agent.run("add", session=session)
        assert again == first
        assert len(client.requests) == 2
        assert len(keys) == 2
        assert len(await session.get_messages()) == 5


@pytest.mark.anyio
async def test_the_history_write_is_keyed_by_the_workflow(tmp_path: Path) -> None:
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        session = await store.get("s")
        turn = [ChatMessage.user("hi"), ChatMessage.assistant("hello")]
        assert await session.add_once("wf:1", turn) is True
        assert await session.add_once("wf:1", turn) is False  # a replayed post stage
        assert await session.add_once("wf:2", turn[:1]) is True
        assert await session.get_messages() == (*turn, turn[0])
        assert await (await store.get("other")).add_once("wf:1", turn) is True
        with pytest.raises(ValueError, match="idempotency key"):
            await session.add_once("", turn)


@pytest.mark.anyio
async def test_the_redis_history_write_is_keyed_by_the_workflow(redis_server: Any) -> None:
    from raf import RedisSessionStore

    async with RedisSessionStore(redis_server.url, prefix="once", ttl=60) as store:
        session = await store.get("s")
        turn = [ChatMessage.user("hi"), ChatMessage.assistant("hello")]
        assert await session.add_once("wf:1", turn) is True
        assert await session.add_once("wf:1", turn) is False
        assert await session.get_messages() == tuple(turn)
        assert SessionRef.of(session) == SessionRef("redis", redis_server.url, "s", "once", 60)


@pytest.mark.anyio
async def test_a_run_without_a_session_is_durable_and_a_memory_session_is_refused() -> None:
    agent, _, _ = _agent(["fine"])
    assert (await agent.run("hi")).text == "fine"
    with pytest.raises(DurableError, match="InMemorySession lives in one process"):
        await agent.run("hi", session=InMemorySession())
    async with SqliteSessionStore(":memory:") as store:
        with pytest.raises(DurableError, match="in-memory SQLite store"):
            await agent.run("hi", session=await store.get("s"))


@pytest.mark.anyio
async def test_a_caller_cancelled_run_is_cancelled_in_dbos() -> None:
    started = anyio.Event()

    @raf.tool
    async def wait() -> str:
        """Never answers."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    client = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "wait", "{}"))])
    agent = dbos_agent(Agent(client, tools=[wait]), name="test-durable-cancel")
    async with anyio.create_task_group() as group:

        async def run() -> None:
            with SetWorkflowID("wf-cancel"):
                await agent.run("wait")

        group.start_soon(run)
        await started.wait()
        group.cancel_scope.cancel()
    status = await DBOS.get_workflow_status_async("wf-cancel")
    assert status is not None
    assert status.status == "CANCELLED"  # not resumed at the next launch


@pytest.mark.anyio
async def test_streaming_to_the_caller_is_as_for_a_plain_agent(tmp_path: Path) -> None:
    agent, _, _ = _agent(_two_adds())
    kinds = []
    async with agent.stream("add") as stream:
        async for update in stream:
            kinds.append(update.kind)
    assert stream.response is not None
    assert stream.response.text == "3 and 7"
    assert "tool_result" in kinds
    seen: list[str] = []

    async def on_update(update: Any) -> None:
        seen.append(update.kind)

    agent, _, _ = _agent(_two_adds())
    assert (await agent.run("add", on_update=on_update)).text == "3 and 7"
    assert seen == kinds


@pytest.mark.anyio
async def test_the_served_callers_key_scope_reaches_the_workflows_run() -> None:
    # A served caller's key scope (what keeps a key's memories and budgets its own) is on
    # the run of each pass of the workflow, as on a plain agent's run.
    seen: list[object] = []

    async def watch(request: Any, call_next: Any) -> AgentResponse:
        seen.append(request.invocation.run.state.get(KEY_SCOPE))
        return await call_next(request)  # type: ignore[no-any-return]

    durable, _, _ = _agent(["hi", "hi"], chat_stack=[watch])
    run = raf.Run(None)
    run.state[KEY_SCOPE] = "key-1"
    assert (await durable.run("hello", on_update=run)).text == "hi"
    assert (await durable.run("hello")).text == "hi"
    assert seen == ["key-1", None]


@pytest.mark.anyio
async def test_a_failed_run_fails_as_for_a_plain_agent() -> None:
    calls = ScriptedChatClient.tool_turn(ToolCall("1", "add", '{"a": 1, "b": 2}'))
    agent, _, _ = _agent([calls, calls], history=False)
    with pytest.raises(ToolLoopError):
        await agent.run("loop", options=AgentRunOptions(max_tool_iterations=2, extra={"k": 1}))


def test_on_trio_a_durable_run_is_a_clear_error() -> None:
    agent, client, _ = _agent(["never"])
    with pytest.raises(DurableError, match="asyncio"):
        anyio.run(agent.run, "hi", backend="trio")

    async def streamed() -> None:
        async with agent.stream("hi") as stream:
            async for _ in stream:
                pass

    with pytest.raises(DurableError, match="asyncio"):
        anyio.run(streamed, backend="trio")
    assert client.requests == []


def test_names_are_unique_and_required() -> None:
    agent = Agent(ScriptedChatClient())
    with pytest.raises(ValueError, match="needs a name"):
        dbos_agent(agent)
    durable = dbos_agent(agent, name="test-durable-unique")
    assert durable.durable_name == "test-durable-unique"
    with pytest.raises(DurableError, match="exists in this process"):
        dbos_agent(Agent(ScriptedChatClient(), name="test-durable-unique"))
    with pytest.raises(TypeError, match=r"plain raf\.Agent"):
        dbos_agent(durable, name="another")
    assert dbos_agent(Agent(ScriptedChatClient(), name="named")).durable_name == "named"


def test_what_crosses_dbos_pickles() -> None:
    options = AgentRunOptions(
        model="m", temperature=0.5, tool_choice={"type": "auto"}, extra={"a": [1]}
    )
    assert pickle.loads(pickle.dumps(options)) == options
    typed = AgentRunOptions(output_type=int, output_retries=2)
    typed_again = pickle.loads(pickle.dumps(typed))
    assert typed_again == typed
    response = AgentResponse(
        (ChatMessage.assistant("hi", tool_calls=(ToolCall("1", "t", "{}"),)),),
        Usage(1, 2),
        raw={"id": "r1"},
    )
    again = pickle.loads(pickle.dumps(response))
    assert again == response
    assert again.raw == {"id": "r1"}
    error = ProviderError("history", "on_invoked", "boom")
    error.add_note("a note")
    rebuilt = pickle.loads(pickle.dumps(error))
    assert (rebuilt.provider, rebuilt.stage, str(rebuilt), rebuilt.__notes__) == (
        "history",
        "on_invoked",
        str(error),
        ["a note"],
    )
    loop = pickle.loads(pickle.dumps(ToolLoopError(3, ("a",))))
    assert str(loop) == str(ToolLoopError(3, ("a",)))
    assert isinstance(pickle.loads(pickle.dumps(DurableError("x"))), DurableError)


_WITHOUT_DBOS = """
import anyio
from dbos import DBOS
from raf import Agent, ScriptedChatClient
from raf.errors import DurableError
from raf.durable import dbos_agent

agent = dbos_agent(Agent(ScriptedChatClient(["x", "x"])), name="not-set-up")
for step in ("none", "created"):
    if step == "created":
        DBOS(config={"name": "not-launched", "system_database_url": "sqlite:///dbos.sqlite"})
    try:
        anyio.run(agent.run, "hi")
    except DurableError as exc:
        print(step, exc)
DBOS.destroy()
"""


@pytest.mark.slow
def test_without_dbos_set_up_a_durable_run_says_so(tmp_path: Path) -> None:
    # Its own process: DBOS is one per process, and this module's is launched.
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_DBOS], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["none", "created"]
    assert all("DBOS is not set up in this process" in line for line in lines)
