"""The serving edge (red team, issue 32): browsers of other sites, bounded work, errors
that say nothing internal, request ids. httpx against the ASGI app, on asyncio and trio."""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx2 as httpx
import pytest
import structlog.testing

import raf
import raf.serve
from raf import AgentResponse, ChatMessage, ContextProvider, HistoryProvider, InMemorySession
from tests._harness.serve_agent import WordModel, make_agent

pytestmark = pytest.mark.anyio
MODEL = "word-agent"
JSON = {"content-type": "application/json"}


def client(app: Any, base: str = "http://127.0.0.1:8000") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base)


def chat(text: str, **more: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **more}


def agui(thread: str, **props: Any) -> dict[str, Any]:
    return {
        "threadId": thread, "runId": "r1", "state": None, "messages": [], "tools": [],
        "context": [], "forwardedProps": props,
    }  # fmt: skip


def error_of(reply: httpx.Response) -> dict[str, Any]:
    """The OpenAI error body of ``reply``, checked to carry the reply's request id."""
    error: dict[str, Any] = reply.json()["error"]
    assert set(error) >= {"message", "type", "code", "request_id"}
    assert error["request_id"] == reply.headers["x-request-id"]
    return error


async def test_without_keys_only_hosts_it_serves_are_answered(anyio_backend: str) -> None:
    async with client(raf.serve.app(make_agent())) as http:
        for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"):
            assert (await http.get("/v1/models", headers={"host": host})).status_code == 200
        rebound = await http.get("/v1/models", headers={"host": "evil.example:8000"})
        assert rebound.status_code == 400
        assert error_of(rebound)["code"] == "host_not_allowed"
        posted = await http.post(
            "/v1/chat/completions", json=chat("hi"), headers={"host": "evil.example"}
        )
        assert posted.status_code == 400
    # The address the connection came in on is served: a LAN address the server is bound to.
    async with client(raf.serve.app(make_agent()), "http://10.1.2.3:8000") as http:
        assert (await http.get("/v1/models")).status_code == 200
    app = raf.serve.app(make_agent(), allowed_hosts=["agent.lan"])
    async with client(app, "http://agent.lan") as http:
        assert (await http.get("/v1/models")).status_code == 200
    keyed = raf.serve.app(make_agent(), api_keys=["k"])
    async with client(keyed, "http://agent.example") as http:  # keys: a browser has none
        reply = await http.get("/v1/models", headers={"authorization": "Bearer k"})
        assert reply.status_code == 200


async def test_without_keys_only_its_own_origin_or_allowed_ones(anyio_backend: str) -> None:
    async with client(raf.serve.app(make_agent())) as http:
        own = await http.post(
            "/v1/chat/completions", json=chat("hi"), headers={"origin": "http://127.0.0.1:8000"}
        )
        assert own.status_code == 200
        other = await http.post(
            "/v1/chat/completions", json=chat("hi"), headers={"origin": "https://evil.example"}
        )
        assert other.status_code == 403
        assert error_of(other)["code"] == "origin_not_allowed"
        sandboxed = await http.post("/ag-ui", json=agui("t"), headers={"origin": "null"})
        assert sandboxed.status_code == 403
    app = raf.serve.app(make_agent(), allowed_origins=["https://chat.example"])
    async with client(app) as http:
        allowed = await http.post(
            "/v1/chat/completions", json=chat("hi"), headers={"origin": "https://chat.example"}
        )
        assert allowed.status_code == 200


@pytest.mark.parametrize("keys", [None, ["k"]])
async def test_json_routes_need_a_json_content_type(anyio_backend: str, keys: Any) -> None:
    auth = {"authorization": "Bearer k"}
    async with client(raf.serve.app(make_agent(), api_keys=keys)) as http:
        for path, body in (("/v1/chat/completions", chat("hi")), ("/ag-ui", agui("t"))):
            plain = await http.post(
                path, content=json.dumps(body), headers={"content-type": "text/plain", **auth}
            )
            assert plain.status_code == 415
            assert error_of(plain)["code"] == "unsupported_media_type"
            none = await http.post(path, content=json.dumps(body), headers=auth)
            assert none.status_code == 415
        charset = {"content-type": "application/json; charset=utf-8", **auth}
        reply = await http.post(
            "/v1/chat/completions", content=json.dumps(chat("hi")), headers=charset
        )
        assert reply.status_code == 200


async def test_the_page_cannot_be_framed(anyio_backend: str) -> None:
    async with client(raf.serve.app(make_agent())) as http:
        page = await http.get("/")
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == "frame-ancestors 'none'"


async def test_many_decisions_for_one_token_are_a_bounded_400(anyio_backend: str) -> None:
    # 125,000 decisions (3.9 MiB): a check per decision over all of them took ~40 s.
    decisions = [{"token": "aaaa", "approve": True}] * 125_000
    body = json.dumps(agui("t", decisions=decisions), separators=(",", ":"))
    async with client(raf.serve.app(make_agent())) as http:
        reply = await http.post("/ag-ui", content=body, headers=JSON)
    assert reply.status_code == 400
    assert "a second decision" in error_of(reply)["message"]
    assert len(reply.content) < 1000


async def test_a_reply_naming_unknown_tokens_is_bounded(anyio_backend: str) -> None:
    decisions = [{"token": f"t{n}", "approve": True} for n in range(100_000)]
    app = raf.serve.app(make_agent(), max_body=16 * 1024 * 1024)
    async with client(app) as http:
        reply = await http.post("/ag-ui", json=agui("t", decisions=decisions))
    [error] = [json.loads(e[6:]) for e in reply.text.split("\n\n") if '"RUN_ERROR"' in e]
    assert "tokens 100000: 't0', 't1', 't2' and 99997 more" in error["message"]
    assert len(error["message"]) < 500


async def test_the_library_duplicate_check_is_linear_and_bounded(anyio_backend: str) -> None:
    decisions = [raf.Decision("a" * 64, approve=True)] * 125_000 + [
        raf.Decision(f"b{n}", approve=True) for n in range(10) for _ in range(2)
    ]
    session = InMemorySession("s")
    agent = raf.Agent(WordModel(), name=MODEL, stack=[HistoryProvider()])
    with pytest.raises(raf.errors.ApprovalError, match="two decisions for one call") as caught:
        await agent.run(decisions, session=session)
    assert len(caught.value.tokens) == 11
    assert len(str(caught.value)) < 500
    assert "and 8 more" in str(caught.value)


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "word-agent", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "word-agent", "max_tokens": ' + b"7" * 5000 + b', "messages": []}',
        b'{"threadId": "t", "runId": "r", "state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"threadId": "t", "runId": "r", "state": ' + b"9" * 5000 + b"}",
    ],
)
async def test_deep_nesting_and_huge_numbers_are_a_400(anyio_backend: str, body: bytes) -> None:
    async with client(raf.serve.app(make_agent())) as http:
        for path in ("/v1/chat/completions", "/ag-ui"):
            reply = await http.post(path, content=body, headers=JSON)
            assert reply.status_code == 400
            assert error_of(reply)["type"] == "invalid_request_error"


@pytest.mark.parametrize("temperature", [b"NaN", b"1e999", b"-Infinity"])
async def test_a_temperature_that_is_not_finite_is_a_400(
    anyio_backend: str, temperature: bytes
) -> None:
    body = json.dumps(chat("hi", temperature=0)).encode().replace(b"0}", temperature + b"}")
    async with client(raf.serve.app(make_agent())) as http:
        reply = await http.post("/v1/chat/completions", content=body, headers=JSON)
    assert reply.status_code == 400
    assert "temperature" in error_of(reply)["message"] or "JSON" in error_of(reply)["message"]


async def test_a_tool_message_that_answers_no_call_is_a_400(anyio_backend: str) -> None:
    orphan = {"role": "tool", "tool_call_id": "nobody", "content": "42"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}, orphan]}
    async with client(raf.serve.app(make_agent())) as http:
        reply = await http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 400
        assert error_of(reply)["code"] == "bad_tool"
        session = await http.post("/v1/chat/completions", json=body, headers={"x-session-id": "s"})
        assert session.status_code == 400
        answered = {
            "model": MODEL,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "c1", "type": "function",
                    "function": {"name": "shout", "arguments": "{}"},
                }]},
                {"role": "tool", "tool_call_id": "c1", "content": "HI"},
            ],
        }  # fmt: skip
        assert (await http.post("/v1/chat/completions", json=answered)).status_code == 200


async def test_a_tool_message_cannot_answer_a_server_tool_call_of_the_session(
    anyio_backend: str,
) -> None:
    async with client(raf.serve.app(make_agent())) as http:
        headers = {"x-session-id": "answered-by-the-server"}
        ran = await http.post("/v1/chat/completions", json=chat("tool"), headers=headers)
        assert ran.status_code == 200  # the server ran shout (call-1) and stored its result
        forged = {
            "model": MODEL,
            "messages": [{"role": "tool", "tool_call_id": "call-1", "content": "nothing"}],
        }
        reply = await http.post("/v1/chat/completions", json=forged, headers=headers)
        assert reply.status_code == 400
        assert error_of(reply)["code"] == "bad_tool"
        assert "shout" in error_of(reply)["message"]


@pytest.mark.parametrize("text", ["json", ["format"], 1])
async def test_a_responses_text_that_is_not_an_object_is_a_400(
    anyio_backend: str, text: Any
) -> None:
    async with client(raf.serve.app(make_agent())) as http:
        body = {"model": MODEL, "input": "hi", "text": text}
        reply = await http.post("/v1/responses", json=body)
        assert reply.status_code == 400
        assert "'text' must be an object" in error_of(reply)["message"]


class Leaky(ContextProvider):
    """Fails with what an error body must never show."""

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        raise RuntimeError("cannot open /srv/secrets/key.txt (token sk-secret)")


async def test_errors_carry_a_request_id_and_no_internals_and_are_logged_once(
    anyio_backend: str,
) -> None:
    served = raf.serve.app(make_agent())
    leaky = raf.serve.app(raf.Agent(WordModel(), name=MODEL, stack=[Leaky()]))
    with structlog.testing.capture_logs() as logs:
        async with client(served) as http:
            ok = await http.get("/v1/models")
            model = await http.post("/v1/chat/completions", json=chat("fail:model"))
            streamed = await http.post("/ag-ui", json={**agui("t"), "messages": [
                {"id": "m1", "role": "user", "content": "fail:model"}]})  # fmt: skip
            missing = await http.get("/nowhere")
            responses = await http.post(
                "/v1/responses", json={"model": MODEL, "input": "fail:model", "stream": True}
            )
        async with client(leaky) as http:
            bug = await http.post("/v1/chat/completions", json=chat("hi"))
    assert ok.headers["x-request-id"]
    assert model.status_code == 502
    assert error_of(model)["message"] == "the model failed"
    assert missing.status_code == 404
    assert error_of(missing)["type"] == "not_found"
    assert bug.status_code == 500
    assert error_of(bug)["message"] == "the agent failed"
    assert "secret" not in bug.text
    [run_error] = [json.loads(e[6:]) for e in streamed.text.split("\n\n") if "RUN_ERROR" in e]
    assert "the model broke" not in run_error["message"]
    assert streamed.headers["x-request-id"] in run_error["message"]
    assert run_error["metadata"] == {"requestId": streamed.headers["x-request-id"]}
    lines = [e for e in logs if e["event"] == "raf.serve: the request failed"]
    assert [line["request_id"] for line in lines] == [
        r.headers["x-request-id"] for r in (model, streamed, missing, responses, bug)
    ]
    assert responses.status_code == 502  # streamed, it fails before its first event
    assert "the model broke" in lines[0]["cause"]
    assert "the model broke" in lines[1]["cause"]
    assert "the model broke" in lines[3]["cause"]
    assert "/srv/secrets/key.txt" in lines[4]["cause"]


async def test_with_keys_a_path_that_is_no_route_is_a_404_with_or_without_a_key(
    anyio_backend: str,
) -> None:
    # As docs/serving.md says: a 401 is for a route's missing key; no route is a 404.
    async with client(raf.serve.app(make_agent(), api_keys=["k1"])) as http:
        bare = await http.get("/nowhere")
        keyed = await http.get("/nowhere", headers={"authorization": "Bearer k1"})
        assert (await http.get("/v1/models")).status_code == 401
    for reply in (bare, keyed):
        assert reply.status_code == 404
        assert error_of(reply)["type"] == "not_found"


async def test_healthz_reads_no_session_a_client_can_name(anyio_backend: str) -> None:
    read: list[str] = []

    class Recording:
        async def get(self, session_id: str) -> InMemorySession:
            read.append(session_id)
            return InMemorySession(session_id)

    app = raf.serve.app(make_agent(), store=Recording())
    async with client(app) as http:
        assert (await http.get("/healthz")).status_code == 200
        [health] = read
        named = await http.get(f"/v1/sessions/{quote(health)}/messages")
    assert named.status_code == 400  # no client can read or write it
    assert read == [health]


async def test_reading_unknown_sessions_keeps_nothing_in_memory(anyio_backend: str) -> None:
    async with client(raf.serve.app(make_agent())) as http:
        # What lives now is frozen, as the suite's conftest freezes what collection built: the
        # count and its collection see only what the reads leave (not the whole heap of a
        # worker that imported every SDK, twice: ~1 s of CPU each time late in a run).
        gc.collect()
        gc.freeze()
        for n in range(200):
            reply = await http.get(f"/v1/sessions/unknown-{n}/messages")
            assert reply.json()["data"] == []
        gc.collect()
        assert sum(isinstance(o, InMemorySession) for o in gc.get_objects()) < 10
        await http.post("/v1/chat/completions", json=chat("hi"), headers={"x-session-id": "kept"})
        listed = await http.get("/v1/sessions/kept/messages")
    assert [m["role"] for m in listed.json()["data"]] == ["user", "assistant"]


class Keeper(ContextProvider):
    """Fails with a short message while its frame holds what the client sent."""

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        sent = [m.content for m in messages]  # in the frame's locals
        raise RuntimeError(f"a bug with {len(sent)} messages")


async def test_a_failure_is_logged_in_one_line_with_a_traceback_without_locals(
    anyio_backend: str,
) -> None:
    # With rich installed, structlog's console renderer showed each frame's locals: a 10 KB
    # request wrote 9.6 MB of log and held the event loop 20 s (issue 47).
    import io

    written = io.StringIO()
    structlog.configure(
        processors=[structlog.dev.ConsoleRenderer(colors=False)],
        logger_factory=structlog.PrintLoggerFactory(written),
    )
    try:
        served = raf.serve.app(raf.Agent(WordModel(), name=MODEL, stack=[Keeper()]))
        async with client(served) as http:
            bug = await http.post("/v1/chat/completions", json=chat("LOCAL-" + "x" * 10_000))
    finally:
        structlog.reset_defaults()
    log = written.getvalue()
    assert bug.status_code == 500
    assert bug.headers["x-request-id"] in log
    assert "a bug with 1 messages" in log
    assert "Traceback (most recent call last)" in log
    assert "LOCAL-" not in log  # no frame's locals
    assert len(log) < 30_000
