"""ClearToolResults: older results become placeholders, in batches; pairs stay whole."""

from __future__ import annotations

import time

import pytest

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ClearToolResults,
    CompressionProvider,
    HistoryProvider,
    InMemorySession,
    ScriptedChatClient,
    ToolCall,
    ToolOutputLimit,
    tool,
)
from raf.compression import check_tool_pairing

pytestmark = pytest.mark.anyio


def history(turns: int, size: int = 3000, tool: str = "search") -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for n in range(turns):
        call = ToolCall(f"c{n}", tool if n % 2 == 0 else "read", "{}")
        out += [
            ChatMessage.user(f"q{n}"),
            ChatMessage.assistant(tool_calls=[call]),
            ChatMessage.tool(f"c{n}", "x" * size),
            ChatMessage.assistant(f"a{n}"),
        ]
    return out


def cleared(messages: tuple[ChatMessage, ...]) -> list[str]:
    return [
        m.tool_call_id or ""
        for m in messages
        if m.role == "tool" and (m.content or "").startswith("[tool result cleared:")
    ]


async def test_the_placeholder_names_the_tool_the_call_and_the_size() -> None:
    out = await ClearToolResults(keep_last=1, clear_at_least=0).compress(history(2))
    assert out[2].content == "[tool result cleared: search, call c0, 3000 characters]"
    assert out[2].tool_call_id == "c0"
    assert out[6].content == "x" * 3000  # the newest stays whole
    assert check_tool_pairing(out) is None
    assert [m.role for m in out] == [m.role for m in history(2)]  # nothing dropped


async def test_results_are_cleared_in_batches_of_clear_at_least_tokens() -> None:
    strategy = ClearToolResults(keep_last=1, clear_at_least=2000)  # 3 results of ~750 tokens
    seen = [cleared(await strategy.compress(history(n))) for n in range(1, 9)]
    assert seen[:3] == [[], [], []]
    assert seen[3] == ["c0", "c1", "c2"]  # the first batch, at once
    assert seen[4] == seen[5] == seen[3]  # the calls in between extend the previous one
    assert seen[6] == ["c0", "c1", "c2", "c3", "c4", "c5"]
    # Without batching, each call clears one more: the prefix breaks every call.
    single = ClearToolResults(keep_last=1, clear_at_least=0)
    assert [len(cleared(await single.compress(history(n)))) for n in range(1, 6)] == [0, 1, 2, 3, 4]


async def test_excluded_tools_are_kept_whole() -> None:
    out = await ClearToolResults(keep_last=0, clear_at_least=0, exclude=["read"]).compress(
        history(4)
    )
    assert cleared(out) == ["c0", "c2"]  # the "read" calls (c1, c3) are kept


async def test_a_spilled_result_says_how_to_read_it_back() -> None:
    def read_back(message: ChatMessage) -> str | None:
        return f"read it with read_tool_result(call_id={message.tool_call_id!r})"

    out = await ClearToolResults(keep_last=0, clear_at_least=0, read_back=read_back).compress(
        history(1)
    )
    assert out[2].content == (
        "[tool result cleared: search, call c0, 3000 characters; "
        "read it with read_tool_result(call_id='c0')]"
    )


async def test_a_result_tool_output_limit_kept_is_cleared_with_its_read_back_call() -> None:
    # The two together: the cut result is spilled, cleared later, and still read back.
    @tool
    def read_log() -> str:
        """The build log."""
        return "\n".join(f"step {n}: " + ("FAILED" if n == 700 else "ok") for n in range(1000))

    find = '{"call_id": "log", "pattern": "FAILED"}'
    model = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(ToolCall("log", "read_log", "{}")),
            "It is long.",
            ScriptedChatClient.tool_turn(ToolCall("find", "read_tool_result", find)),
            "Step 700 failed.",
        ]
    )
    clearing = ClearToolResults(keep_last=0, clear_at_least=0, cold_after=None)
    agent = Agent(
        model,
        tools=[read_log],
        tool_stack=[ToolOutputLimit(400)],
        stack=[HistoryProvider(), CompressionProvider(clearing)],
    )
    session = InMemorySession()
    await agent.run("Read the log.", session=session)
    response = await agent.run("Which step failed?", session=session)
    sent = model.requests[2].messages
    (placeholder,) = [m for m in sent if m.role == "tool"]
    assert placeholder.content.startswith("[tool result cleared: read_log, call log, ")
    assert 'read_tool_result(call_id="log")' in placeholder.content
    # The read tool is still offered while the placeholder is in view, and it reads.
    assert "read_tool_result" in [t.name for t in model.requests[2].options.tools]
    found = [m for m in response.messages if m.role == "tool" and m.tool_call_id == "find"]
    assert "line 701: step 700: FAILED" in found[0].content


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"keep_last": -1}, "keep_last must be an int >= 0"),
        ({"keep_last": 1.5}, "keep_last must be an int >= 0"),
        ({"clear_at_least": -5}, "clear_at_least must be an int >= 0"),
        ({"cold_after": -1.0}, "cold_after must be None"),
        ({"cold_after": "soon"}, "cold_after must be None"),
    ],
)
def test_bad_arguments_say_what_to_write(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ClearToolResults(**kwargs)  # type: ignore[arg-type]


def test_exclude_as_one_string_is_refused() -> None:
    with pytest.raises(TypeError, match=r"write exclude=\('read',\)"):
        ClearToolResults(exclude="read")


class Script:
    """A model that calls the tool on each turn's first call, and records what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[ChatMessage, ...]] = []

    async def complete(self, messages: object, options: object) -> AgentResponse:
        sent = tuple(messages)  # type: ignore[call-overload]
        self.seen.append(sent)
        if sent[-1].role == "user":
            n = len(self.seen)
            return AgentResponse(
                (ChatMessage.assistant(tool_calls=[ToolCall(f"t{n}", "fetch", "{}")]),)
            )
        return AgentResponse((ChatMessage.assistant("done"),))


@tool
def fetch() -> str:
    """A long page."""
    return "page " * 600


async def test_a_cold_session_clears_every_older_result_now_and_stays_cleared() -> None:
    model = Script()
    strategy = ClearToolResults(keep_last=1, clear_at_least=100_000)  # batches never fill
    agent = Agent(
        model,
        tools=[fetch],
        stack=[HistoryProvider(inject=False), CompressionProvider(strategy)],
    )
    session = InMemorySession("cold")
    for n in range(4):
        await agent.run(f"q{n}", session=session)
    assert cleared(model.seen[-2]) == []  # warm: the batch is not full
    # The cache expired: the session's last model call was an hour ago.
    last = await session.last_model_call()
    assert last is not None
    await session.record_model_call(time.time() - 3600, {})
    await agent.run("after lunch", session=session)
    assert cleared(model.seen[-2]) == ["t1", "t3", "t5"]
    # Warm again: the results cleared when cold stay cleared (the prefix holds).
    await agent.run("and then", session=session)
    first = model.seen[-2]
    assert cleared(first) == ["t1", "t3", "t5"]
    assert first[: len(model.seen[-4])] == model.seen[-4]  # extends the cold call


async def test_cold_after_none_never_clears_early_and_zero_always_does() -> None:
    for cold_after, expected in ((None, []), (0, ["t1", "t3"])):
        model = Script()
        strategy = ClearToolResults(1, clear_at_least=100_000, cold_after=cold_after)
        agent = Agent(
            model,
            tools=[fetch],
            stack=[HistoryProvider(inject=False), CompressionProvider(strategy)],
        )
        session = InMemorySession()
        for n in range(3):
            await agent.run(f"q{n}", session=session)
        await session.record_model_call(time.time() - 3600, {})
        await agent.run("later", session=session)
        assert cleared(model.seen[-2]) == expected
