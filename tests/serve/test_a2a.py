"""A2A served by real uvicorn (the a2a-sdk server runs on asyncio only), driven by the a2a-sdk
client and read back with its types, the client on asyncio and trio (one server for the
module)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text, get_data_parts, new_data_part
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)
from a2a.utils.errors import TaskNotFoundError

import raf.serve
from raf import Agent, EchoChatClient
from raf.errors import ConfigError
from tests._harness.serve_agent import WordModel, make_agent
from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent
from tests.serve.test_asgi import Journal

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

KEYS = ["key-a", "key-b"]
LONG = "".join(f"w{i} " for i in range(200))  # what the served model says to "long"


@pytest.fixture(scope="module")
def deleted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the served agent's ``delete`` tool writes a line each time it runs."""
    return tmp_path_factory.mktemp("a2a") / "deleted.txt"


@pytest.fixture(scope="module")
def server(deleted: Path) -> Iterator[ServedAgent]:
    with ServedAgent(a2a=True, keys=KEYS, delay=0.01, deleted=str(deleted)) as served:
        yield served


@asynccontextmanager
async def client(
    server: ServedAgent, key: str = "key-a", *, streaming: bool = True
) -> AsyncIterator[tuple[Client, AgentCard]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60, verify=TLS) as http:
        card = await A2ACardResolver(http, server.url).get_agent_card()
        config = ClientConfig(httpx_client=http, streaming=streaming)
        yield ClientFactory(config).create(card), card


def message(text: str | None, context: str, task: str | None = None, data: Any = None) -> Any:
    parts = [Part(text=text)] if text is not None else [new_data_part(data)]
    sent = Message(
        role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=parts, context_id=context
    )
    if task is not None:
        sent.task_id = task
    return SendMessageRequest(message=sent)


async def events(sender: Client, request: Any) -> list[StreamResponse]:
    return [event async for event in sender.send_message(request)]


def answer(events: list[StreamResponse]) -> str:
    """The answer as A2A builds an artifact from its updates: ``append`` adds the parts,
    else they replace the artifact's."""
    parts: list[str] = []
    for event in events:
        if event.HasField("artifact_update"):
            update = event.artifact_update
            parts = [*parts] if update.append else []
            parts += [part.text for part in update.artifact.parts]
    return "".join(parts)


def last_state(events: list[StreamResponse]) -> str:
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    return TaskState.Name(states[-1])


async def test_the_card_names_the_agent_its_skills_and_its_url(server: ServedAgent) -> None:
    async with client(server) as (_, card):
        pass
    assert card.name == "word-agent"
    assert [s.id for s in card.skills] == ["word-agent", "tool:shout", "tool:delete"]
    (interface,) = card.supported_interfaces
    assert (interface.url, interface.protocol_binding) == (f"{server.url}/a2a", "JSONRPC")
    assert card.capabilities.streaming
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "bearer"


async def test_a_streamed_message_is_status_and_artifact_updates(server: ServedAgent) -> None:
    async with client(server) as (sender, _):
        got = await events(sender, message("hello there", f"ctx-{uuid.uuid4().hex}"))
    first, working, *chunks, last = got
    assert TaskState.Name(first.task.status.state) == "TASK_STATE_SUBMITTED"
    assert TaskState.Name(working.status_update.status.state) == "TASK_STATE_WORKING"
    assert answer(got) == "seen 1: hello there "
    updates = [c.artifact_update for c in chunks]
    # The chunks as they stream, then the whole answer replacing them as one part.
    assert [u.append for u in updates] == [False, True, True, False]
    assert [p.text for p in updates[-1].artifact.parts] == ["seen 1: hello there "]
    assert updates[-1].last_chunk
    assert len({u.artifact.artifact_id for u in updates}) == 1
    assert TaskState.Name(last.status_update.status.state) == "TASK_STATE_COMPLETED"


async def test_the_text_of_two_model_calls_is_kept_apart(server: ServedAgent) -> None:
    async with client(server) as (sender, _):
        streamed = await events(sender, message("check the tool", f"ctx-{uuid.uuid4().hex}"))
    async with client(server, streaming=False) as (sender, _):
        (whole,) = await events(sender, message("check the tool", f"ctx-{uuid.uuid4().hex}"))
    assert answer(streamed) == "Let me check.\n\nthe tool said HI"
    assert "".join(p.text for a in whole.task.artifacts for p in a.parts) == answer(streamed)


async def test_the_finished_answer_is_one_text_part(server: ServedAgent) -> None:
    # The SDK's get_artifact_text joins the parts with a newline: one part a streamed chunk
    # read the answer one word a line.
    async with client(server, streaming=False) as (sender, _):
        (only,) = await events(sender, message("long", f"ctx-{uuid.uuid4().hex}"))
        again = await sender.get_task(GetTaskRequest(id=only.task.id))
    async with client(server) as (sender, _):
        streamed = await events(sender, message("long", f"ctx-{uuid.uuid4().hex}"))
        task_id = next(e.task.id for e in streamed if e.HasField("task"))
        after_stream = await sender.get_task(GetTaskRequest(id=task_id))
    for task in (only.task, again, after_stream):
        (artifact,) = task.artifacts
        assert len(artifact.parts) == 1
        assert get_artifact_text(artifact) == LONG
    assert answer(streamed) == LONG


async def test_the_card_s_url_is_never_the_request_s_host(server: ServedAgent) -> None:
    # Any caller writes a Host; a cache in front would hand its card to the next caller.
    url = f"{server.url}/.well-known/agent-card.json"
    async with httpx.AsyncClient(verify=TLS) as http:
        card = (await http.get(url, headers={"Host": "evil.example:666"})).json()
    assert card["supportedInterfaces"][0]["url"] == f"{server.url}/a2a"


def test_the_card_s_url_is_the_public_url() -> None:
    with ServedAgent(a2a=True, public_url="https://agents.example.com/team/") as served:
        card = httpx.get(f"{served.url}/.well-known/agent-card.json", verify=TLS).json()
    assert card["supportedInterfaces"][0]["url"] == "https://agents.example.com/team/a2a"


@pytest.mark.parametrize(
    "bad", ["agents.example.com", "ftp://agents.example.com", "https://", "https://a.b/?x=1"]
)
def test_a_public_url_that_is_no_address_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="public_url must be an http"):
        raf.serve.app(Agent(EchoChatClient(), name="echo"), a2a=True, public_url=bad)


async def test_a_sent_message_is_the_finished_task(server: ServedAgent) -> None:
    async with client(server, streaming=False) as (sender, _):
        (only,) = await events(sender, message("hello", f"ctx-{uuid.uuid4().hex}"))
        task = only.task
        again = await sender.get_task(GetTaskRequest(id=task.id))
    assert TaskState.Name(task.status.state) == "TASK_STATE_COMPLETED"
    assert "".join(p.text for a in task.artifacts for p in a.parts) == "seen 1: hello "
    assert again.id == task.id
    assert TaskState.Name(again.status.state) == "TASK_STATE_COMPLETED"


async def test_the_context_is_the_session_of_the_caller_s_key(server: ServedAgent) -> None:
    context = f"ctx-{uuid.uuid4().hex}"
    async with client(server, "key-a") as (sender, _):
        first = await events(sender, message("first", context))
        second = await events(sender, message("second", context))
    async with client(server, "key-b") as (other, _):
        third = await events(other, message("hello", context))
        with pytest.raises(TaskNotFoundError):  # another key's task is not there
            await other.get_task(GetTaskRequest(id=first[0].task.id))
    assert answer(second) == "seen 3: second "
    assert answer(third) == "seen 1: hello "


async def test_an_approval_is_input_required_then_decided_by_the_next_message(
    server: ServedAgent, deleted: Path
) -> None:
    context = f"ctx-{uuid.uuid4().hex}"
    async with client(server) as (sender, _):
        paused = await events(sender, message("please delete notes", context))
        assert last_state(paused) == "TASK_STATE_INPUT_REQUIRED"
        asked = paused[-1].status_update.status.message
        (data,) = get_data_parts(asked.parts)
        (pending,) = data["pending"]
        assert pending["name"] == "delete"
        decision = {"decisions": [{"token": pending["token"], "approve": True}]}
        task = paused[0].task.id
        resumed = await events(sender, message(None, context, task=task, data=decision))
    assert last_state(resumed) == "TASK_STATE_COMPLETED"
    assert answer(resumed) == "the tool said deleted notes.txt"
    assert "notes.txt" in (await anyio.Path(deleted).read_text()).splitlines()


async def test_cancelling_a_task_that_waits_denies_its_calls(
    server: ServedAgent, deleted: Path
) -> None:
    context = f"ctx-{uuid.uuid4().hex}"
    runs = anyio.Path(deleted)
    before = (await runs.read_text()).count("\n") if await runs.exists() else 0
    async with client(server) as (sender, _):
        paused = await events(sender, message("please delete notes", context))
        assert last_state(paused) == "TASK_STATE_INPUT_REQUIRED"
        (data,) = get_data_parts(paused[-1].status_update.status.message.parts)
        (pending,) = data["pending"]
        cancelled = await sender.cancel_task(CancelTaskRequest(id=paused[0].task.id))
        assert TaskState.Name(cancelled.status.state) == "TASK_STATE_CANCELED"
        # A later decision in the same context finds nothing to run.
        decision = {"decisions": [{"token": pending["token"], "approve": True}]}
        late = await events(sender, message(None, context, data=decision))
    assert last_state(late) == "TASK_STATE_FAILED"
    after = (await runs.read_text()).count("\n") if await runs.exists() else 0
    assert after == before
    stored = await _stored(server, context)
    assert [m["role"] for m in stored] == ["user", "assistant", "tool"]
    assert stored[2]["content"].startswith("The user did not approve this call")
    assert "the task was cancelled" in stored[2]["content"]


# asyncio only: leaving the a2a-sdk client's stream early leaves its inner generators
# unclosed, which trio reports as a ResourceWarning (an error in this suite).
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_cancel_closes_the_run_early(server: ServedAgent) -> None:
    context = f"ctx-{uuid.uuid4().hex}"
    async with client(server) as (sender, _):
        task_id = ""
        with anyio.fail_after(30):
            async with aclosing(sender.send_message(message("long", context))) as stream:
                async for event in stream:
                    if event.HasField("task"):
                        task_id = event.task.id
                    if event.HasField("artifact_update"):
                        break  # the answer streams: cancel it
            cancelled = await sender.cancel_task(CancelTaskRequest(id=task_id))
    assert TaskState.Name(cancelled.status.state) == "TASK_STATE_CANCELED"
    stored = await _stored(server, context)
    # The history provider (persist_partial=True) kept the partial answer: its post stage
    # ran with the early close before the task was cancelled.
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert 0 < len(stored[1]["content"]) < len(LONG)
    assert LONG.startswith(stored[1]["content"])


async def test_bad_messages_are_rejected_and_keys_checked(server: ServedAgent) -> None:
    async with client(server) as (sender, _):
        request = message("x", f"ctx-{uuid.uuid4().hex}")
        request.message.parts[0].CopyFrom(Part(url="http://example.invalid/a.png"))
        rejected = await events(sender, request)
    assert last_state(rejected) == "TASK_STATE_REJECTED"
    said = rejected[-1].status_update.status.message.parts[0].text
    assert said == "only text and data parts are understood here"
    async with httpx.AsyncClient(verify=TLS) as http:
        refused = await http.post(f"{server.url}/a2a", json={"jsonrpc": "2.0", "id": 1})
        card = await http.get(f"{server.url}/.well-known/agent-card.json")
    assert refused.status_code == 401
    assert card.status_code == 200  # the card is public: it says a bearer key is needed


async def test_the_0_3_method_names_answer_too(server: ServedAgent) -> None:
    sent = {
        "role": "user", "messageId": "m1", "contextId": f"ctx-{uuid.uuid4().hex}",
        "parts": [{"kind": "text", "text": "hello"}],
    }  # fmt: skip
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": sent}}
    async with httpx.AsyncClient(headers={"Authorization": "Bearer key-a"}, verify=TLS) as http:
        reply = (await http.post(f"{server.url}/a2a", json=body)).json()
    result = reply["result"]
    assert result["status"]["state"] == "completed"
    texts = [p["text"] for a in result["artifacts"] for p in a["parts"]]
    assert "".join(texts) == "seen 1: hello "


async def _stored(server: ServedAgent, context: str) -> list[dict[str, Any]]:
    url = f"{server.url}/v1/sessions/{context}/messages"
    async with httpx.AsyncClient(headers={"Authorization": "Bearer key-a"}, verify=TLS) as http:
        data: list[dict[str, Any]] = json.loads((await http.get(url)).content)["data"]
    return data


def test_without_the_extra_the_error_says_which_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "a2a.server.request_handlers", None)  # not installed
    monkeypatch.delitem(sys.modules, "raf.serve._a2a", raising=False)
    with pytest.raises(ConfigError, match=r"raf-agents\[a2a\]"):
        raf.serve.app(Agent(EchoChatClient(), name="echo"), a2a=True)


async def test_the_rpc_body_is_json_as_on_every_route(server: ServedAgent) -> None:
    sent = {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "hello"}]}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": sent}}
    headers = {"Authorization": "Bearer key-a", "A2A-Version": "1.0"}
    deep = b"[" * 100_000 + b"]" * 100_000
    async with httpx.AsyncClient(headers=headers, verify=TLS) as http:
        plain = await http.post(
            f"{server.url}/a2a", content=json.dumps(body), headers={"content-type": "text/plain"}
        )
        nested = await http.post(
            f"{server.url}/a2a", content=deep, headers={"content-type": "application/json"}
        )
    # A page of another site posts text/plain without asking first: refused as on the
    # other routes, before the agent runs.
    assert plain.status_code == 415
    assert plain.json()["error"]["code"] == "unsupported_media_type"
    # Nested too deeply: a 400 that says so, not the parser's own words in an internal error.
    assert nested.status_code == 400
    assert nested.json()["error"]["message"] == "the body is not usable JSON: nested too deeply"


def rpc(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


@asynccontextmanager
async def in_process(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` in this process, its lifespan entered."""
    transport = httpx.ASGITransport(app=app)
    headers = {"A2A-Version": "1.0"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://127.0.0.1", headers=headers
        ) as http,
    ):
        yield http


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the a2a-sdk server: asyncio only
async def test_the_tasks_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import raf.serve._a2a

    monkeypatch.setattr(raf.serve._a2a, "MAX_TASKS", 3)
    app = raf.serve.app(make_agent(), a2a=True)
    async with in_process(app) as http:
        ids = []
        for n in range(5):
            sent = {"role": "ROLE_USER", "messageId": f"m{n}", "parts": [{"text": f"hi {n}"}]}
            reply = await http.post("/a2a", json=rpc("SendMessage", {"message": sent}))
            ids.append(reply.json()["result"]["task"]["id"])
        listed = (await http.post("/a2a", json=rpc("ListTasks", {}))).json()["result"]
        first = (await http.post("/a2a", json=rpc("GetTask", {"id": ids[0]}))).json()
        last = (await http.post("/a2a", json=rpc("GetTask", {"id": ids[-1]}))).json()
    # Each message is a task the SDK's store would keep for ever: the oldest go.
    assert sorted(t["id"] for t in listed["tasks"]) == sorted(ids[-3:])
    assert first["error"]["message"] == "Task not found"
    assert last["result"]["status"]["state"] == "TASK_STATE_COMPLETED"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the a2a-sdk server: asyncio only
async def test_a_task_running_when_the_app_stops_is_closed_early() -> None:
    journal = Journal()
    app = raf.serve.app(Agent(WordModel(0.01), name="w", stack=[journal]), a2a=True)
    async with in_process(app) as http:
        sent = {"role": "ROLE_USER", "messageId": "m1", "parts": [{"text": "long"}]}
        later = {"message": sent, "configuration": {"returnImmediately": True}}
        await http.post("/a2a", json=rpc("SendMessage", later))
        await anyio.sleep(0.3)  # some of the answer is out (200 words, 0.01 s apart)
    # The run outlived its request: the app's end closes it early (the partial answer
    # to every entered provider), as a cancel does, not a cancellation that keeps nothing.
    [(error, partial)] = journal.seen
    assert error == "StreamClosedError"
    assert partial.startswith("w0 ")
