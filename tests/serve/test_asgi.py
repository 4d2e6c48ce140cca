"""raf.serve at the ASGI level, on asyncio and trio: the app called as a server calls it.

uvicorn runs on asyncio only; here the app itself runs on both backends,
driven by a minimal ASGI server of the test's own (``receive`` and ``send``),
which can say ``http.disconnect`` at any point of a streamed answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
import structlog.testing

import raf.serve
from raf import AgentResponse, ChatMessage, ContextProvider, HistoryProvider, StreamClosedError
from tests._harness.cli import run_raf
from tests._harness.serve_agent import WordModel, make_agent

pytestmark = pytest.mark.anyio
MODEL = "word-agent"


class Exchange:
    """One request through the app; ``leave_after`` events: the client disconnects then."""

    def __init__(self, leave_after: int | None = None) -> None:
        self.leave_after = leave_after
        self.messages: list[dict[str, Any]] = []
        self.gone = anyio.Event()

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    def events(self) -> list[str]:
        return [e[6:] for e in self.body.decode().split("\n\n") if e.startswith("data: ")]

    async def __call__(
        self,
        app: Any,
        path: str,
        body: Any = None,
        *,
        method: str = "POST",
        headers: Sequence[tuple[bytes, bytes]] = (),
    ) -> Exchange:
        data = json.dumps(body).encode() if body is not None else b""
        pending = [{"type": "http.request", "body": data, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if pending:
                return pending.pop()
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            self.messages.append(message)
            if self.leave_after is not None and len(self.events()) >= self.leave_after:
                self.gone.set()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), *headers],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        }
        await app(scope, receive, send)
        self.gone.set()
        return self


class Journal(ContextProvider):
    """Records what its post stage saw; its awaits must work (not under cancellation)."""

    def __init__(self, hang: bool = False) -> None:
        self.seen: list[tuple[str, str]] = []
        self.hang = hang

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        await anyio.sleep(0.01)  # would raise at once under a cancellation
        partial = error.partial.text if isinstance(error, StreamClosedError) else ""
        self.seen.append((type(error).__name__, partial))
        if self.hang:
            await anyio.sleep_forever()


def streamed(text: str) -> dict[str, Any]:
    return {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": text}]}


async def test_a_disconnect_is_an_early_close_with_the_partial_answer_stored(
    anyio_backend: str,
) -> None:
    journal = Journal()
    history = HistoryProvider(persist_partial=True)
    app = raf.serve.app(raf.Agent(WordModel(0.001), name=MODEL, stack=[history, journal]))
    session = [(b"x-session-id", b"tab")]
    left = await Exchange(leave_after=5)(
        app, "/v1/chat/completions", streamed("long"), headers=session
    )
    assert left.status == 200
    assert "[DONE]" not in left.events()
    # Every entered provider got StreamClosedError with what the client received.
    [(error, partial)] = journal.seen
    assert error == "StreamClosedError"
    assert partial.startswith("w0 w1 w2 ")
    assert len(partial.split()) < 200
    listed = await Exchange()(app, "/v1/sessions/tab/messages", method="GET")
    stored = json.loads(listed.body)["data"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["content"] == partial
    # The next turn sees it.
    again = await Exchange()(app, "/v1/chat/completions", streamed("again"), headers=session)
    chunks = [json.loads(e) for e in again.events() if e != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "seen 3: again "
    assert journal.seen[-1] == ("NoneType", "")


async def test_a_disconnect_after_the_whole_answer_leaves_the_run_completed(
    anyio_backend: str,
) -> None:
    """The client leaves once the run is done: nothing is closed, the run completed."""
    journal = Journal()
    app = raf.serve.app(raf.Agent(WordModel(), name=MODEL, stack=[journal]))
    done = await Exchange()(app, "/v1/chat/completions", streamed("hi there"))
    assert done.events()[-1] == "[DONE]"
    assert journal.seen == [("NoneType", "")]


async def test_a_hung_post_stage_after_a_disconnect_is_bounded_by_post_timeout(
    anyio_backend: str,
) -> None:
    journal = Journal(hang=True)
    agent = raf.Agent(WordModel(0.001), name=MODEL, stack=[journal], post_timeout=0.2)
    app = raf.serve.app(agent)
    with anyio.fail_after(10):  # a hung post stage cannot keep the request open for ever
        left = await Exchange(leave_after=3)(app, "/v1/chat/completions", streamed("long"))
    assert left.status == 200
    assert journal.seen[0][0] == "StreamClosedError"


async def test_a_whole_answer_and_the_models_route_on_both_backends(anyio_backend: str) -> None:
    app = raf.serve.app(make_agent())
    plain = await Exchange()(app, "/v1/chat/completions", {**streamed("hi there"), "stream": False})
    assert plain.status == 200
    assert json.loads(plain.body)["choices"][0]["message"]["content"] == "seen 1: hi there "
    done = await Exchange()(app, "/v1/chat/completions", streamed("hi"))
    assert done.events()[-1] == "[DONE]"
    listed = await Exchange()(app, "/v1/models", method="GET")
    assert json.loads(listed.body)["data"][0]["id"] == MODEL
    missing = await Exchange()(app, "/nowhere", method="GET")
    assert missing.status == 404
    assert json.loads(missing.body)["error"]["message"]


async def test_healthz_is_a_503_when_the_store_does_not_answer(anyio_backend: str) -> None:
    class Broken:
        async def get(self, session_id: str) -> Any:
            raise OSError("connection refused")

    app = raf.serve.app(make_agent(), store=Broken())
    with structlog.testing.capture_logs() as logs:
        reply = await Exchange()(app, "/healthz", method="GET")
    assert reply.status == 503
    body = json.loads(reply.body)
    assert body["error"] == "the session store failed"  # the store's own words: in the log
    [line] = [e for e in logs if e["event"] == "raf.serve: the request failed"]
    assert "connection refused" in line["cause"]
    assert line["request_id"] == body["request_id"]
    ok = await Exchange()(raf.serve.app(make_agent()), "/healthz", method="GET")
    assert ok.status == 200


def test_app_rejects_what_is_not_an_agent_and_bad_limits() -> None:
    with pytest.raises(TypeError, match=r"raf\.Agent"):
        raf.serve.app("agent")  # type: ignore[arg-type]
    with pytest.raises(raf.errors.ConfigError, match="max_body"):
        raf.serve.app(make_agent(), max_body=0)
    with pytest.raises(raf.errors.ConfigError, match="api_keys"):
        raf.serve.app(make_agent(), api_keys="one-key")


async def test_app_takes_serve_options_whole_or_as_keywords(anyio_backend: str) -> None:
    keyed = raf.serve.ServeOptions(api_keys=["key-one"])
    bearer = [(b"authorization", b"Bearer key-one")]
    for app in (
        raf.serve.app(make_agent(), keyed),
        raf.serve.app(make_agent(), api_keys=["key-one"]),
        raf.serve.app(make_agent(), raf.serve.ServeOptions(), api_keys=["key-one"]),
    ):
        assert (await Exchange()(app, "/v1/models", method="GET")).status == 401
        assert (await Exchange()(app, "/v1/models", method="GET", headers=bearer)).status == 200
    # The keywords change the options given.
    opened = raf.serve.app(make_agent(), keyed, api_keys=None)
    assert (await Exchange()(opened, "/v1/models", method="GET")).status == 200


def test_app_refuses_an_option_serve_options_does_not_have() -> None:
    with pytest.raises(TypeError, match="max_bodys"):
        raf.serve.app(make_agent(), max_bodys=16)
    with pytest.raises(TypeError, match="ServeOptions"):
        raf.serve.app(make_agent(), {"max_body": 16})  # type: ignore[arg-type]
    # The runs' options= is no place for a ServeOptions (every request was a 500).
    with pytest.raises(TypeError, match=r"options=\.\.\.\): a raf\.AgentRunOptions"):
        raf.serve.app(make_agent(), options=raf.serve.ServeOptions())  # type: ignore[arg-type]


def test_raf_serve_refuses_workers_without_a_shared_store(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nname = "a"\n[model]\nclient = "echo"\n')
    assert run_raf(["serve", str(config), "--workers", "2"]) == 2
    assert "--workers above 1 needs --db" in capsys.readouterr().err
    assert run_raf(["serve", str(tmp_path / "missing.toml")]) == 2


async def test_cors_is_off_unless_origins_are_given(anyio_backend: str) -> None:
    preflight = [
        (b"origin", b"https://chat.example"),
        (b"access-control-request-method", b"POST"),
    ]
    closed = await Exchange()(
        raf.serve.app(make_agent()), "/v1/models", method="OPTIONS", headers=preflight
    )
    assert closed.status == 403  # without keys, another site's page is refused
    assert not [h for h in closed.messages[0]["headers"] if h[0].startswith(b"access-control")]
    app = raf.serve.app(make_agent(), cors_origins=["https://chat.example"])
    opened = await Exchange()(app, "/v1/models", method="OPTIONS", headers=preflight)
    assert opened.status == 200
    headers = dict(opened.messages[0]["headers"])
    assert headers[b"access-control-allow-origin"] == b"https://chat.example"


class Failing(ContextProvider):
    """A post stage that fails."""

    async def on_invoked(self, *args: Any) -> None:
        raise RuntimeError("the audit log is down")


async def test_a_send_that_raises_is_an_early_close_and_a_failed_post_stage_is_logged(
    anyio_backend: str,
) -> None:
    # A server that raises on a closed connection (no http.disconnect): the client is gone.
    journal = Journal()
    agent = raf.Agent(WordModel(0.001), name=MODEL, stack=[Failing(), journal])
    app = raf.serve.app(agent)
    body = json.dumps(streamed("long")).encode()
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        if len(sent) == 4:
            raise OSError("connection reset by peer")
        sent.append(message)

    scope = {
        "type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
        "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1),
    }  # fmt: skip
    with structlog.testing.capture_logs() as logs, anyio.fail_after(10):
        await app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert len(sent) == 4
    [(error, partial)] = journal.seen
    assert error == "StreamClosedError"
    assert partial.startswith("w0 w1 ")
    assert len(partial.split()) < 200
    [warning] = [e for e in logs if "post stage failed after the client left" in e["event"]]
    assert "the audit log is down" in warning["error"]


async def test_responses_without_a_store_keep_a_bounded_number_of_unnamed_sessions(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Responses request names no session: the server makes one for a previous_response_id
    # that may never come. In memory, the last MAX_UNNAMED are kept, the oldest dropped.
    import httpx2 as httpx

    import raf.serve._sessions

    monkeypatch.setattr(raf.serve._sessions, "MAX_UNNAMED", 3)
    app = raf.serve.app(make_agent())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:

        async def ask(text: str, previous: str | None = None) -> dict[str, Any]:
            body = {"model": MODEL, "input": text, "previous_response_id": previous}
            reply = await http.post("/v1/responses", json=body)
            assert reply.status_code == 200, reply.text
            answer: dict[str, Any] = reply.json()
            return answer

        first = await ask("one")
        named = await http.post(
            "/v1/responses",
            json={"model": MODEL, "input": "named"},
            headers={"x-session-id": "mine"},
        )
        assert named.status_code == 200
        kept = await ask("two")
        again = await ask("three", kept["id"])  # used again: not the oldest any more
        assert again["output"][0]["content"][0]["text"].startswith("seen 3:")
        for n in range(2):  # one more than room: the oldest goes
            await ask(f"more {n}")
        still = await ask("four", again["id"])
        assert still["output"][0]["content"][0]["text"].startswith("seen 5:")
        went = await ask("five", first["id"])  # the oldest: dropped, its history gone
        assert went["output"][0]["content"][0]["text"].startswith("seen 1:")
        # A session the client named is kept: never dropped to make room.
        history = await http.get("/v1/sessions/mine/messages")
        assert [m["content"] for m in history.json()["data"]][:1] == ["named"]


async def test_one_keys_unnamed_sessions_never_push_out_another_keys(
    anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bound is each key's: a key that sends many stateless-looking Responses requests
    # drops its own oldest sessions, not the conversations of the other keys.
    import httpx2 as httpx

    import raf.serve._sessions

    monkeypatch.setattr(raf.serve._sessions, "MAX_UNNAMED", 2)
    app = raf.serve.app(make_agent(), api_keys=["key-a", "key-b"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:

        async def ask(key: str, text: str, previous: str | None = None) -> dict[str, Any]:
            body = {"model": MODEL, "input": text, "previous_response_id": previous}
            headers = {"authorization": f"Bearer {key}"}
            reply = await http.post("/v1/responses", json=body, headers=headers)
            assert reply.status_code == 200, reply.text
            answer: dict[str, Any] = reply.json()
            return answer

        mine = await ask("key-a", "one")
        for n in range(5):
            await ask("key-b", f"flood {n}")
        still = await ask("key-a", "two", mine["id"])
        assert still["output"][0]["content"][0]["text"].startswith("seen 3:")
