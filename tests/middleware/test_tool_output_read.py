"""read_tool_result: bounded slices and pattern searches of a spilled result, and bad input
told to the model as the tool's answer (the run goes on)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from raf import Agent, InMemorySession, ScriptedChatClient, Session, ToolCall, ToolOutputLimit, tool

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn
LINES = [
    f"{number:04d} " + ("ERROR disk full" if number % 100 == 7 else "ok") for number in range(1000)
]
LOG = "\n".join(LINES)
#: Lines that make a backtracking engine take exponential time on ``(a+)+$``.
EVIL = "\n".join("a" * 40 + "!" for _ in range(2000))


async def read(
    *calls: dict[str, Any], text: str = LOG, max_chars: int = 1000, session: Session | None = None
) -> list[str]:
    """A tool returns ``text`` (cut and spilled), then the model reads it with ``calls``;
    the answers of the reads."""

    @tool
    def dump() -> str:
        """The log."""
        return text

    script: list[Any] = [turn(ToolCall("big", "dump", "{}"))]
    script += [
        turn(ToolCall(f"r{n}", "read_tool_result", json.dumps(c))) for n, c in enumerate(calls)
    ]
    client = ScriptedChatClient([*script, "done"])
    agent = Agent(client, tools=[dump], tool_stack=[ToolOutputLimit(max_chars)])
    response = await agent.run("go", session=session)
    answers = [m.content or "" for m in response.messages if m.role == "tool"]
    assert response.text == "done"  # whatever the reads met, the run went on
    return answers[1:]


async def test_a_slice_is_the_characters_from_offset_and_says_how_to_read_on() -> None:
    (answer,) = await read({"call_id": "big", "offset": 500, "limit": 300})
    header, body = answer.split("\n", 1)
    assert body == LOG[500:800]
    assert header == (
        f"[characters 500 to 800 of {len(LOG):,} of the result of call big; "
        'read_tool_result(call_id="big", offset=800) reads on]'
    )


async def test_the_last_slice_says_it_is_the_end() -> None:
    (answer,) = await read({"call_id": "big", "offset": len(LOG) - 20})
    assert answer.endswith(LOG[-20:])
    assert ": its end]" in answer


async def test_a_slice_is_bounded_by_the_limit_whatever_the_model_asks() -> None:
    (whole, asked) = await read({"call_id": "big"}, {"call_id": "big", "limit": 10**9})
    assert len(whole) <= 1000
    assert whole == asked


async def test_a_pattern_gives_the_matching_lines_with_their_numbers() -> None:
    (answer,) = await read({"call_id": "big", "pattern": "ERROR", "offset": 0}, max_chars=4000)
    lines = answer.splitlines()
    said = f"({len(LOG):,} characters) from character 0"
    assert lines[0] == f'[10 lines of the result of call big {said} match "ERROR"]'
    assert lines[1:] == [f"line {n + 1}: {LINES[n]}" for n in range(7, 1000, 100)]


async def test_a_search_that_finds_more_than_fits_says_where_to_go_on() -> None:
    (first,) = await read({"call_id": "big", "pattern": "ok"}, max_chars=600)
    assert len(first) <= 600
    onward = re.search(
        r'read_tool_result\(call_id="big", offset=(\d+), pattern="ok"\) goes on', first
    )
    assert onward is not None
    shown = [line for line in first.splitlines() if line.startswith("line ")]
    (after,) = await read(
        {"call_id": "big", "pattern": "ok", "offset": int(onward[1])}, max_chars=600
    )
    following = [line for line in after.splitlines() if line.startswith("line ")]
    number = int(shown[-1].split(":")[0].removeprefix("line "))
    assert int(following[0].split(":")[0].removeprefix("line ")) > number


async def test_a_catastrophic_pattern_cannot_stall_the_run() -> None:
    # Python's re takes time exponential in the a's on each of these lines (hours for one);
    # RE2 matches in linear time, so the answer comes with the rest of the run.
    (answer,) = await read({"call_id": "big", "pattern": "(a+)+$"}, text=EVIL)
    assert answer.startswith("[0 lines of the result of call big")


@pytest.mark.parametrize(
    ("call", "told"),
    [
        (
            {"call_id": "nope"},
            'Error: no full result is kept for call_id "nope"; write the call_id exactly',
        ),
        (
            {"call_id": "big", "pattern": "(ERROR"},
            'Error: the pattern "(ERROR" does not compile (missing )',
        ),
        (
            {"call_id": "big", "pattern": "(?=ok)"},
            "write an RE2 regular expression (no look-around",
        ),
        ({"call_id": "big", "pattern": r"(o)\1"}, "does not compile (invalid escape sequence"),
        (
            {"call_id": "big", "pattern": "a" * 1001},
            "the pattern has 1,001 characters; write one of at most 1000",
        ),
        (
            {"call_id": "big", "offset": 10**6},
            f'offset 1000000 is past the end: the result of "big" has {len(LOG):,}',
        ),
        ({"call_id": "big", "offset": -1}, "Error: "),
        ({"offset": 3}, "call_id"),
    ],
)
async def test_bad_input_is_told_to_the_model_with_what_to_write(
    call: dict[str, Any], told: str
) -> None:
    (answer,) = await read(call)
    assert told in answer
    assert answer.startswith("Error")


async def test_the_reads_come_from_the_session_the_result_was_spilled_in() -> None:
    session = InMemorySession()
    (answer,) = await read({"call_id": "big", "offset": 5, "limit": 10}, session=session)
    assert answer.endswith(LOG[5:15])
    assert await session.spilled_tool_result("big") == LOG
