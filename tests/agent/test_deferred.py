"""Deferred calls resume whatever the window, compression or store, streamed, served or not.

A resumed run (a :class:`raf.Decision`) runs an approved call once, and its result (or a
denial's refusal) reaches the model, which answers in the same run: with the whole history
in view, with a window of messages or tokens (stepped or not), with each compression
strategy, and with each session store. The model here checks what it is sent as a vendor
would (every call answered, no orphan result), so a view that lost the waiting turn fails.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import raf
import raf.serve
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    CompressionProvider,
    ContextProvider,
    ContextResult,
    Decision,
    EchoChatClient,
    HistoryProvider,
    InMemorySession,
    PostgresSessionStore,
    RedisSessionStore,
    Session,
    SqliteSessionStore,
    ToolCall,
)
from raf.compression import (
    SummaryStrategy,
    TokenBudgetStrategy,
    TruncationStrategy,
    check_tool_pairing,
)
from tests.serve.test_agui import events_of, run_input
from tests.serve.test_approvals import decision_input
from tests.serve.test_asgi import Exchange

pytestmark = pytest.mark.anyio


class RemoveModel:
    """Asks for ``remove`` when told to remove something, else says what it was last sent.

    It refuses a history a vendor would refuse (a call without its result, a result
    without its call), as a real model's server does.
    """

    def __init__(self) -> None:
        self.calls = 0

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        self.calls += 1
        problem = check_tool_pairing(messages)
        if problem is not None:
            raise raf.ChatClientError(f"the model refused the history: {problem}")
        last = messages[-1]
        if last.role == "user" and "remove" in (last.content or ""):
            call = ToolCall(f"call-{self.calls}", "remove", json.dumps({"path": last.content}))
            return AgentResponse((ChatMessage.assistant(tool_calls=[call]),))
        if last.role == "tool":
            return AgentResponse((ChatMessage.assistant(f"the tool said {last.content}"),))
        return AgentResponse((ChatMessage.assistant(f"seen {last.content}"),))


#: What the model sees of the stored history: every window and compression strategy.
WINDOWS: dict[str, Callable[[], list[Any]]] = {
    "whole": lambda: [HistoryProvider()],
    "messages": lambda: [HistoryProvider(max_messages=8)],
    "messages-stepped": lambda: [HistoryProvider(max_messages=8, step=4)],
    "tokens": lambda: [HistoryProvider(max_tokens=40)],
    "tokens-stepped": lambda: [HistoryProvider(max_tokens=40, step=10)],
    "truncation": lambda: [
        HistoryProvider(inject=False),
        CompressionProvider(TruncationStrategy(keep_last=4), max_messages=10),
    ],
    "token-budget": lambda: [
        HistoryProvider(inject=False),
        CompressionProvider(TokenBudgetStrategy(40)),
    ],
    "summary": lambda: [
        HistoryProvider(inject=False),
        CompressionProvider(SummaryStrategy(EchoChatClient(), keep_last=4), max_messages=10),
    ],
}

STORES = ("memory", "sqlite", "redis", "postgres")


@asynccontextmanager
async def opened(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Session]:
    """A fresh session of the store ``kind`` (Redis and PostgreSQL: the suite's real servers)."""
    session_id = f"deferred-{uuid.uuid4().hex[:12]}"
    if kind == "memory":
        yield InMemorySession(session_id)
    elif kind == "sqlite":
        async with SqliteSessionStore(tmp_path / "sessions.db") as store:
            yield await store.get(session_id)
    elif kind == "redis":
        url = request.getfixturevalue("redis_server").url
        async with RedisSessionStore(url, prefix=session_id) as store:
            yield await store.get(session_id)
    else:
        url = request.getfixturevalue("postgres_server").url()
        async with PostgresSessionStore(url, prefix=session_id.replace("-", "_")) as store:
            yield await store.get(session_id)


def remover(ran: list[str]) -> Any:
    @raf.tool(approval=True)
    def remove(path: str) -> str:
        """Remove the file ``path``: it waits for a person's approval."""
        ran.append(path)
        return f"removed {path}"

    return remove


async def run(agent: Agent, message: Any, session: Session, streamed: bool) -> AgentResponse:
    if not streamed:
        return await agent.run(message, session=session)
    async with agent.stream(message, session=session) as stream:
        async for _ in stream:
            pass
    assert stream.response is not None
    return stream.response


# Every window with every store; a run streamed or not alternates over the pairs, so each
# window and each store is tried both ways (the decisions are both tried in every case).
CASES = [
    pytest.param(window, store, (w + s) % 2 == 1, id=f"{window}-{store}")
    for w, window in enumerate(WINDOWS)
    for s, store in enumerate(STORES)
]


@pytest.mark.parametrize(("window", "store", "streamed"), CASES)
async def test_a_resumed_call_reaches_the_model_whatever_the_window_and_store(
    anyio_backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    window: str,
    store: str,
    streamed: bool,
) -> None:
    ran: list[str] = []
    model = RemoveModel()
    agent = Agent(model, tools=[remover(ran)], stack=WINDOWS[window]())
    async with opened(store, request, tmp_path) as session:
        # A history longer than every window, so each one cuts it.
        await session.add_messages(
            [m for i in range(8) for m in (ChatMessage.user(f"q{i}"), ChatMessage.assistant("a"))]
        )
        for approve, path in ((True, "a.txt"), (False, "b.txt")):
            asked = await run(agent, f"remove {path}", session, streamed)
            (pending,) = asked.pending
            assert ran == (["remove a.txt"] if not approve else [])
            decision = Decision(pending.token, approve=approve, reason=None if approve else "no")
            answer = await run(agent, decision, session, streamed)
            if approve:
                assert ran == ["remove a.txt"]  # once
                assert answer.text == "the tool said removed remove a.txt"
            else:
                assert ran == ["remove a.txt"]  # nothing more ran
                assert answer.text.startswith("the tool said The user did not approve")
                assert "no" in answer.text
            assert answer.pending == ()
            assert [m.role for m in answer.messages] == ["tool", "assistant"]
            assert tuple(await session.list_pending()) == ()
            stored = await session.get_messages()
            assert check_tool_pairing(stored) is None
            assert stored[-1].content == answer.text


@pytest.mark.parametrize("window", ["whole", "messages", "tokens", "truncation", "summary"])
async def test_a_served_resume_answers_after_the_tool_row(anyio_backend: str, window: str) -> None:
    ran: list[str] = []
    agent = Agent(RemoveModel(), tools=[remover(ran)], stack=WINDOWS[window]())
    app = raf.serve.app(agent)
    thread = f"t-{window}"
    for approve, path in ((True, "a.txt"), (False, "b.txt")):
        events = events_of(await Exchange()(app, "/ag-ui", run_input(f"remove {path}", thread)))
        (custom,) = [e for e in events if e.type == "CUSTOM"]
        decision = {"token": custom.value["token"], "approve": approve}
        reply = await Exchange()(app, "/ag-ui", decision_input(thread, decision))
        assert reply.status == 200
        events = events_of(reply)
        kinds = [e.type for e in events]
        assert kinds[-1] == "RUN_FINISHED"
        assert kinds[1] == "TOOL_CALL_RESULT"
        text = "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT")
        expected = "removed remove a.txt" if approve else "The user did not approve"
        assert text.startswith(f"the tool said {expected}")
        assert ran == ["remove a.txt"]


class Weather:
    """A client's tool: offered to the model, run by the caller (``runs_on_client``)."""

    name = "get_weather"
    description = "The weather in a city."
    parameters: dict[str, Any] = {  # noqa: RUF012 (a Tool's attribute, read only)
        "type": "object",
        "properties": {"city": {"type": "string"}},
    }
    runs_on_client = True

    async def invoke(self, arguments: Any) -> Any:
        raise AssertionError("a client's tool never runs here")


class WeatherModel(RemoveModel):
    """Asks for the weather when told ``weather``; the rest as :class:`RemoveModel`."""

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        last = messages[-1]
        if last.role == "user" and "weather" in (last.content or ""):
            self.calls += 1
            call = ToolCall(f"w-{self.calls}", "get_weather", '{"city": "Paris"}')
            return AgentResponse((ChatMessage.assistant(tool_calls=[call]),))
        return await super().complete(messages, options)


async def seeded(session: Session) -> Session:
    await session.add_messages(
        [m for i in range(8) for m in (ChatMessage.user(f"q{i}"), ChatMessage.assistant("a"))]
    )
    return session


@pytest.mark.parametrize("window", list(WINDOWS))
async def test_a_client_tools_result_reaches_the_model_whatever_the_window(
    anyio_backend: str, window: str
) -> None:
    agent = Agent(WeatherModel(), stack=WINDOWS[window]())
    options = raf.AgentRunOptions(tools=[Weather()])
    session = await seeded(InMemorySession())
    asked = await agent.run("the weather?", session=session, options=options)
    (call,) = asked.tool_calls
    assert asked.pending == ()  # the caller runs it: nothing waits for a decision
    result = ChatMessage.tool(call.id, "rain", name=call.name)
    answer = await agent.run([result], session=session, options=options)
    assert answer.text == "the tool said rain"
    assert check_tool_pairing(await session.get_messages()) is None


@pytest.mark.parametrize("window", list(WINDOWS))
async def test_a_new_message_refuses_what_waits_whatever_the_window(
    anyio_backend: str, window: str
) -> None:
    ran: list[str] = []
    agent = Agent(RemoveModel(), tools=[remover(ran)], stack=WINDOWS[window]())
    session = await seeded(InMemorySession())
    (pending,) = (await agent.run("remove a.txt", session=session)).pending
    answer = await agent.run("never mind", session=session)
    assert answer.text == "seen never mind"
    assert tuple(await session.list_pending()) == ()
    stored = await session.get_messages()
    assert check_tool_pairing(stored) is None
    assert "they sent a new message instead" in (stored[-3].content or "")
    with pytest.raises(raf.errors.ApprovalError):
        await agent.run(Decision(pending.token, approve=True), session=session)
    assert ran == []


class Forgetful(ContextProvider):
    """A provider of a user's that replaces the history with nothing (the waiting turn too)."""

    async def on_invoking(self, *args: Any) -> ContextResult:
        return ContextResult(replace_messages=True)


@pytest.mark.parametrize("store", STORES)
async def test_a_resume_reads_the_waiting_turn_from_the_store_when_the_view_lacks_it(
    anyio_backend: str, request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> None:
    ran: list[str] = []
    agent = Agent(RemoveModel(), tools=[remover(ran)], stack=[HistoryProvider(), Forgetful()])
    async with opened(store, request, tmp_path) as session:
        await seeded(session)
        (pending,) = (await agent.run("remove a.txt", session=session)).pending
        answer = await agent.run(Decision(pending.token, approve=True), session=session)
        assert answer.text == "the tool said removed remove a.txt"
        assert ran == ["remove a.txt"]
        stored = await session.get_messages()
        assert check_tool_pairing(stored) is None
        assert [m.role for m in stored[-4:]] == ["user", "assistant", "tool", "assistant"]
