"""ToolOutputLimit: a long tool result is cut once, when produced, and its full text spilled."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from raf import (
    Agent,
    ChatMessage,
    HistoryProvider,
    InMemorySession,
    ScriptedChatClient,
    ToolCall,
    ToolOutputLimit,
    tool,
)
from raf.errors import ToolConflictError
from raf.observe import ContextLedger

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn
LONG = "\n".join(f"line {number}: " + "x" * 40 for number in range(500))  # 26,890 characters


@tool
def dump() -> str:
    """A long result."""
    return LONG


@tool
def short() -> str:
    """A short result."""
    return "all fine"


def tool_texts(messages: Iterable[ChatMessage]) -> list[str]:
    return [message.content or "" for message in messages if message.role == "tool"]


def offered(client: ScriptedChatClient) -> list[list[str]]:
    return [[t.name for t in request.options.tools] for request in client.requests]


def agent_for(client: ScriptedChatClient, limit: ToolOutputLimit, **more: object) -> Agent:
    return Agent(client, tools=[dump, short], tool_stack=[limit], history=True, **more)  # type: ignore[arg-type]


async def test_a_result_within_max_chars_is_untouched() -> None:
    client = ScriptedChatClient([turn(ToolCall("1", "short", "{}")), "ok"])
    response = await agent_for(client, ToolOutputLimit(1000)).run("go")
    assert tool_texts(response.messages) == ["all fine"]
    assert offered(client) == [["dump", "short"], ["dump", "short"]]  # nothing spilled in view


async def test_a_long_result_is_cut_once_and_every_later_call_sends_the_same_bytes() -> None:
    client = ScriptedChatClient(
        [turn(ToolCall("big", "dump", "{}")), turn(ToolCall("2", "short", "{}")), "one", "two"]
    )
    session = InMemorySession()
    agent = agent_for(client, ToolOutputLimit(2000))
    await agent.run("first", session=session)
    await agent.run("second", session=session)
    (cut,) = {text for request in client.requests[1:] for text in tool_texts(request.messages)[:1]}
    assert len(cut) <= 2000
    assert cut.startswith("line 0: ")
    assert cut.endswith(LONG[-200:])
    assert "[raf: " in cut
    assert 'read_tool_result(call_id="big", offset=' in cut
    # The model's later calls, the stored history and the response: the same text.
    stored = tool_texts(await session.get_messages())
    assert stored[0] == cut
    assert all(tool_texts(r.messages)[0] == cut for r in client.requests[1:])
    assert await session.spilled_tool_result("big") == LONG
    # The read tool is offered from the call that first sees the cut result on.
    assert offered(client) == [
        ["dump", "short"],
        ["dump", "short", "read_tool_result"],
        ["dump", "short", "read_tool_result"],
        ["dump", "short", "read_tool_result"],
    ]


async def test_a_call_id_too_long_for_the_marker_is_named_by_a_short_key_it_reads_back() -> None:
    # An id of 300 characters (or one of unicode, which JSON escapes) would make the marker alone
    # longer than a small max_chars: the result is kept under a short key the marker names.
    long_id = "call-" + "é" * 295
    client = ScriptedChatClient(
        [turn(ToolCall(long_id, "dump", "{}")), "ok", turn(ToolCall("r", "read_tool_result", "{}"))]
    )
    session = InMemorySession()
    response = await agent_for(client, ToolOutputLimit(400)).run("go", session=session)
    (cut,) = tool_texts(response.messages)
    assert len(cut) <= 400
    key = re.search(r'read_tool_result\(call_id="([^"]+)"', cut)
    assert key is not None
    assert len(key.group(1)) <= 64
    assert await session.spilled_tool_result(key.group(1)) == LONG


async def test_a_call_id_used_again_keeps_each_result_apart() -> None:
    # Servers that number each answer's calls from zero send "call_0" turn after turn: the
    # second cut result must not take the place of the first, which its marker still names.
    logs = iter(["first log\n" + LONG, "second log\n" + LONG])

    @tool
    def log() -> str:
        """A long log."""
        return next(logs)

    client = ScriptedChatClient(
        [turn(ToolCall("call_0", "log", "{}")), "one", turn(ToolCall("call_0", "log", "{}")), "two"]
    )
    session = InMemorySession()
    agent = Agent(client, tools=[log], tool_stack=[ToolOutputLimit(2000)], history=True)
    await agent.run("first", session=session)
    await agent.run("second", session=session)
    cuts = tool_texts(await session.get_messages())
    keys = [re.findall(r'read_tool_result\(call_id="([^"]+)"', cut)[0] for cut in cuts]
    assert keys[0] == "call_0"
    assert keys[1] != "call_0"
    assert [(await session.spilled_tool_result(key) or "")[:10] for key in keys] == [
        "first log\n",
        "second log",
    ]


async def test_the_read_tool_is_no_longer_offered_once_the_cut_result_left_the_window() -> None:
    client = ScriptedChatClient([turn(ToolCall("big", "dump", "{}")), "one", "two", "three"])
    window = HistoryProvider(max_messages=4, step=2)
    agent = Agent(client, tools=[dump], tool_stack=[ToolOutputLimit(1000)], stack=[window])
    session = InMemorySession()
    for text in ("first", "second", "third"):
        await agent.run(text, session=session)
    assert offered(client) == [
        ["dump"],
        ["dump", "read_tool_result"],  # the cut result is in this call
        ["dump", "read_tool_result"],  # and in the history of the next run
        ["dump"],  # the window dropped it
    ]


async def test_keep_head_keeps_the_start_and_says_the_end_was_left_out() -> None:
    client = ScriptedChatClient([turn(ToolCall("big", "dump", "{}")), "ok"])
    response = await agent_for(client, ToolOutputLimit(1500, keep="head")).run("go")
    (cut,) = tool_texts(response.messages)
    head, marker = cut.rsplit("\n", 1)
    assert LONG.startswith(head)
    assert len(cut) <= 1500
    assert marker.startswith("[raf: ")
    assert f"of {len(LONG):,})" in marker


async def test_preview_chars_shows_that_many_characters_of_a_cut_result() -> None:
    client = ScriptedChatClient([turn(ToolCall("big", "dump", "{}")), "ok"])
    limit = ToolOutputLimit(20_000, preview_chars=600)
    (cut,) = tool_texts((await agent_for(client, limit).run("go")).messages)
    marker = next(line for line in cut.splitlines() if line.startswith("[raf: "))
    assert len(cut) - len(marker) - 2 <= 600


async def test_without_spill_nothing_is_kept_and_no_read_tool_is_offered() -> None:
    client = ScriptedChatClient([turn(ToolCall("big", "dump", "{}")), "ok"])
    session = InMemorySession()
    response = await agent_for(client, ToolOutputLimit(1000, spill=False)).run(
        "go", session=session
    )
    (cut,) = tool_texts(response.messages)
    assert "the full result was not kept]" in cut
    assert "read_tool_result" not in cut
    assert offered(client) == [["dump", "short"], ["dump", "short"]]
    assert await session.spilled_tool_result("big") is None


class Forgetful:
    """A session of a user's own that cannot keep spilled results."""

    def __init__(self) -> None:
        self.inner = InMemorySession("forgetful")

    def __getattr__(self, name: str) -> object:
        if name in ("spill_tool_result", "spilled_tool_result"):
            raise AttributeError(name)
        return getattr(self.inner, name)


async def test_a_session_that_cannot_keep_spills_gets_the_cut_text_saying_so() -> None:
    client = ScriptedChatClient([turn(ToolCall("big", "dump", "{}")), "ok"])
    response = await agent_for(client, ToolOutputLimit(1000)).run("go", session=Forgetful())  # type: ignore[arg-type]
    (cut,) = tool_texts(response.messages)
    assert "the full result was not kept]" in cut


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        (
            {"max_chars": 50},
            r"max_chars must be at least \d+.*write ToolOutputLimit\(\d+\) or more",
        ),
        ({"max_chars": 1000, "preview_chars": 990}, r"preview_chars must be an int from 0 to \d+"),
        ({"max_chars": 1000, "preview_chars": -1}, "preview_chars must be an int"),
        ({"max_chars": 1000, "keep": "tail"}, "'keep' must be in"),
    ],
)
def test_bad_arguments_are_refused_at_construction(
    arguments: dict[str, object], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        ToolOutputLimit(**arguments)  # type: ignore[arg-type]


def test_max_chars_must_be_an_int() -> None:
    with pytest.raises(TypeError, match="must be an int"):
        ToolOutputLimit(1000.0)  # type: ignore[arg-type]


def test_an_agent_tool_named_read_tool_result_clashes_with_the_limit_at_construction() -> None:
    @tool
    def read_tool_result(call_id: str) -> str:
        """Mine."""
        return call_id

    with pytest.raises(ToolConflictError, match="read_tool_result"):
        Agent(ScriptedChatClient(), tools=[read_tool_result], tool_stack=[ToolOutputLimit(1000)])
    Agent(
        ScriptedChatClient(),
        tools=[read_tool_result],
        tool_stack=[ToolOutputLimit(1000, spill=False)],
    )


async def test_in_the_chat_stack_it_says_where_it_belongs() -> None:
    agent = Agent(ScriptedChatClient(["hi"]), chat_stack=[ToolOutputLimit(1000)])
    with pytest.raises(TypeError, match=r"belongs in Agent\(tool_stack=\[...\]\)"):
        await agent.run("go")


async def test_the_context_trace_lists_the_cut_results() -> None:
    ledger = ContextLedger()
    client = ScriptedChatClient([turn(ToolCall("big", "dump", "{}")), "ok"])
    await agent_for(client, ToolOutputLimit(1000), observers=[ledger]).run("go")
    report = ledger.report()
    assert "cut tool results:" in report
    assert f"big (dump), from call 2: {len(LONG):,} characters" in report
    assert "spilled: kept with the session, read_tool_result reads it" in report


async def test_a_streamed_run_streams_the_cut_text() -> None:
    client = ScriptedChatClient([turn(ToolCall("big", "dump", "{}")), "ok"])
    async with agent_for(client, ToolOutputLimit(1000)).stream("go") as stream:
        sent = [
            u.message.content
            for u in [u async for u in stream]
            if u.kind == "tool_result" and u.message
        ]
    assert len(sent) == 1
    assert len(sent[0] or "") <= 1000


@given(
    text=st.text(alphabet=st.sampled_from("ab\n✓"), min_size=0, max_size=3000),
    max_chars=st.integers(min_value=250, max_value=2500),
    keep=st.sampled_from(["head_tail", "head"]),
    call_id=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    preview=st.one_of(st.none(), st.floats(0, 1)),
)
def test_the_cut_is_bounded_faithful_and_the_same_every_time(
    text: str, max_chars: int, keep: str, call_id: str | None, preview: float | None
) -> None:
    # The marker names a key of at most 64 characters of JSON (the middleware names a longer id
    # by a short key of its own: see the test above).
    assume(call_id is None or len(json.dumps(call_id)) <= 66)
    preview_chars = None if preview is None else int(preview * max_chars)
    try:
        limit = ToolOutputLimit(max_chars, keep=keep, preview_chars=preview_chars)  # type: ignore[arg-type]
    except ValueError:
        assume(False)
        raise
    cut = limit.cut(text, call_id)
    assert cut == limit.cut(text, call_id)
    if len(text) <= max_chars:
        return
    assert len(cut) <= max_chars
    # The marker, as docs/long-running.md writes it: the head before it and the tail after
    # it are the text without the characters it says were left out.
    found = re.search(
        r"\[raf: [\d,]+ characters left out \(characters ([\d,]+) to ([\d,]+) of", cut
    )
    assert found is not None
    start, end = (int(figure.replace(",", "")) for figure in found.groups())
    said = f"characters {start:,} to {end:,} of {len(text):,})"
    kept = (
        f"; read them with read_tool_result(call_id={json.dumps(call_id)}, offset={start})]"
        if call_id is not None
        else "; the full result was not kept]"
    )
    marker = f"[raf: {end - start:,} characters left out ({said}{kept}"
    tail = "\n" + text[end:] if end < len(text) else ""
    before = "" if start == 0 or text[start - 1] == "\n" else "\n"
    assert cut == f"{text[:start]}{before}{marker}{tail}"
    assert keep == "head_tail" or end == len(text)
