"""The replay chart: one panel per stack on one scale, a bar per call, marks where the cache
broke; valid SVG whatever the names."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

import raf
from raf import Agent, ChatMessage, HistoryProvider, ScriptedChatClient
from raf._observers.replay_chart import replay_chart

pytestmark = pytest.mark.anyio
SVG = "{http://www.w3.org/2000/svg}"


def _talk(turns: int) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    for turn in range(turns):
        messages += [ChatMessage.user(f"question {turn} " * 5), ChatMessage.assistant("ok " * 9)]
    return messages


async def test_each_call_is_a_bar_and_each_break_a_mark() -> None:
    whole = await raf.replay(Agent(ScriptedChatClient(), history=True), _talk(8))
    window = await raf.replay(
        Agent(ScriptedChatClient(), stack=[HistoryProvider(max_messages=4, step=2)]), _talk(8)
    )
    drawn = ET.fromstring(replay_chart([("<whole> & co", whole), ("window", window)]))
    groups = list(drawn.iter(f"{SVG}g"))
    assert len(groups) == len(whole.calls) + len(window.calls)
    # Each call: its cached part and its fresh part; a broken call: one mark more.
    for group in groups:
        assert len(group.findall(f"{SVG}rect")) == 2
    marks = [group for group in groups if group.find(f"{SVG}path") is not None]
    broken = sum(call.broken_by is not None for call in window.calls)
    assert broken > 0
    assert len(marks) == broken
    texts = [el.text for el in drawn.iter(f"{SVG}text")]
    assert "<whole> & co" in texts  # escaped in the file, read back as it was
    assert any(text and "x the first" in text for text in texts)


def test_a_chart_needs_a_report() -> None:
    with pytest.raises(ValueError, match="at least one report"):
        replay_chart([])
