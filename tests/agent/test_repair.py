"""Transcript repair, the last step before every model call: a call without its result gets
one that says it has none, a result without its call is left out, nothing stored changes;
and the law that histories cut anywhere are never refused by any vendor's server."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    AnthropicChatClient,
    ChatMessage,
    ChatOptions,
    CompressionProvider,
    ContextProvider,
    ContextResult,
    FallbackMiddleware,
    GeminiChatClient,
    HistoryProvider,
    InMemorySession,
    OpenAIChatClient,
    OpenAIResponsesClient,
    Reasoning,
    ScriptedChatClient,
    ToolCall,
    tool,
)
from raf._agent.repair import Repairs, repair, repaired, split_by, whole
from raf.errors import CompressionError, ProviderError, ServerError
from tests._harness.anthropic_server import AnthropicServer
from tests._harness.gemini_server import GeminiServer
from tests._harness.openai_server import OpenAIServer
from tests._harness.responses_server import ResponsesServer

pytestmark = pytest.mark.anyio

INTERRUPTED = "This call was interrupted before its result was stored; it may or may not have run."


def calling(*ids: str, reasoning: Reasoning | None = None) -> ChatMessage:
    calls = [ToolCall(i, "add", '{"a": 1, "b": 2}') for i in ids]
    return ChatMessage.assistant(tool_calls=calls, reasoning=reasoning)


def result(call_id: str, text: str = "3") -> ChatMessage:
    return ChatMessage.tool(call_id, text, name="add")


def shape(messages: Sequence[ChatMessage]) -> list[tuple[str, str | None, str | None]]:
    return [(m.role, m.tool_call_id, m.content) for m in messages]


# --- the repair itself ------------------------------------------------------------------


def test_a_whole_history_is_sent_as_it_is_not_copied() -> None:
    history = (
        ChatMessage.user("hi"),
        calling("1", "2"),
        result("2"),  # results in another order than the calls: still whole
        result("1"),
        ChatMessage.assistant("3 and 3"),
    )
    assert whole(history)
    assert repair(history) is None
    assert repaired(history) is history


def test_a_call_without_its_result_gets_one_that_says_it_has_none() -> None:
    history = [ChatMessage.user("hi"), calling("1", "2"), result("1"), ChatMessage.user("and?")]
    sent = repaired(history)
    assert shape(sent) == [
        ("user", None, "hi"),
        ("assistant", None, None),
        ("tool", "1", "3"),
        ("tool", "2", INTERRUPTED),
        ("user", None, "and?"),
    ]
    assert sent[3].name == "add"


def test_a_result_without_its_call_is_left_out() -> None:
    history = [result("0"), ChatMessage.user("hi"), calling("1"), result("1"), result("1")]
    fixed = repair(history)
    assert fixed is not None
    assert shape(fixed.messages) == [
        ("user", None, "hi"),
        ("assistant", None, None),
        ("tool", "1", "3"),
    ]
    assert fixed.left_out == (0, 4)
    assert fixed.sources == (1, 2, 3)


def test_a_result_away_from_its_call_joins_it() -> None:
    history = [calling("1"), ChatMessage.user("still there?"), result("1")]
    assert shape(repaired(history)) == [
        ("assistant", None, None),
        ("tool", "1", "3"),
        ("user", None, "still there?"),
    ]


def test_a_turns_reasoning_goes_with_the_turn() -> None:
    thinking = Reasoning("anthropic", '[{"type": "thinking", "signature": "s"}]')
    history = [ChatMessage.user("hi"), calling("1", reasoning=thinking)]
    sent = repaired(history)
    assert sent[1].reasoning == thinking
    assert shape(sent)[2] == ("tool", "1", INTERRUPTED)


def test_a_user_message_with_tool_calls_needs_no_repair() -> None:
    # No wire sends a user message's calls, so nothing waits for their results.
    odd = ChatMessage("user", "hi", tool_calls=[ToolCall("1", "add")])
    assert not whole([odd])
    assert repair([odd]) is None


def test_split_by_names_what_a_step_split_itself() -> None:
    broken = [ChatMessage.user("hi"), calling("1")]  # crashed before its result
    assert split_by(broken, broken) is None
    assert split_by(broken, broken[1:]) is None
    history = [ChatMessage.user("hi"), calling("2"), result("2")]
    assert split_by(history, history[:2]) == "call '2' without its result"
    assert split_by(history, history[2:]) == "the result of call '2' without its call"


@given(
    st.lists(
        st.sampled_from(["user", "call 1", "call 2", "calls 1 2", "result 1", "result 2"]),
        max_size=12,
    )
)
def test_what_repair_sends_is_whole_and_keeps_every_other_message(kinds: list[str]) -> None:
    messages: list[ChatMessage] = []
    for kind in kinds:
        word, *ids = kind.split()
        if word == "user":
            messages.append(ChatMessage.user("u"))
        elif word == "result":
            messages.append(result(ids[0]))
        else:
            messages.append(calling(*ids))
    sent = repaired(messages)
    assert whole(sent)
    assert repaired(sent) is sent
    others = [m for m in messages if m.role != "tool"]
    assert [m for m in sent if m.role != "tool"] == others
    kept = [m for m in sent if m.role == "tool" and m.content != INTERRUPTED]
    assert all(any(m is k for m in messages) for k in kept)  # results only moved, none made up


@given(st.lists(st.lists(st.sampled_from(["user", "call 1", "result 1", "result 2"]), max_size=4)))
def test_repairs_that_remember_the_last_whole_transcript_send_what_repair_sends(
    steps: list[list[str]],
) -> None:
    # Call after call, each extending the last (as a tool loop and a session do) or not.
    repairs = Repairs()
    messages: tuple[ChatMessage, ...] = ()
    for number, step in enumerate(steps):
        added = []
        for kind in step:
            word, *ids = kind.split()
            added.append(
                ChatMessage.user("u")
                if word == "user"
                else result(ids[0])
                if word == "result"
                else calling(ids[0])
            )
        messages = (*messages, *added) if number % 3 else tuple(added)
        assert repairs(messages) == repaired(messages)


# --- in a run: nothing stored changes, the call is never run ----------------------------

runs: list[dict[str, int]] = []


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    runs.append({"a": a, "b": b})
    return a + b


BROKEN = (
    ChatMessage.user("1+2?"),
    calling("lost"),  # a crash between the call and its result
    ChatMessage.user("hello?"),
    result("ghost"),  # a result whose call an older version did not store
    ChatMessage.assistant("Hi."),
)


async def test_a_session_broken_by_a_crash_is_repaired_each_call_and_stays_as_stored() -> None:
    runs.clear()
    session = InMemorySession()
    await session.add_messages(BROKEN)
    model = ScriptedChatClient(["Fine.", "Still fine."])
    agent = Agent(model, tools=[add], history=True)
    assert (await agent.run("go on", session=session)).text == "Fine."
    assert (await agent.run("again", session=session)).text == "Still fine."
    first = model.requests[0].messages
    assert shape(first) == [
        ("user", None, "1+2?"),
        ("assistant", None, None),
        ("tool", "lost", INTERRUPTED),
        ("user", None, "hello?"),
        ("assistant", None, "Hi."),
        ("user", None, "go on"),
    ]
    assert runs == []  # the interrupted call is never run again
    stored = await session.get_messages()
    assert stored[: len(BROKEN)] == BROKEN  # nothing stored changed
    assert len(model.requests[1].messages) == len(first) + 2


async def test_a_fallback_client_gets_the_repaired_transcript_too() -> None:
    primary = ScriptedChatClient([ServerError("down")])
    backup = ScriptedChatClient(["From the backup."])
    agent = Agent(primary, chat_stack=[FallbackMiddleware(backup)])
    answer = await agent.run([*BROKEN, ChatMessage.user("go on")])
    assert answer.text == "From the backup."
    assert whole(backup.requests[0].messages)
    assert ("tool", "lost", INTERRUPTED) in shape(backup.requests[0].messages)


class AsStored:
    """A compression strategy that keeps everything: a broken history is not its doing."""

    async def compress(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
        return messages


class Splitter:
    """A compression strategy that drops the first message, whatever it is."""

    async def compress(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
        return messages[2:]


async def test_compression_over_a_broken_history_is_no_error_a_split_it_makes_is() -> None:
    session = InMemorySession()
    await session.add_messages(BROKEN)
    model = ScriptedChatClient(["Fine."])
    agent = Agent(model, stack=[HistoryProvider(inject=False), CompressionProvider(AsStored())])
    assert (await agent.run("go on", session=session)).text == "Fine."
    assert whole(model.requests[0].messages)
    whole_history = InMemorySession()
    await whole_history.add_messages([ChatMessage.user("1+2?"), calling("1"), result("1")])
    splitting = Agent(model, stack=[HistoryProvider(inject=False), CompressionProvider(Splitter())])
    with pytest.raises(ProviderError) as caught:
        await splitting.run("go on", session=whole_history)
    assert isinstance(caught.value.__cause__, CompressionError)
    assert "the result of call '1' without its call" in str(caught.value.__cause__)


# --- the law: histories cut anywhere, never refused by a vendor's server ---------------

WIRES = ("openai", "responses", "anthropic", "gemini")


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def reasoning_of(source: str, text: str | None, ids: Sequence[str], n: int) -> Reasoning:
    """Reasoning as each client keeps it on a turn: its wire's items in the reply's order."""
    if source == "anthropic":
        order: list[dict[str, Any]] = [{"type": "thinking", "thinking": "hm", "signature": f"s{n}"}]
        order += [{"type": "text"}] if text else []
        order += [{"type": "tool_use", "id": i} for i in ids]
    elif source == "openai.responses":
        order = [{"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": "e"}]
        order += [{"type": "message"}] if text else []
        order += [{"type": "function_call", "call_id": i} for i in ids]
    else:
        order = [{"type": "thought", "text": "hm", "signature": _b64(f"t{n}")}]
        order += [{"type": "text"}] if text else []
        order += [{"type": "call", "id": i, "signature": _b64(i)} for i in ids]
    return Reasoning(source, json.dumps(order))


@st.composite
def conversations(draw: st.DrawFn) -> list[ChatMessage]:
    """A whole conversation of tool loops, with reasoning of any wire on its turns."""
    messages: list[ChatMessage] = []
    for n in range(draw(st.integers(1, 4))):
        messages.append(ChatMessage.user(f"question {n}"))
        for step in range(draw(st.integers(0, 2))):
            ids = [f"c{n}{step}{k}" for k in range(draw(st.integers(1, 3)))]
            text = draw(st.sampled_from([None, "Let me look."]))
            source = draw(st.sampled_from([None, "anthropic", "openai.responses", "gemini"]))
            thinking = None if source is None else reasoning_of(source, text, ids, len(messages))
            calls = [ToolCall(i, "add", '{"a": 1, "b": 2}') for i in ids]
            messages.append(ChatMessage.assistant(text, tool_calls=calls, reasoning=thinking))
            messages += [result(i) for i in ids]
        source = draw(st.sampled_from([None, "anthropic", "openai.responses", "gemini"]))
        thinking = None if source is None else reasoning_of(source, "x", (), len(messages))
        messages.append(ChatMessage.assistant(f"answer {n}", reasoning=thinking))
    return messages


@st.composite
def broken(draw: st.DrawFn) -> list[ChatMessage]:
    """A conversation cut anywhere, some of its messages lost: dangling calls, orphan
    results, reasoning on turns whose results are gone."""
    messages = draw(conversations())
    start = draw(st.integers(0, len(messages) - 1))
    end = draw(st.integers(start + 1, len(messages)))
    cut = messages[start:end]
    lost = draw(st.sets(st.integers(0, len(cut) - 1), max_size=max(1, len(cut) // 3)))
    return [m for i, m in enumerate(cut) if i not in lost]


class Injects(ContextProvider):
    """Injects the history a test hands it (as a store written by anyone would)."""

    def __init__(self) -> None:
        self.history: list[ChatMessage] = []

    async def on_invoking(self, agent, session, messages, options):  # type: ignore[no-untyped-def]
        return ContextResult(messages=self.history)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # google-genai's async client runs on asyncio only


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    running = {
        "openai": OpenAIServer(),
        "responses": ResponsesServer(),
        "anthropic": AnthropicServer(),
        "gemini": GeminiServer(),
    }
    yield running
    for server in running.values():
        server.close()


def client_of(wire: str, server: Any) -> Any:
    if wire == "openai":
        return OpenAIChatClient("m", base_url=server.base_url, api_key="k", max_retries=0)
    if wire == "responses":
        return OpenAIResponsesClient("m", base_url=server.base_url, api_key="k", max_retries=0)
    if wire == "anthropic":
        return AnthropicChatClient("m", base_url=server.root_url, api_key="k", max_retries=0)
    return GeminiChatClient("m", base_url=server.root_url, api_key="k", max_retries=0)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(history=broken())
async def test_histories_cut_anywhere_are_never_refused_by_any_vendor(
    servers: dict[str, Any], history: list[ChatMessage]
) -> None:
    for wire in WIRES:
        server = servers[wire]
        server.answer()
        injects = Injects()
        injects.history = history
        async with Agent(client_of(wire, server), tools=[add], stack=[injects]) as agent:
            answer = await agent.run("go on")
        assert answer.text == "ok", wire
        assert server.refused == [], wire


@pytest.mark.parametrize("wire", WIRES)
async def test_each_server_refuses_what_its_vendor_refuses(
    servers: dict[str, Any], wire: str
) -> None:
    # The law's other half: without repair, the same history is refused.
    server = servers[wire]
    async with client_of(wire, server) as model:
        with pytest.raises(Exception, match="400"):
            await model.complete([*BROKEN, ChatMessage.user("go on")], ChatOptions())
    assert len(server.refused) == 1
