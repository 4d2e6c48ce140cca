"""A durable agent (raf.durable) served by raf.serve behaves as a plain served agent.

Real parts: uvicorn serves the app on a free loopback port in this test's
own event loop (DBOS is asyncio-only, and runs in this process, launched on
a SQLite system database as the recipe in docs/durable.md says); the
sessions are a SQLite file the app opens in its lifespan; the clients are
the openai SDK and httpx, over TCP.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
import uvicorn
from dbos import DBOS
from selenium import webdriver
from selenium.webdriver.common.by import By

import raf
import raf.serve
from raf.durable import DurableAgent, dbos_agent
from tests._harness.redis_server import free_port
from tests._harness.serve_agent import make_agent
from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent, started
from tests.serve.test_agui import run_input
from tests.serve.test_approvals import decision_input
from tests.serve.test_page import ARTIFACTS, answers, browser, wait_until

__all__ = ["browser"]  # the page test's fixture: a headless Chromium

MODEL = "word-agent"
BOUND = 20.0  # no test may hang: each wait is bounded

_names = iter(range(1_000_000))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # DBOS is asyncio-only


@pytest.fixture(scope="module", autouse=True)
def dbos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    folder = tmp_path_factory.mktemp("dbos")
    DBOS(
        config={
            "name": "raf-serve-durable-tests",
            "system_database_url": f"sqlite:///{folder / 'dbos.sqlite'}",
            "log_level": "WARNING",
            "notification_listener_polling_interval_sec": 0.05,
        }
    )
    DBOS.launch()
    yield
    DBOS.destroy()


def durable(ran: list[str], approval_timeout: float = 30.0) -> DurableAgent:
    """The harness's served agent made durable; ``ran`` gets each path ``delete`` deletes."""
    agent = make_agent(on_delete=ran.append)
    return dbos_agent(
        agent, name=f"served-durable-{next(_names)}", approval_timeout=approval_timeout
    )


@asynccontextmanager
async def serving(agent: DurableAgent, db: Path) -> AsyncIterator[str]:
    """``raf.serve.app(agent, store=db)`` under uvicorn on a free loopback port: its URL."""
    port = free_port()
    config = uvicorn.Config(
        raf.serve.app(agent, store=str(db)),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as group:
        group.start_soon(server.serve)
        with anyio.fail_after(BOUND):
            while not server.started:  # noqa: ASYNC110  (uvicorn sets a flag, no event)
                await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


async def workflows(name: str) -> dict[str, str]:
    """The DBOS workflows of ``name``: each id and its status."""
    listed = await DBOS.list_workflows_async(name=name, load_input=False, load_output=False)
    return {w.workflow_id: w.status for w in listed}


async def new_workflows(name: str, before: dict[str, str], count: int) -> dict[str, str]:
    """The workflows of ``name`` not in ``before``, once ``count`` of them have ended."""
    with anyio.fail_after(BOUND):
        while True:
            new = {k: v for k, v in (await workflows(name)).items() if k not in before}
            if len(new) >= count and all(s not in ("PENDING", "ENQUEUED") for s in new.values()):
                return new
            await anyio.sleep(0.05)


def event_of(line: str) -> dict[str, Any] | None:
    if not line.startswith("data: "):
        return None
    event: dict[str, Any] = json.loads(line[6:])
    return event


def events_in(body: str) -> list[dict[str, Any]]:
    return [e for e in map(event_of, body.splitlines()) if e is not None]


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


async def stored(client: httpx.AsyncClient, thread: str) -> dict[str, Any]:
    reply = await client.get(f"/v1/sessions/{thread}/messages")
    assert reply.status_code == 200
    body: dict[str, Any] = reply.json()
    return body


@pytest.mark.anyio
async def test_a_served_durable_agent_streams_a_turn_stored_once_as_a_workflow(
    anyio_backend: str, tmp_path: Path
) -> None:
    import openai

    before = await workflows("raf.durable.run")
    async with (
        serving(durable([]), tmp_path / "sessions.db") as url,
        openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="unused",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=TLS),
        ) as sdk,
    ):
        session = {"X-Session-Id": "conv-1"}
        said: list[str] = []
        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hello there"}],
            stream=True,
            extra_headers=session,
        )
        async for chunk in stream:
            if chunk.choices:
                said.append(chunk.choices[0].delta.content or "")
        assert "".join(said) == "seen 1: hello there "
        # The next turn: the history reaches the model once (2 stored + 1 new = 3).
        reply = await sdk.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": "".join(said)},
                {"role": "user", "content": "again"},
            ],
            extra_headers=session,
        )
        assert reply.choices[0].message.content == "seen 3: again "
        async with httpx.AsyncClient(base_url=url, verify=TLS) as client:
            listed = await stored(client, "conv-1")
        assert [m["role"] for m in listed["data"]] == ["user", "assistant"] * 2
        assert listed["pending"] == []
        # AG-UI: the same agent, the same store, one more workflow.
        async with httpx.AsyncClient(base_url=url, timeout=BOUND, verify=TLS) as client:
            reply = await client.post("/ag-ui", json=run_input("hi", "conv-2"))
        events = events_in(reply.text)
        assert events[0]["type"] == "RUN_STARTED"
        assert events[-1]["type"] == "RUN_FINISHED"
        assert text_of(events) == "seen 1: hi "
    # Each turn was a DBOS workflow, and it succeeded.
    assert list((await new_workflows("raf.durable.run", before, 3)).values()) == ["SUCCESS"] * 3


async def read_until_approval(lines: AsyncIterator[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async for line in lines:
        event = event_of(line)
        if event is not None:
            events.append(event)
            if event["type"] == "CUSTOM":
                return events
    raise AssertionError(f"the stream ended with no approval: {events}")


@pytest.mark.anyio
async def test_a_decision_posted_as_the_page_does_reaches_the_waiting_run(
    anyio_backend: str, tmp_path: Path
) -> None:
    ran: list[str] = []
    before = await workflows("raf.durable.run")
    async with (
        serving(durable(ran), tmp_path / "sessions.db") as url,
        httpx.AsyncClient(base_url=url, timeout=BOUND, verify=TLS) as client,
    ):
        async with client.stream("POST", "/ag-ui", json=run_input("delete", "t-1")) as first:
            lines = first.aiter_lines()
            events = await read_until_approval(lines)
            assert [e["type"] for e in events] == [
                "RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "CUSTOM",
            ]  # fmt: skip
            approval = events[-1]["value"]
            assert (approval["toolCallId"], approval["toolCallName"]) == ("call-del", "delete")
            # The run waits inside DBOS, its stream open; the call is pending in the session.
            assert [p["token"] for p in (await stored(client, "t-1"))["pending"]] == [
                approval["token"]
            ]
            assert ran == []
            decision = {"token": approval["token"], "approve": True}
            decided = await client.post("/ag-ui", json=decision_input("t-1", decision))
            rest = [e for e in map(event_of, [line async for line in lines]) if e is not None]
        # The first stream goes on: the call's result, the answer, the end.
        assert [e["type"] for e in rest][:1] == ["TOOL_CALL_RESULT"]
        assert rest[0]["content"] == "deleted notes.txt"
        assert text_of(rest) == "the tool said deleted notes.txt"
        assert rest[-1]["type"] == "RUN_FINISHED"
        # The decision's own stream carries what the run did with it, as for a plain agent.
        assert decided.status_code == 200
        answer = events_in(decided.text)
        assert [e["type"] for e in answer][:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"]
        assert answer[1]["content"] == "deleted notes.txt"
        assert text_of(answer) == "the tool said deleted notes.txt"
        assert answer[-1]["type"] == "RUN_FINISHED"
        assert ran == ["notes.txt"]
        listed = await stored(client, "t-1")
        assert [m["role"] for m in listed["data"]] == ["user", "assistant", "tool", "assistant"]
        assert listed["pending"] == []
    # One workflow: the run, its wait and the decided rest (the decision started none).
    assert list((await new_workflows("raf.durable.run", before, 1)).values()) == ["SUCCESS"]


@pytest.mark.anyio
async def test_a_client_that_leaves_while_the_run_waits_ends_the_wait(
    anyio_backend: str, tmp_path: Path
) -> None:
    ran: list[str] = []
    waits = await workflows("raf.durable.run")
    async with (
        serving(durable(ran), tmp_path / "sessions.db") as url,
        httpx.AsyncClient(base_url=url, timeout=BOUND, verify=TLS) as client,
    ):
        async with client.stream("POST", "/ag-ui", json=run_input("delete", "t-2")) as first:
            approval = (await read_until_approval(first.aiter_lines()))[-1]["value"]
        # The client left (the connection is closed): the wait ends in DBOS (not left waiting).
        ended = list((await new_workflows("raf.durable.run", waits, 1)).values())
        assert ended in (["SUCCESS"], ["CANCELLED"])
        listed = await stored(client, "t-2")
        assert [p["token"] for p in listed["pending"]] == [approval["token"]]
        assert ran == []
        # A later decision resumes the call in a new durable run, streamed to the decider.
        runs = await workflows("raf.durable.run")
        decision = {"token": approval["token"], "approve": True}
        reply = await client.post("/ag-ui", json=decision_input("t-2", decision))
        events = events_in(reply.text)
        assert [e["type"] for e in events][:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"]
        assert text_of(events) == "the tool said deleted notes.txt"
        assert events[-1]["type"] == "RUN_FINISHED"
        assert ran == ["notes.txt"]
        assert (await stored(client, "t-2"))["pending"] == []
        assert list((await new_workflows("raf.durable.run", runs, 1)).values()) == ["SUCCESS"]


def durable_server(tmp_path: Path, *args: str, **config: Any) -> ServedAgent:
    """A server process of tests._harness.serve_durable_agent (uvicorn ``args``); its files in
    ``tmp_path``."""
    command = [
        sys.executable, "-m", "uvicorn", "tests._harness.serve_durable_agent:create",
        "--factory", *args,
    ]  # fmt: skip
    files = {
        "db": str(tmp_path / "sessions.db"),
        "dbos": str(tmp_path / "dbos.sqlite"),
        "deleted": str(tmp_path / "deleted.log"),
    }
    return ServedAgent(command=command, **files, **config)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_decision_sent_to_another_server_reaches_the_waiting_run(
    anyio_backend: str, tmp_path: Path
) -> None:
    # Two server processes on one DBOS database and one session store: the run waits in
    # one, the decision goes to the other.
    with started(
        durable_server(tmp_path, executor="server-a"), durable_server(tmp_path, executor="server-b")
    ) as (first_server, other_server):
        async with (
            httpx.AsyncClient(base_url=first_server.url, timeout=BOUND, verify=TLS) as first_client,
            httpx.AsyncClient(base_url=other_server.url, timeout=BOUND, verify=TLS) as other_client,
            first_client.stream("POST", "/ag-ui", json=run_input("delete", "t-6")) as first,
        ):
            lines = first.aiter_lines()
            approval = (await read_until_approval(lines))[-1]["value"]
            decision = {"token": approval["token"], "approve": True}
            decided = await other_client.post("/ag-ui", json=decision_input("t-6", decision))
            rest = [e for e in map(event_of, [line async for line in lines]) if e is not None]
        assert text_of(rest) == "the tool said deleted notes.txt"
        assert rest[-1]["type"] == "RUN_FINISHED"
        assert text_of(events_in(decided.text)) == "the tool said deleted notes.txt"
        assert (tmp_path / "deleted.log").read_text().split() == ["notes.txt"]


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_server_stopped_while_a_run_waits_leaves_the_call_pending(
    anyio_backend: str, tmp_path: Path
) -> None:
    # SIGTERM: uvicorn's graceful shutdown would wait for the waiting stream; its timeout
    # cancels it, which cancels the wait in DBOS. The next server resumes the call.
    server = durable_server(tmp_path, "--timeout-graceful-shutdown", "1").start()
    try:
        async with (
            httpx.AsyncClient(base_url=server.url, timeout=BOUND, verify=TLS) as client,
            client.stream("POST", "/ag-ui", json=run_input("delete", "t-8")) as first,
        ):
            lines = first.aiter_lines()
            token = (await read_until_approval(lines))[-1]["value"]["token"]
            # It ended on SIGTERM (uvicorn re-raises it), not by stop()'s SIGKILL.
            assert await anyio.to_thread.run_sync(server.stop) in (0, -signal.SIGTERM)
            with pytest.raises(httpx.RemoteProtocolError):  # the server closed the stream
                _ = [line async for line in lines]
        server.start()  # the same executor id: nothing of the cancelled wait is resumed
        async with httpx.AsyncClient(base_url=server.url, timeout=BOUND, verify=TLS) as client:
            assert [p["token"] for p in (await stored(client, "t-8"))["pending"]] == [token]
            assert not (tmp_path / "deleted.log").exists()
            decision = {"token": token, "approve": True}
            reply = await client.post("/ag-ui", json=decision_input("t-8", decision))
            assert text_of(events_in(reply.text)) == "the tool said deleted notes.txt"
        assert (tmp_path / "deleted.log").read_text().split() == ["notes.txt"]
    finally:
        server.__exit__(None, None, None)


@pytest.mark.slow
def test_the_page_decides_while_the_durable_run_waits_in_its_stream(
    browser: webdriver.Chrome, tmp_path: Path
) -> None:
    deleted = tmp_path / "deleted.log"  # the server process adds a line each time delete runs

    def runs() -> list[str]:
        return deleted.read_text().split() if deleted.exists() else []

    def buttons(name: str) -> list[Any]:
        return browser.find_elements(By.CSS_SELECTOR, f".msg.tool button.{name}")

    with durable_server(tmp_path) as server:
        browser.get(f"{server.url}/")
        browser.find_element(By.ID, "input").send_keys("please delete my notes")
        browser.find_element(By.ID, "send").click()
        # The run waits for the decision inside DBOS, its stream open (Stop is on).
        (approve,) = wait_until(lambda: buttons("approve"))
        assert browser.find_element(By.ID, "stop").is_enabled()
        assert runs() == []
        approve.click()
        # The rest of the run streams in the open stream, once.
        wait_until(lambda: answers(browser) == ["the tool said deleted notes.txt"])
        wait_until(lambda: not browser.find_element(By.ID, "stop").is_enabled())
        assert answers(browser) == ["the tool said deleted notes.txt"]
        assert runs() == ["notes.txt"]
        row = browser.find_element(By.CSS_SELECTOR, ".msg.tool")
        assert "(approved)" in row.text
        assert "→ deleted notes.txt" in row.text
        # A second call waits; a reload leaves the stream (the wait is cancelled in DBOS)
        # and shows the call again; a denial resumes it in a new durable run.
        browser.find_element(By.ID, "input").send_keys("delete them again")
        browser.find_element(By.ID, "send").click()
        wait_until(lambda: buttons("deny"))
        browser.refresh()
        (deny,) = wait_until(lambda: buttons("deny"))
        browser.find_element(By.CSS_SELECTOR, ".msg.tool.waiting input.reason").send_keys(
            "keep them"
        )
        deny.click()
        # Until the answer has streamed to its end (its text comes in deltas).
        wait_until(lambda: len(answers(browser)) == 2 and "keep them" in answers(browser)[1])
        assert answers(browser)[1].startswith("the tool said The user did not approve this call")
        assert "keep them" in answers(browser)[1]
        assert runs() == ["notes.txt"]
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "serve_page_durable.png"))


@pytest.mark.anyio
async def test_a_chat_completion_that_pauses_waits_for_a_decision_sent_over_ag_ui(
    anyio_backend: str, tmp_path: Path
) -> None:
    import openai

    ran: list[str] = []
    async with (
        serving(durable(ran), tmp_path / "sessions.db") as url,
        openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="unused",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=TLS),
        ) as sdk,
        httpx.AsyncClient(base_url=url, timeout=BOUND, verify=TLS) as client,
    ):
        answers: list[str | None] = []

        async def ask() -> None:
            reply = await sdk.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "delete my notes"}],
                extra_headers={"X-Session-Id": "t-3"},
            )
            answers.append(reply.choices[0].message.content)

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            with anyio.fail_after(BOUND):
                while not (pending := (await stored(client, "t-3"))["pending"]):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert answers == []  # the run waits inside DBOS
            decision = {"token": pending[0]["token"], "approve": True}
            reply = await client.post("/ag-ui", json=decision_input("t-3", decision))
            assert text_of(events_in(reply.text)) == "the tool said deleted notes.txt"
        assert answers == ["the tool said deleted notes.txt"]
        assert ran == ["notes.txt"]


@pytest.mark.anyio
async def test_a_streamed_chat_completion_opens_before_its_run_waits(
    anyio_backend: str, tmp_path: Path
) -> None:
    # The response starts at the pause (a client or proxy waiting for headers would give up
    # during a long wait); the answer streams in once decided.
    import openai

    ran: list[str] = []
    async with (
        serving(durable(ran), tmp_path / "sessions.db") as url,
        openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="unused",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=TLS),
        ) as sdk,
        httpx.AsyncClient(base_url=url, timeout=BOUND, verify=TLS) as client,
    ):
        with anyio.fail_after(5):  # the wait is 30 s: the stream opens before it
            stream = await sdk.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "delete my notes"}],
                stream=True,
                extra_headers={"X-Session-Id": "t-4"},
            )
        (pending,) = (await stored(client, "t-4"))["pending"]
        decision = {"token": pending["token"], "approve": True}
        await client.post("/ag-ui", json=decision_input("t-4", decision))
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        # The stream said what waited when it began to wait; decided, it waits no more.
        waiting = 'Waiting for approval: delete {"path": "notes.txt"}'
        assert text == waiting + "\n\nthe tool said deleted notes.txt"
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert "raf_pending" not in (chunks[-1].choices[0].delta.model_extra or {})
        assert ran == ["notes.txt"]


@pytest.mark.anyio
async def test_with_no_wait_a_served_durable_agent_pauses_as_a_plain_one(
    anyio_backend: str, tmp_path: Path
) -> None:
    ran: list[str] = []
    runs = await workflows("raf.durable.run")
    async with (
        serving(durable(ran, approval_timeout=0), tmp_path / "sessions.db") as url,
        httpx.AsyncClient(base_url=url, timeout=BOUND, verify=TLS) as client,
    ):
        paused = events_in((await client.post("/ag-ui", json=run_input("delete", "t-5"))).text)
        # The event sequence of a plain agent's pause (test_serve_approvals.py).
        assert [e["type"] for e in paused] == [
            "RUN_STARTED", "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "CUSTOM",
            "RUN_FINISHED",
        ]  # fmt: skip
        decision = {"token": paused[4]["value"]["token"], "approve": True}
        reply = await client.post("/ag-ui", json=decision_input("t-5", decision))
        events = events_in(reply.text)
        assert [e["type"] for e in events][:2] == ["RUN_STARTED", "TOOL_CALL_RESULT"]
        assert text_of(events) == "the tool said deleted notes.txt"
        assert events[-1]["type"] == "RUN_FINISHED"
        assert ran == ["notes.txt"]
        # The same decision again matches nothing: a RUN_ERROR, and nothing runs.
        again = events_in((await client.post("/ag-ui", json=decision_input("t-5", decision))).text)
        assert [e["type"] for e in again] == ["RUN_STARTED", "RUN_ERROR"]
        assert again[-1]["code"] == "approval_mismatch"
        assert ran == ["notes.txt"]
    # The pause and the resume: two durable runs.
    assert list((await new_workflows("raf.durable.run", runs, 2)).values()) == ["SUCCESS"] * 2


@pytest.mark.anyio
async def test_a_stateless_chat_completion_is_a_durable_run_with_no_session(
    anyio_backend: str, tmp_path: Path
) -> None:
    # Without X-Session-Id nothing is kept, as for a plain agent: the run has no session
    # (an in-memory one could not cross DBOS).
    import openai

    runs = await workflows("raf.durable.run")
    async with (
        serving(durable([]), tmp_path / "sessions.db") as url,
        openai.AsyncOpenAI(
            base_url=f"{url}/v1",
            api_key="unused",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=TLS),
        ) as sdk,
    ):
        messages: Any = [{"role": "user", "content": "hello there"}]
        reply = await sdk.chat.completions.create(model=MODEL, messages=messages)
        assert reply.choices[0].message.content == "seen 1: hello there "
        stream = await sdk.chat.completions.create(model=MODEL, messages=messages, stream=True)
        chunks = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(chunks) == "seen 1: hello there "
    assert list((await new_workflows("raf.durable.run", runs, 2)).values()) == ["SUCCESS"] * 2


def test_a_durable_agent_needs_a_store_that_outlives_the_process() -> None:
    with pytest.raises(raf.errors.ConfigError, match="durable agent needs a session store"):
        raf.serve.app(durable([]))


@pytest.mark.anyio
async def test_a_new_message_while_the_run_waits_refuses_the_call(
    anyio_backend: str, tmp_path: Path
) -> None:
    ran: list[str] = []
    async with (
        serving(durable(ran), tmp_path / "sessions.db") as url,
        httpx.AsyncClient(base_url=url, timeout=BOUND, verify=TLS) as client,
        client.stream("POST", "/ag-ui", json=run_input("delete", "t-7")) as first,
    ):
        lines = first.aiter_lines()
        await read_until_approval(lines)
        reply = await client.post("/ag-ui", json=run_input("never mind", "t-7"))
        # The waiting stream ends, as a plain agent's pause does; nothing ran.
        rest = [e for e in map(event_of, [line async for line in lines]) if e is not None]
        assert [e["type"] for e in rest] == ["RUN_FINISHED"]
        assert text_of(events_in(reply.text)) == "seen 4: never mind "
        assert ran == []
        listed = await stored(client, "t-7")
        assert listed["pending"] == []
        assert [m["role"] for m in listed["data"]] == [
            "user", "assistant", "tool", "user", "assistant",
        ]  # fmt: skip
        assert "did not approve" in listed["data"][2]["content"]
