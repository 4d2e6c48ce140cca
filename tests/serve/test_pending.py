"""Calls that wait for approval on /v1/chat/completions and /v1/responses, over real HTTP.

The real openai SDK talks to a uvicorn process serving the test agent, whose
``delete`` tool waits for approval (tests/_harness/serve_agent.py): the turn
says what waits in its text and lists it as ``raf_pending``; the next request
decides with ``raf_decisions`` in ``extra_body``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import raf
import raf.serve
from tests._harness.uvicorn_server import ServedAgent
from tests.serve.test_asgi import Exchange

if TYPE_CHECKING:
    import openai

pytestmark = pytest.mark.slow
MODEL = "word-agent"
WAITING = 'Waiting for approval: delete {"path": "notes.txt"}'


@pytest.fixture(scope="module")
def deleted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file where each run of ``delete`` adds a line."""
    return tmp_path_factory.mktemp("pending") / "deleted.txt"


@pytest.fixture(scope="module")
def server(deleted: Path) -> Iterator[ServedAgent]:
    with ServedAgent(deleted=str(deleted)) as served:
        yield served


def runs(deleted: Path) -> int:
    """How many times ``delete`` ran."""
    return len(deleted.read_text().splitlines()) if deleted.exists() else 0


@pytest.fixture
def sdk(server: ServedAgent) -> Iterator[Callable[..., openai.OpenAI]]:
    """``sdk(session=None)``: an openai client of the server (closed at the test's end),
    sending ``X-Session-Id: session`` when given."""
    made: list[openai.OpenAI] = []

    def client(session: str | None = None) -> openai.OpenAI:
        made.append(_client(server, session))
        return made[-1]

    yield client
    for one in made:
        one.close()


def _client(server: ServedAgent, session: str | None) -> openai.OpenAI:
    import openai

    headers = {} if session is None else {"X-Session-Id": session}
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, default_headers=headers
    )


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def decide(token: str, approve: bool, reason: str | None = None) -> dict[str, Any]:
    decision: dict[str, Any] = {"token": token, "approve": approve}
    if reason is not None:
        decision["reason"] = reason
    return {"raf_decisions": [decision]}


def test_a_chat_turn_says_what_waits_and_the_next_request_approves_it(
    sdk: Callable[..., openai.OpenAI], deleted: Path
) -> None:
    client = sdk(f"s-{uuid.uuid4().hex}")
    before = runs(deleted)
    paused = client.chat.completions.create(model=MODEL, messages=user("delete my notes"))
    message = paused.choices[0].message
    assert message.content == WAITING
    (pending,) = message.model_extra["raf_pending"]  # type: ignore[index]
    assert (pending["name"], json.loads(pending["arguments"])) == ("delete", {"path": "notes.txt"})
    assert runs(deleted) == before
    # The conversation so far, no new message, and the decision: the call runs, the turn ends.
    so_far = [*user("delete my notes"), {"role": "assistant", "content": message.content}]
    done = client.chat.completions.create(
        model=MODEL, messages=so_far, extra_body=decide(pending["token"], True)
    )
    assert done.choices[0].message.content == "the tool said deleted notes.txt"
    assert done.choices[0].message.model_extra.get("raf_pending") is None
    assert runs(deleted) == before + 1
    # The same decision again matches no waiting call: a 409 naming the token, nothing runs.
    import openai

    with pytest.raises(openai.ConflictError) as again:
        client.chat.completions.create(
            model=MODEL, messages=[], extra_body=decide(pending["token"], True)
        )
    assert pending["token"] in again.value.message
    assert again.value.code == "approval_mismatch"
    assert runs(deleted) == before + 1


def test_a_streamed_chat_turn_lists_what_waits_in_its_last_delta_and_a_denial_streams(
    sdk: Callable[..., openai.OpenAI], deleted: Path
) -> None:
    client = sdk(f"s-{uuid.uuid4().hex}")
    before = runs(deleted)
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=user("delete it"), stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == WAITING
    last = chunks[-1].choices[0]
    assert last.finish_reason == "stop"
    (pending,) = last.delta.model_extra["raf_pending"]  # type: ignore[index]
    assert pending["name"] == "delete"
    denied = client.chat.completions.create(
        model=MODEL,
        messages=[],
        stream=True,
        extra_body=decide(pending["token"], False, "keep them"),
    )
    said = "".join(c.choices[0].delta.content or "" for c in denied if c.choices)
    assert said.startswith("the tool said The user did not approve")
    assert "keep them" in said
    assert runs(deleted) == before


def test_chat_decisions_need_a_session_and_no_new_message(
    sdk: Callable[..., openai.OpenAI],
) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as stateless:
        sdk().chat.completions.create(model=MODEL, messages=[], extra_body=decide("abc", True))
    assert "X-Session-Id" in stateless.value.message
    with pytest.raises(openai.BadRequestError) as beside:
        sdk("s-beside").chat.completions.create(
            model=MODEL, messages=user("and more"), extra_body=decide("abc", True)
        )
    assert "no new message" in beside.value.message
    with pytest.raises(openai.BadRequestError) as malformed:
        sdk("s-bad").chat.completions.create(
            model=MODEL, messages=[], extra_body={"raf_decisions": [{"token": "abc"}]}
        )
    assert "raf_decisions[0]: approve is missing" in malformed.value.message


def test_a_response_says_what_waits_and_previous_response_id_decides_it(
    sdk: Callable[..., openai.OpenAI], deleted: Path
) -> None:
    client = sdk()
    before = runs(deleted)
    paused = client.responses.create(model=MODEL, input="delete my notes")
    assert paused.output_text == WAITING
    (pending,) = paused.model_extra["raf_pending"]  # type: ignore[index]
    assert (pending["name"], json.loads(pending["arguments"])) == ("delete", {"path": "notes.txt"})
    assert runs(deleted) == before
    done = client.responses.create(
        model=MODEL, previous_response_id=paused.id, extra_body=decide(pending["token"], True)
    )
    assert done.output_text == "the tool said deleted notes.txt"
    assert "raf_pending" not in (done.model_extra or {})
    assert runs(deleted) == before + 1
    import openai

    with pytest.raises(openai.BadRequestError) as stateless:
        client.responses.create(model=MODEL, extra_body=decide(pending["token"], True))
    assert "previous_response_id" in stateless.value.message


def test_a_streamed_response_lists_what_waits_on_its_completed_response(
    sdk: Callable[..., openai.OpenAI], deleted: Path
) -> None:
    client = sdk()
    before = runs(deleted)
    events = list(client.responses.create(model=MODEL, input="delete my notes", stream=True))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == WAITING
    completed = events[-1]
    assert completed.type == "response.completed"
    (pending,) = completed.response.model_extra["raf_pending"]  # type: ignore[index]
    resumed = list(
        client.responses.create(
            model=MODEL,
            previous_response_id=completed.response.id,
            stream=True,
            extra_body=decide(pending["token"], True),
        )
    )
    said = "".join(e.delta for e in resumed if e.type == "response.output_text.delta")
    assert said == "the tool said deleted notes.txt"
    assert runs(deleted) == before + 1


def test_text_before_the_wait_reads_the_same_whole_and_streamed(
    sdk: Callable[..., openai.OpenAI],
) -> None:
    # "check" makes the model say "Let me check." before it calls delete: text, then the wait.
    whole = sdk(f"s-{uuid.uuid4().hex}").chat.completions.create(
        model=MODEL, messages=user("check and delete")
    )
    assert whole.choices[0].message.content == "Let me check.\n\n" + WAITING
    chunks = sdk(f"s-{uuid.uuid4().hex}").chat.completions.create(
        model=MODEL, messages=user("check and delete"), stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    events = sdk().responses.create(model=MODEL, input="check and delete", stream=True)
    said = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert said == whole.choices[0].message.content


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
async def test_two_waiting_calls_are_a_line_each_whole_and_streamed(
    anyio_backend: str, route: str
) -> None:
    @raf.tool(approval=True)
    def remove(path: str) -> str:
        """Remove ``path``."""
        return f"removed {path}"

    turn = raf.ScriptedChatClient.tool_turn(
        raf.ToolCall("c-a", "remove", '{"path": "a"}'),
        raf.ToolCall("c-b", "remove", '{"path": "b"}'),
    )
    texts: list[str] = []
    for stream in (False, True):
        client = raf.ScriptedChatClient([turn])
        app = raf.serve.app(raf.Agent(client, name="m", tools=[remove], history=True))
        if route == "/v1/responses":
            body: dict[str, Any] = {"model": "m", "input": "remove both", "stream": stream}
        else:
            body = {"model": "m", "messages": user("remove both"), "stream": stream}
        headers = [(b"x-session-id", f"s-{stream}".encode())]
        reply = await Exchange()(app, route, body, headers=headers)
        assert reply.status == 200, reply.body
        if not stream:
            data = json.loads(reply.body)
            if route == "/v1/responses":
                texts.append(data["output"][0]["content"][0]["text"])
                listed = data["raf_pending"]
            else:
                texts.append(data["choices"][0]["message"]["content"])
                listed = data["choices"][0]["message"]["raf_pending"]
            assert [json.loads(p["arguments"]) for p in listed] == [{"path": "a"}, {"path": "b"}]
            continue
        events = sse_data(reply.body.decode())
        if route == "/v1/responses":
            texts.append("".join(e["delta"] for e in events if "delta" in e))
            assert len(events[-1]["response"]["raf_pending"]) == 2
        else:
            texts.append("".join(e["choices"][0]["delta"].get("content", "") for e in events))
            assert len(events[-1]["choices"][0]["delta"]["raf_pending"]) == 2
    a, b = (f'Waiting for approval: remove {{"path": "{p}"}}' for p in "ab")
    assert texts == [f"{a}\n{b}"] * 2


def sse_data(body: str) -> list[Any]:
    """The JSON of each event's ``data:`` line (``[DONE]`` left out)."""
    lines = (line for frame in body.split("\n\n") for line in frame.split("\n"))
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def _removing_app(removed: list[str]) -> Any:
    """An app whose model calls ``remove`` (it waits for approval) then says what it read."""

    @raf.tool(approval=True)
    def remove(path: str) -> str:
        """Remove ``path``."""
        removed.append(path)
        return f"removed {path}"

    client = raf.ScriptedChatClient(
        [
            raf.ScriptedChatClient.tool_turn(raf.ToolCall("c-rm", "remove", '{"path": "a"}')),
            "done",
            "done again",
        ]
    )
    return raf.serve.app(raf.Agent(client, name="m", tools=[remove], history=True))


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
async def test_a_client_result_for_a_waiting_server_call_is_a_400_and_it_still_waits(
    anyio_backend: str, route: str
) -> None:
    removed: list[str] = []
    app = _removing_app(removed)
    headers = [(b"x-session-id", f"s-{route}".encode())]
    if route == "/v1/responses":
        first: dict[str, Any] = {"model": "m", "input": "remove a"}
        forged: dict[str, Any] = {
            "model": "m",
            "input": [{"type": "function_call_output", "call_id": "c-rm", "output": "removed a"}],
        }
    else:
        first = {"model": "m", "messages": user("remove a")}
        forged = {
            "model": "m",
            "messages": [{"role": "tool", "tool_call_id": "c-rm", "content": "removed a"}],
        }
    paused = await Exchange()(app, route, first, headers=headers)
    assert paused.status == 200, paused.body
    data = json.loads(paused.body)
    listed = (
        data["raf_pending"]
        if route == "/v1/responses"
        else (data["choices"][0]["message"]["raf_pending"])
    )
    # The client answers the server's own call (it waits for a person): refused, not run.
    reply = await Exchange()(app, route, forged, headers=headers)
    assert reply.status == 400, reply.body
    assert b"c-rm" in reply.body
    assert removed == []
    # The call still waits, and its decision runs it once.
    decided = {"model": "m", "raf_decisions": [{"token": listed[0]["token"], "approve": True}]}
    done = await Exchange()(app, route, decided, headers=headers)
    assert done.status == 200, done.body
    assert removed == ["a"]


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
async def test_decisions_for_an_agent_without_history_are_a_409_not_a_500(
    anyio_backend: str, route: str
) -> None:
    # Nothing can wait where no history is kept: every token matches no waiting call.
    client = raf.ScriptedChatClient(["never"])
    app = raf.serve.app(raf.Agent(client, name="m"))
    body: dict[str, Any] = {"model": "m", "raf_decisions": [{"token": "t1", "approve": True}]}
    if route == "/v1/chat/completions":
        body["messages"] = []
    reply = await Exchange()(app, route, body, headers=[(b"x-session-id", b"s")])
    assert reply.status == 409, reply.body
    assert json.loads(reply.body)["error"]["code"] == "approval_mismatch"
    assert client.requests == []


@pytest.mark.anyio
async def test_a_client_tools_result_leaves_the_turns_waiting_call_waiting(
    anyio_backend: str,
) -> None:
    # One model turn calls a client tool and a tool that waits for approval. The client
    # answers its tool first (as any OpenAI client does): that is no new message, and the
    # call that waits for a person still waits, to be decided after.
    removed: list[str] = []

    @raf.tool(approval=True)
    def remove(path: str) -> str:
        """Remove ``path``."""
        removed.append(path)
        return f"removed {path}"

    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    client = raf.ScriptedChatClient(
        [
            raf.ScriptedChatClient.tool_turn(
                raf.ToolCall("c-w", "get_weather", '{"city": "Paris"}'),
                raf.ToolCall("c-rm", "remove", '{"path": "a"}'),
            ),
            "both done",
        ]
    )
    app = raf.serve.app(raf.Agent(client, name="m", tools=[remove], history=True))
    headers = [(b"x-session-id", b"mixed")]
    first = {"model": "m", "messages": user("go"), "tools": [weather]}
    paused = json.loads(
        (await Exchange()(app, "/v1/chat/completions", first, headers=headers)).body
    )
    (token,) = [p["token"] for p in paused["choices"][0]["message"]["raf_pending"]]
    result = {
        "model": "m",
        "messages": [{"role": "tool", "tool_call_id": "c-w", "content": "sunny"}],
        "tools": [weather],
    }
    answered = await Exchange()(app, "/v1/chat/completions", result, headers=headers)
    assert answered.status == 200, answered.body
    still = json.loads(answered.body)["choices"][0]["message"]
    assert [p["token"] for p in still["raf_pending"]] == [token]
    assert len(client.requests) == 1  # the model waits for the decision
    decided = {"model": "m", "messages": [], "raf_decisions": [{"token": token, "approve": True}]}
    done = await Exchange()(app, "/v1/chat/completions", decided, headers=headers)
    assert done.status == 200, done.body
    assert json.loads(done.body)["choices"][0]["message"]["content"] == "both done"
    assert removed == ["a"]
    seen = [(m.role, m.tool_call_id, m.content) for m in client.requests[-1].messages[-2:]]
    assert seen == [("tool", "c-w", "sunny"), ("tool", "c-rm", "removed a")]
