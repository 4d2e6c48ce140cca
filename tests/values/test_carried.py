"""Compaction (beside Reasoning): a server's compaction kept on its assistant turn, through
its dict form, a stream's updates and every field check."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import raf
from raf import AgentResponse, ChatMessage, Compaction, Update


def test_a_compaction_rides_on_an_assistant_message_through_its_dict_form() -> None:
    compaction = Compaction("anthropic", '{"type":"compaction","content":"s"}', summary="s")
    message = ChatMessage.assistant("hi", compaction=compaction)
    data = message.to_dict()
    assert data["compaction"] == {"source": "anthropic", "data": compaction.data, "summary": "s"}
    assert ChatMessage.from_dict(json.loads(json.dumps(data))) == message
    assert "compaction" not in ChatMessage.assistant("hi").to_dict()
    assert "compaction" not in repr(message)  # large and opaque


def test_a_compaction_without_summary_has_none_in_its_dict() -> None:
    compaction = Compaction("openai.responses", '{"type":"compaction"}')
    assert compaction.to_dict() == {"source": "openai.responses", "data": compaction.data}
    assert Compaction.from_dict(compaction.to_dict()) == compaction


def test_fields_of_the_wrong_type_are_refused_with_the_field_named() -> None:
    with pytest.raises(TypeError, match=r"ChatMessage\.compaction must be a Compaction"):
        ChatMessage("assistant", "x", compaction={"source": "a"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Compaction\.summary must be a str or None"):
        Compaction("anthropic", "{}", summary=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"Compaction\.data must be a str"):
        Compaction("anthropic", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"a 'compaction' Update needs compaction=Compaction"):
        Update("compaction")


def test_reasoning_moved_house_but_keeps_its_name() -> None:
    # raf.Reasoning is the same class where it lives now (raf/_values/carried.py).
    assert raf.Reasoning.__module__ == "raf"
    assert raf.Compaction.__module__ == "raf"


@given(
    text=st.none() | st.text(max_size=8),
    summary=st.none() | st.text(max_size=8),
    data=st.text(max_size=20),
)
def test_a_stream_of_updates_carries_the_compaction_to_the_same_turn(
    text: str | None, summary: str | None, data: str
) -> None:
    """to_updates and from_updates are inverses with a compaction on the turn."""
    message = ChatMessage.assistant(text, compaction=Compaction("anthropic", data, summary))
    answer = AgentResponse((message, ChatMessage.tool("c", "r")))
    updates = answer.to_updates()
    assert "compaction" in [update.kind for update in updates]
    assert AgentResponse.from_updates(updates) == answer
