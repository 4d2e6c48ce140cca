"""LongTermMemory: recalled into the tail, extracted after turns (consolidated), the
remember/forget tools, namespaces (served: a key's own), and bad input that loses nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

import raf
import raf.serve
from raf import (
    Agent,
    ChatMessage,
    InMemoryMemories,
    InMemorySession,
    InMemorySessionStore,
    LongTermMemory,
    OpenAIEmbedder,
    ProviderError,
    ScriptedChatClient,
    SqliteSessionStore,
    ToolCall,
)
from raf.config import ContextProviderDecl, build_provider
from raf.observe import ContextLedger
from tests._harness.openai_server import OpenAIServer

pytestmark = pytest.mark.anyio


def changes(add: Sequence[str] = (), update: Any = (), delete: Sequence[str] = ()) -> str:
    """What an extractor answers: the JSON of the changes."""
    updates = [{"id": id, "text": text} for id, text in update]
    return json.dumps({"add": list(add), "update": updates, "delete": list(delete)})


def nothing() -> str:
    return changes()


def tail_of(request: Any) -> str:
    """The memory text the model saw in a request: the system messages it put in the tail."""
    return "\n".join(
        m.content or ""
        for m in request.messages
        if m.role == "system" and (m.content or "").startswith(("Memories from", "You can keep"))
    )


async def remembered(table: InMemoryMemories, namespace: str, *facts: str) -> LongTermMemory:
    memory = LongTermMemory(table, namespace=namespace, extract_every=0)
    for fact in facts:
        await memory.remember(namespace, fact)
    return memory


# -- read ---------------------------------------------------------------------------------


async def test_the_most_relevant_memories_go_to_the_tail_after_the_history() -> None:
    table = InMemoryMemories()
    memory = await remembered(
        table, "alice", "The user likes green tea.", "The user's cat is called Miso.",
        "The user lives in Lyon.",
    )  # fmt: skip
    model = ScriptedChatClient(["first", "second"])
    agent = Agent(model, instructions="Be kind.", stack=[memory], history=True)
    session = InMemorySession("s")
    await agent.run("hello", session=session)
    await agent.run("What is my cat called?", session=session)
    first, second = model.requests
    assert first.messages[0] == second.messages[0] == ChatMessage.system("Be kind.")
    assert tail_of(first) == ""  # nothing matched "hello": nothing injected
    roles = [m.role for m in second.messages]
    # The stored history first, then the memories (the tail), then the question.
    assert roles == ["system", "user", "assistant", "system", "user"]
    assert "Miso" in tail_of(second)
    assert "Lyon" not in tail_of(second)


async def test_top_k_bounds_what_is_recalled() -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", *(f"Fact {n} about tea." for n in range(8)))
    model = ScriptedChatClient(["ok"])
    memory = LongTermMemory(table, namespace="alice", top_k=3, extract_every=0)
    await Agent(model, stack=[memory]).run("tell me about tea")
    assert tail_of(model.requests[0]).count("about tea") == 3


async def test_the_ledger_names_the_memory_in_the_tail() -> None:
    table = InMemoryMemories()
    memory = await remembered(table, "alice", "The user likes green tea.")
    ledger = ContextLedger()
    agent = Agent(ScriptedChatClient(["ok"]), stack=[memory], observers=[ledger])
    await agent.run("which tea?")
    [entry] = ledger.calls
    assert ("LongTermMemory", "tail") in [(part.layer, part.region) for part in entry.parts]


# -- write --------------------------------------------------------------------------------


async def test_a_turn_is_extracted_with_one_structured_request_that_shows_the_ids() -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user likes black tea.")
    [old] = await table.list("alice")
    green = (old.id, "The user likes green tea.")
    extractor = ScriptedChatClient(
        [changes(add=["The user has a cat called Miso."], update=[green])]
    )
    memory = LongTermMemory(table, namespace="alice", extractor=extractor)
    session = InMemorySession("chat-1")
    await Agent(ScriptedChatClient(["Noted."]), stack=[memory]).run(
        "I switched to green tea, and my cat is Miso.", session=session
    )
    [request] = extractor.requests
    assert request.options.output_schema is not None
    assert set(request.options.output_schema["properties"]) == {"add", "update", "delete"}
    shown = request.messages[-1].content or ""
    assert f"[{old.id}] The user likes black tea." in shown
    assert "user: I switched to green tea" in shown
    assert "assistant: Noted." in shown
    kept = await memory.list("alice")
    assert [m.text for m in kept] == [
        "The user likes green tea.",
        "The user has a cat called Miso.",
    ]
    assert kept[0].id == old.id
    assert {m.session_id for m in kept} == {"chat-1"}


async def test_consolidation_keeps_no_fact_twice_and_ignores_unknown_ids() -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user likes tea.", "The user owns a bike.")
    tea, bike = await table.list("alice")
    extractor = ScriptedChatClient(
        [
            changes(
                add=["the user likes TEA", "The user plays chess.", "The user plays chess"],
                update=[(bike.id, "The user likes tea."), ("made-up", "x")],
                delete=["also-made-up"],
            )
        ]
    )
    memory = LongTermMemory(table, namespace="alice", extractor=extractor)
    await Agent(ScriptedChatClient(["ok"]), stack=[memory]).run("I like chess and tea")
    # The repeat of "likes tea" was not added; the bike updated into a repeat of it is
    # gone; chess is kept once; the made-up ids changed nothing.
    assert [m.text for m in await memory.list("alice")] == [
        "The user likes tea.",
        "The user plays chess.",
    ]
    assert (await memory.list("alice"))[0].id == tea.id


async def test_a_deletion_the_user_asks_for_is_done() -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user's address is 3 rue X.")
    [address] = await table.list("alice")
    memory = LongTermMemory(
        table, namespace="alice", extractor=ScriptedChatClient([changes(delete=[address.id])])
    )
    await Agent(ScriptedChatClient(["Done."]), stack=[memory]).run("forget my address")
    assert await memory.list("alice") == ()


async def test_the_default_extractor_is_the_agents_own_client() -> None:
    model = ScriptedChatClient(["Nice!", changes(add=["The user likes jazz."])])
    memory = LongTermMemory(InMemoryMemories(), namespace="alice")
    await Agent(model, stack=[memory]).run("I like jazz")
    assert [m.text for m in await memory.list("alice")] == ["The user likes jazz."]
    assert model.requests[1].options.output_schema is not None


async def test_extract_every_two_turns_sees_both_turns_from_the_history() -> None:
    extractor = ScriptedChatClient([changes(add=["The user is called Ana.", "The user is 30."])])
    memory = LongTermMemory(
        InMemoryMemories(), namespace="ana", extractor=extractor, extract_every=2
    )
    agent = Agent(ScriptedChatClient(["Hi Ana", "Noted"]), stack=[memory], history=True)
    session = InMemorySession("s")
    await agent.run("I am Ana", session=session)
    assert extractor.requests == []  # not due yet
    await agent.run("I am 30", session=session)
    [request] = extractor.requests
    conversation = request.messages[-1].content or ""
    assert conversation.count("user: I am") == 2
    assert conversation.index("I am Ana") < conversation.index("I am 30")
    assert len(await memory.list("ana")) == 2


async def test_a_failed_run_extracts_nothing() -> None:
    extractor = ScriptedChatClient([])
    memory = LongTermMemory(InMemoryMemories(), namespace="alice", extractor=extractor)
    with pytest.raises(RuntimeError, match="down"):
        await Agent(ScriptedChatClient([RuntimeError("down")]), stack=[memory]).run("hi there")
    assert extractor.requests == []


# -- bad input: clear errors or a logged skip, and nothing remembered is lost --------------


@pytest.mark.parametrize("namespace", ["", "a\x00b", "tab\there"])
def test_an_empty_or_unkeepable_namespace_is_refused_at_construction(namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        LongTermMemory(InMemoryMemories(), namespace=namespace)


def test_other_bad_arguments_are_refused_at_construction() -> None:
    table = InMemoryMemories()
    with pytest.raises(TypeError, match="namespace"):
        LongTermMemory(table, namespace=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_k"):
        LongTermMemory(table, namespace="a", top_k=0)
    with pytest.raises(ValueError, match="extract_every"):
        LongTermMemory(table, namespace="a", extract_every=-1)
    with pytest.raises(TypeError, match="extractor"):
        LongTermMemory(table, namespace="a", extractor="gpt")
    with pytest.raises(TypeError, match="embedder"):
        LongTermMemory(table, namespace="a", embedder=object())
    with pytest.raises(TypeError, match="store"):
        LongTermMemory(object(), namespace="a")


async def test_a_namespace_callable_that_names_none_fails_the_run_clearly() -> None:
    memory = LongTermMemory(InMemoryMemories(), namespace=lambda invocation: "")
    with pytest.raises(ProviderError, match=r"LongTermMemory.on_invoking.*namespace"):
        await Agent(ScriptedChatClient(["ok"]), stack=[memory]).run("hi")


@pytest.mark.parametrize("answer", ["not json at all", '{"add": "one fact"}', "[]", ""])
async def test_an_extractor_that_answers_invalid_json_is_a_logged_skip(answer: str) -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user likes tea.")
    before = await table.list("alice")
    memory = LongTermMemory(table, namespace="alice", extractor=ScriptedChatClient([answer]))
    with capture_logs() as logs:
        response = await Agent(ScriptedChatClient(["ok"]), stack=[memory]).run("I like tea")
    assert response.text == "ok"
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "memory.extraction_skipped"
    ]
    assert await table.list("alice") == before


async def test_an_extractor_that_fails_follows_the_post_stage_policy() -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user likes tea.")
    before = await table.list("alice")
    memory = LongTermMemory(
        table, namespace="alice", extractor=ScriptedChatClient([ConnectionError("gone")])
    )
    with (
        capture_logs(),
        pytest.raises(ProviderError, match=r"LongTermMemory\.on_invoked") as raised,
    ):
        await Agent(ScriptedChatClient(["ok"]), stack=[memory]).run("I like tea")
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert await table.list("alice") == before


# -- the tools ----------------------------------------------------------------------------


async def test_the_model_remembers_and_forgets_with_its_tools() -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user's old phone is 555.")
    [phone] = await table.list("alice")
    model = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(
                ToolCall("1", "remember", json.dumps({"fact": "The user likes figs."})),
                ToolCall("2", "forget", json.dumps({"memory_id": phone.id})),
                ToolCall("3", "forget", json.dumps({"memory_id": "nope"})),
            ),
            "Done.",
        ]
    )
    memory = LongTermMemory(table, namespace="alice", tools=True, extract_every=0)
    response = await Agent(model, stack=[memory]).run(
        "I like figs; forget my phone", session=InMemorySession("t")
    )
    assert {t.name for t in model.requests[0].options.tools} == {"remember", "forget"}
    results = [m.content for m in response.messages if m.role == "tool"]
    assert results[0] is not None
    assert results[0].startswith("Remembered as [")
    assert results[1:] == [f"Forgot [{phone.id}].", "No memory [nope] is kept."]
    [kept] = await memory.list("alice")
    assert (kept.text, kept.session_id) == ("The user likes figs.", "t")


# -- namespaces ---------------------------------------------------------------------------


async def test_one_namespace_never_reads_another() -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user likes green tea.")
    model = ScriptedChatClient(["a", "b"])
    memory = LongTermMemory(
        table, namespace=lambda invocation: invocation.session.id, extract_every=0
    )
    agent = Agent(model, stack=[memory])
    await agent.run("which tea do I like?", session=InMemorySession("bob"))
    await agent.run("which tea do I like?", session=InMemorySession("alice"))
    assert tail_of(model.requests[0]) == ""
    assert "green tea" in tail_of(model.requests[1])


async def test_an_async_namespace_callable_is_awaited() -> None:
    async def user(invocation: Any) -> str:
        await anyio.lowlevel.checkpoint()
        return "alice"

    table = InMemoryMemories()
    await remembered(table, "alice", "The user likes green tea.")
    model = ScriptedChatClient(["a"])
    await Agent(model, stack=[LongTermMemory(table, namespace=user, extract_every=0)]).run("tea?")
    assert "green tea" in tail_of(model.requests[0])


async def test_provenance_is_listed_and_a_person_can_delete_a_memory(tmp_path: Path) -> None:
    async with LongTermMemory(
        tmp_path / "memories.db",
        namespace="alice",
        extractor=ScriptedChatClient([changes(add=["The user likes tea."])]),
    ) as memory:
        await Agent(ScriptedChatClient(["ok"]), stack=[memory]).run(
            "I like tea", session=InMemorySession("chat-7")
        )
        [record] = await memory.list("alice")
        assert (record.text, record.session_id) == ("The user likes tea.", "chat-7")
        assert record.created_at > 0
        assert len(record.id) == 12
        assert await memory.delete("alice", record.id) is True
        assert await memory.delete("alice", record.id) is False
        assert await memory.list("alice") == ()
    # The file outlives the memory object: a new one (another process) reads it.
    async with SqliteSessionStore(tmp_path / "memories.db") as store:
        assert await LongTermMemory(store, namespace="alice").list("alice") == ()


# -- served: a key's memories are its own --------------------------------------------------


async def call(
    app: Any, key: str, text: str, *, stream: bool = False, path: str = "/v1/chat/completions"
) -> int:
    """One chat completions (or Responses) request with ``key``; its status."""
    turn: dict[str, Any] = {"model": "served", "stream": stream}
    if path == "/v1/responses":
        turn["input"] = text
    else:
        turn["messages"] = [{"role": "user", "content": text}]
    body = json.dumps(turn).encode()
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {key}".encode())]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "headers": headers,
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
    }  # fmt: skip
    with anyio.fail_after(10):
        await app(scope, receive, send)
    return int(sent[0]["status"])


async def test_served_a_keys_memories_are_its_own() -> None:
    table = InMemoryMemories()
    extractor = ScriptedChatClient([changes(add=["The user likes tea."]), *[nothing()] * 3])
    memory = LongTermMemory(table, namespace="everyone", extractor=extractor)
    model = ScriptedChatClient(["noted", "answer", "answer", "answer"])
    agent = Agent(model, name="served", stack=[memory])
    app = raf.serve.app(agent, api_keys=["key-one", "key-two"])
    assert await call(app, "key-one", "I like tea") == 200
    assert await call(app, "key-two", "what tea do I like?", stream=True) == 200
    assert await call(app, "key-one", "what tea do I like?") == 200
    assert await call(app, "key-two", "which tea?", path="/v1/responses") == 200
    assert tail_of(model.requests[1]) == ""  # key two never sees key one's memory
    assert "likes tea" in tail_of(model.requests[2])
    assert tail_of(model.requests[3]) == ""
    assert [m.text for m in await memory.list("everyone", api_key="key-one")] == [
        "The user likes tea."
    ]
    assert await memory.list("everyone", api_key="key-two") == ()
    assert await memory.list("everyone") == ()  # nor does a run outside the server


async def test_served_an_agent_tools_memories_are_the_callers_keys() -> None:
    # The child of agent.as_tool() runs in a Run of its own: the caller's key scope goes
    # with it, or its memories would be one namespace every key shares.
    table = InMemoryMemories()
    extractor = ScriptedChatClient([changes(add=["The user likes tea."])])
    memory = LongTermMemory(table, namespace="everyone", extractor=extractor)
    child = Agent(ScriptedChatClient(["noted"]), name="helper", stack=[memory])
    ask = ToolCall("c1", "helper", json.dumps({"task": "I like tea"}))
    parent = Agent(
        ScriptedChatClient([ScriptedChatClient.tool_turn(ask), "done"]),
        name="served",
        tools=[child.as_tool()],
    )
    app = raf.serve.app(parent, api_keys=["key-one", "key-two"])
    assert await call(app, "key-one", "I like tea") == 200
    assert [m.text for m in await memory.list("everyone", api_key="key-one")] == [
        "The user likes tea."
    ]
    assert await memory.list("everyone", api_key="key-two") == ()
    assert await memory.list("everyone") == ()


# -- hybrid search with an embedder --------------------------------------------------------


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = OpenAIServer()
    yield running
    running.close()


async def test_vectors_find_a_memory_that_shares_no_word_with_the_question(
    server: OpenAIServer,
) -> None:
    table = InMemoryMemories()
    await remembered(
        table, "alice", "The user is allergic to peanuts.", "The user owns a red bike."
    )
    # The question, then the two memories (embedded once, kept): the question is near the
    # allergy, though it shares no word with it.
    server.embed([1.0, 0.1], [0.9, 0.2], [0.0, 1.0])
    server.embed([0.1, 1.0])  # the second question: only its own vector is asked for
    embedder = OpenAIEmbedder("e", base_url=server.base_url, api_key="k", max_retries=0)
    memory = LongTermMemory(table, namespace="alice", embedder=embedder, top_k=1, extract_every=0)
    model = ScriptedChatClient(["a", "b"])
    agent = Agent(model, stack=[memory])
    await agent.run("Can I eat satay sauce?")
    await agent.run("What do I ride?")
    assert "peanuts" in tail_of(model.requests[0])
    assert "bike" in tail_of(model.requests[1])
    assert [len(r.body["input"]) for r in server.requests] == [3, 1]
    await embedder.aclose()


async def test_an_embedder_whose_dimension_changes_is_a_logged_skip(server: OpenAIServer) -> None:
    table = InMemoryMemories()
    await remembered(table, "alice", "The user likes green tea.")
    server.embed([1.0, 0.0], [1.0, 0.0])
    server.embed([1.0, 0.0, 0.0])  # the model changed behind its name
    embedder = OpenAIEmbedder("e", base_url=server.base_url, api_key="k", max_retries=0)
    memory = LongTermMemory(table, namespace="alice", embedder=embedder, extract_every=0)
    model = ScriptedChatClient(["a", "b"])
    agent = Agent(model, stack=[memory])
    await agent.run("green tea?")
    with capture_logs() as logs:
        await agent.run("green tea again?")
    assert [e["event"] for e in logs] == ["memory.embedder_skipped"]
    assert "dimensions" in logs[0]["error"]
    # BM25 answered alone, and nothing remembered was lost.
    assert "green tea" in tail_of(model.requests[1])
    assert len(await memory.list("alice")) == 1
    await embedder.aclose()


# -- every store, through the provider -------------------------------------------------


@pytest.fixture(params=["memory", "memory-store", "sqlite", "redis", "postgres"])
def store_of(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """What ``LongTermMemory(store)`` is given for each store: a table, a path, a URL."""
    if request.param == "memory":
        return InMemoryMemories()
    if request.param == "memory-store":
        return InMemorySessionStore()
    if request.param == "sqlite":
        return str(tmp_path / "memories.db")
    if request.param == "redis":
        return request.getfixturevalue("redis_server").url
    return request.getfixturevalue("postgres_server").url()


async def test_memories_outlive_the_memory_object_in_every_store(store_of: Any) -> None:
    namespace = f"user-{uuid.uuid4().hex}"  # the servers are shared by the tests
    extractor = ScriptedChatClient([changes(add=["The user likes figs."])])
    async with LongTermMemory(store_of, namespace=namespace, extractor=extractor) as first:
        await Agent(ScriptedChatClient(["ok"]), stack=[first]).run("I like figs")
    model = ScriptedChatClient(["figs"])
    async with LongTermMemory(store_of, namespace=namespace, extract_every=0) as second:
        await Agent(model, stack=[second]).run("which fruit do I like?")
        [record] = await second.list(namespace)
        assert await second.list(f"other-{namespace}") == ()
    assert "likes figs" in tail_of(model.requests[0])
    assert record.text == "The user likes figs."


def test_a_memory_cannot_join_a_parallel_group() -> None:
    # Its stages need the run's namespace (and served key scope): only its own layer has it.
    with pytest.raises(TypeError, match="not a context provider"):
        raf.parallel(LongTermMemory(InMemoryMemories(), namespace="a"))


async def test_a_person_can_add_a_memory_by_hand_and_it_is_kept_once() -> None:
    memory = LongTermMemory(InMemoryMemories(), namespace="ana", extract_every=0)
    first = await memory.remember("ana", "The user likes figs.", session_id="form")
    assert await memory.remember("ana", "the user likes FIGS") == first
    assert await memory.remember("ana", "Figs.", api_key="k") != first  # another key's own
    assert [(m.id, m.session_id) for m in await memory.list("ana")] == [(first, "form")]
    with pytest.raises(ValueError, match="1 to 1000 characters"):
        await memory.remember("ana", "   ")


def test_a_memory_is_declared_in_toml_like_any_provider(tmp_path: Path) -> None:
    options = {"store": "memories.db", "namespace": "team", "top_k": 2, "tools": True}
    decl = ContextProviderDecl("long_term_memory", "facts", options, base_dir=tmp_path)
    memory = build_provider(decl)
    assert (memory.kind, memory.name, memory.top_k, memory.tools) == (
        "long_term_memory", "facts", 2, True,
    )  # fmt: skip
    assert memory.table.store.path == tmp_path / "memories.db"
