"""Update, and the assembly of updates into a response (AgentResponse.from_updates)."""

from __future__ import annotations

import pickle

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import AgentResponse, ChatMessage, ToolCall, Update, Usage
from raf.testing.strategies import rechunk, run_responses, updates

CALL = ToolCall("c1", "add", '{"a": 1}')


def test_constructors_fill_the_field_of_their_kind() -> None:
    assert Update.of_text("Hel") == Update("text", "Hel")
    assert Update.of_tool_call(CALL).tool_call is CALL
    result = ChatMessage.tool("c1", "2")
    assert Update.of_tool_result(result).message is result
    assert Update.of_usage(Usage(1, 2)).usage == Usage(1, 2)
    assert Update.of_text("x", raw={"chunk": 1}) == Update.of_text("x")  # raw is not compared


def test_repr_shows_the_field_of_the_kind() -> None:
    assert repr(Update.of_text("Hel")) == "Update(kind='text', text='Hel')"
    assert repr(Update.of_usage(Usage(1, 2))) == (
        "Update(kind='usage', usage=Usage(input_tokens=1, output_tokens=2))"
    )


def test_updates_are_frozen_and_pickle() -> None:
    update = Update.of_tool_call(CALL)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        update.text = "x"  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(update)) == update


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Update("txt"), r"Update.kind must be one of \['text', 'tool_call'"),
        (lambda: Update("text", b"x"), r"Update.text must be a str, got bytes"),
        (lambda: Update("tool_call"), r"'tool_call' Update needs tool_call=ToolCall"),
        (lambda: Update("tool_result"), r"'tool_result' Update needs message=ChatMessage.tool"),
        (
            lambda: Update("tool_result", message=ChatMessage.user("x")),
            r"'tool_result' Update needs message=ChatMessage.tool",
        ),
        (lambda: Update("usage", usage=(1, 2)), r"'usage' Update needs usage=Usage"),
        (
            lambda: Update("usage", "x", usage=Usage()),
            r"Update.text is for 'text' updates, not 'usage' ones",
        ),
    ],
)
def test_a_malformed_update_is_refused_where_it_is_built(build: object, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        build()  # type: ignore[operator]


def test_from_updates_assembles_a_tool_loop() -> None:
    updates = [
        Update.of_text("Let me "),
        Update.of_text("add."),
        Update.of_tool_call(CALL),
        Update.of_usage(Usage(3, 4)),
        Update.of_tool_result(ChatMessage.tool("c1", "2", name="add")),
        Update.of_text("It is "),
        Update.of_text("2."),
        Update.of_usage(Usage(5, 1)),
    ]
    assert AgentResponse.from_updates(updates) == AgentResponse(
        (
            ChatMessage.assistant("Let me add.", tool_calls=[CALL]),
            ChatMessage.tool("c1", "2", name="add"),
            ChatMessage.assistant("It is 2."),
        ),
        Usage(8, 5),
    )


def test_a_turn_without_text_has_no_content_and_no_update_means_no_usage() -> None:
    response = AgentResponse.from_updates([Update.of_tool_call(CALL)])
    assert response.messages == (ChatMessage.assistant(None, tool_calls=[CALL]),)
    assert response.usage is None
    assert AgentResponse.from_updates([]) == AgentResponse()
    # An empty text delta still makes a turn with text "" (what an empty answer is).
    assert AgentResponse.from_updates([Update.of_text("")]).messages == (ChatMessage.assistant(""),)


@settings(max_examples=200, deadline=None)
@given(run_responses())
def test_from_updates_inverts_to_updates(response: AgentResponse) -> None:
    assert AgentResponse.from_updates(response.to_updates()) == response


@settings(max_examples=200, deadline=None)
@given(run_responses(), st.lists(st.integers(0, 20), max_size=4))
def test_how_the_text_is_chunked_does_not_matter(response: AgentResponse, cuts: list[int]) -> None:
    assert AgentResponse.from_updates(rechunk(response.to_updates(), cuts)) == response


def test_to_updates_skips_what_has_no_update() -> None:
    response = AgentResponse((ChatMessage.user("hi"), ChatMessage.assistant("yo")))
    assert response.to_updates() == (Update.of_text("yo"),)


@settings(max_examples=100, deadline=None)
@given(updates())
def test_assembling_is_stable(stream: list[Update]) -> None:
    response = AgentResponse.from_updates(stream)
    assert AgentResponse.from_updates(response.to_updates()) == response


@given(updates(), st.data())
def test_an_assembly_read_midway_goes_on_unchanged(
    streamed: list[Update], data: st.DataObject
) -> None:
    # What a run keeps instead of its updates: read at an early close, then maybe fed on.
    from raf._values.assembly import Assembly

    cut = data.draw(st.integers(0, len(streamed)))
    assembly = Assembly()
    for update in streamed[:cut]:
        assembly.add(update)
    assert assembly.response() == AgentResponse.from_updates(streamed[:cut])
    for update in streamed[cut:]:
        assembly.add(update)
    assert assembly.response() == AgentResponse.from_updates(streamed)
    assert assembly.response() == AgentResponse.from_updates(streamed)  # read twice, the same
