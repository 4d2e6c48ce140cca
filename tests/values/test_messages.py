"""ChatMessage, ToolCall, Usage and AgentResponse."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raf
from raf import AgentResponse, ChatMessage, ToolCall, Usage, request_hash

# -- ChatMessage constructors ------------------------------------------------


def test_role_constructors_set_role_and_fields() -> None:
    assert ChatMessage.user("hi") == ChatMessage("user", "hi")
    assert ChatMessage.user("hi", name="ann").name == "ann"
    assert ChatMessage.system("be brief") == ChatMessage("system", "be brief")
    assert ChatMessage.assistant("ok") == ChatMessage("assistant", "ok")
    assert ChatMessage.assistant().content is None
    call = ToolCall("c1", "add", '{"a": 1}')
    turn = ChatMessage.assistant(tool_calls=[call])
    assert turn.role == "assistant"
    assert turn.tool_calls == (call,)
    result = ChatMessage.tool("c1", "2", name="add")
    assert (result.role, result.content, result.tool_call_id, result.name) == (
        "tool",
        "2",
        "c1",
        "add",
    )


def test_messages_are_frozen() -> None:
    message = ChatMessage.user("hi")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        message.content = "changed"  # type: ignore[misc]
    assert attrs.evolve(message, content="changed").content == "changed"
    assert message.content == "hi"


def test_tool_calls_given_as_list_become_a_tuple() -> None:
    call = ToolCall("c1", "now")
    message = ChatMessage("assistant", None, tool_calls=[call])
    assert message.tool_calls == (call,)
    assert isinstance(message.tool_calls, tuple)


# -- validation ----------------------------------------------------------------


@pytest.mark.parametrize("role", ["robot", "User", "", None, 1])
def test_bad_role_is_a_value_error_naming_the_roles(role: object) -> None:
    with pytest.raises(ValueError, match=r"ChatMessage.role must be one of .*assistant"):
        ChatMessage(role, "hi")  # type: ignore[arg-type]


@pytest.mark.parametrize("content", [1, b"bytes", ["a"], {"text": "a"}])
def test_non_str_content_is_a_type_error(content: object) -> None:
    with pytest.raises(TypeError, match=r"ChatMessage.content must be a str or None, got"):
        ChatMessage("user", content)  # type: ignore[arg-type]


def test_non_str_name_and_tool_call_id_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"ChatMessage.name"):
        ChatMessage("user", "hi", name=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ChatMessage.tool_call_id"):
        ChatMessage("tool", "hi", tool_call_id=3)  # type: ignore[arg-type]


def test_non_toolcall_in_tool_calls_names_the_index() -> None:
    good = ToolCall("c1", "now")
    with pytest.raises(TypeError, match=r"tool_calls\[1\] must be a ToolCall, got dict"):
        ChatMessage.assistant(tool_calls=[good, {"id": "c2", "name": "x"}])  # type: ignore[list-item]


def test_toolcall_fields_must_be_str() -> None:
    with pytest.raises(TypeError, match=r"ToolCall.arguments must be a str, got dict"):
        ToolCall("c1", "add", {"a": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"ToolCall.id"):
        ToolCall(1, "add")  # type: ignore[arg-type]


def test_toolcall_parsed_arguments() -> None:
    assert ToolCall("c", "f", '{"a": [1, 2]}').parsed_arguments == {"a": [1, 2]}
    assert ToolCall("c", "f", "").parsed_arguments == {}
    assert ToolCall("c", "f").parsed_arguments == {}
    with pytest.raises(ValueError):  # noqa: PT011 - json's own error, a ValueError subclass
        _ = ToolCall("c", "f", "{not json").parsed_arguments


# -- to_dict / from_dict -------------------------------------------------------


def test_to_dict_holds_only_the_fields_that_are_set() -> None:
    assert ChatMessage.user("hi").to_dict() == {"role": "user", "content": "hi"}
    turn = ChatMessage.assistant(tool_calls=[ToolCall("c1", "now", "{}")])
    assert turn.to_dict() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "name": "now", "arguments": "{}"}],
    }
    assert ChatMessage.tool("c1", "12:00", name="now").to_dict() == {
        "role": "tool",
        "content": "12:00",
        "name": "now",
        "tool_call_id": "c1",
    }


_text = st.text(max_size=20)
_tool_calls = st.lists(
    st.builds(ToolCall, _text, _text, st.sampled_from(["{}", '{"a": 1}', "", "not json"])),
    max_size=3,
)
chat_messages = st.builds(
    ChatMessage,
    st.sampled_from(["system", "user", "assistant", "tool"]),
    st.none() | _text,
    name=st.none() | _text,
    tool_calls=_tool_calls,
    tool_call_id=st.none() | _text,
)


@settings(max_examples=75)
@given(chat_messages)
def test_dict_round_trip(message: ChatMessage) -> None:
    data = message.to_dict()
    assert ChatMessage.from_dict(data) == message
    # through real JSON text too, as a store would keep it
    assert ChatMessage.from_dict(json.loads(json.dumps(data))) == message


@settings(max_examples=50)
@given(st.lists(chat_messages, max_size=5))
def test_canonical_json_is_sorted_and_compact(messages: list[ChatMessage]) -> None:
    """request_hash digests the canonical JSON: sorted keys, no spaces, UTF-8 kept."""
    text = json.dumps(
        [m.to_dict() for m in messages], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert request_hash(messages) == hashlib.sha256(text.encode()).hexdigest()
    assert [ChatMessage.from_dict(d) for d in json.loads(text)] == messages


def test_from_dict_validates_like_the_constructor() -> None:
    with pytest.raises(ValueError, match="role"):
        ChatMessage.from_dict({"role": "robot", "content": "hi"})
    with pytest.raises(TypeError, match="content"):
        ChatMessage.from_dict({"role": "user", "content": 5})


# -- Usage -----------------------------------------------------------------------


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
@settings(max_examples=50)
def test_usage_adds_field_by_field(a: int, b: int, c: int, d: int) -> None:
    total = Usage(a, b) + Usage(c, d)
    assert total == Usage(a + c, b + d)
    assert total.total_tokens == a + b + c + d


def test_usage_defaults_to_zero() -> None:
    assert Usage() + Usage(3, 4) == Usage(3, 4)
    assert Usage().total_tokens == 0


counts = st.integers(0, 10**6)
usages = st.builds(
    Usage,
    counts,
    counts,
    cached_input_tokens=counts,
    reasoning_tokens=counts,
    cache_write_tokens=counts,
)


@given(usages, usages)
@settings(max_examples=50)
def test_usage_adds_its_breakdowns_too(one: Usage, two: Usage) -> None:
    total = one + two
    for field in ("cached_input_tokens", "reasoning_tokens", "cache_write_tokens"):
        assert getattr(total, field) == getattr(one, field) + getattr(two, field)


def test_cache_write_tokens_default_to_zero_and_show_only_when_set() -> None:
    assert Usage(1, 2).cache_write_tokens == 0
    assert repr(Usage(1, 2)) == "Usage(input_tokens=1, output_tokens=2)"
    assert repr(Usage(10, 2, cached_input_tokens=4, cache_write_tokens=6)) == (
        "Usage(input_tokens=10, output_tokens=2, cached_input_tokens=4, cache_write_tokens=6)"
    )


# -- AgentResponse -------------------------------------------------------------


def test_text_is_empty_without_an_assistant_message() -> None:
    assert AgentResponse().text == ""
    assert AgentResponse((ChatMessage.tool("c1", "42"),)).text == ""


def test_text_is_the_last_assistant_messages_text() -> None:
    response = AgentResponse(
        (
            ChatMessage.assistant("thinking", tool_calls=[ToolCall("c1", "now")]),
            ChatMessage.tool("c1", "noon"),
            ChatMessage.assistant("It is noon."),
        )
    )
    assert response.text == "It is noon."


def test_text_of_a_last_assistant_turn_without_text_is_empty() -> None:
    response = AgentResponse(
        (ChatMessage.assistant("earlier"), ChatMessage.assistant(tool_calls=[ToolCall("c", "f")]))
    )
    assert response.text == ""


def test_tool_calls_collects_every_call_in_order() -> None:
    a, b, c = ToolCall("1", "a"), ToolCall("2", "b"), ToolCall("3", "c")
    response = AgentResponse(
        [
            ChatMessage.assistant(tool_calls=[a, b]),
            ChatMessage.tool("1", "x"),
            ChatMessage.tool("2", "y"),
            ChatMessage.assistant(tool_calls=[c]),
        ]
    )
    assert response.tool_calls == (a, b, c)
    assert isinstance(response.messages, tuple)
    assert AgentResponse((ChatMessage.assistant("done"),)).tool_calls == ()


def test_raw_is_not_part_of_equality() -> None:
    one = AgentResponse((ChatMessage.assistant("a"),), Usage(1, 1), raw={"id": 1})
    two = AgentResponse((ChatMessage.assistant("a"),), Usage(1, 1), raw={"id": 2})
    assert one == two


def test_from_dict_without_a_role_says_so() -> None:
    with pytest.raises(ValueError, match="no 'role'"):
        ChatMessage.from_dict({"content": "hi"})


@pytest.mark.parametrize(
    ("field", "build"),
    [
        ("content", lambda text: ChatMessage.user(text).content),
        ("name", lambda text: ChatMessage.user("x", name=text).name),
        ("tool_call_id", lambda text: ChatMessage.tool(text, "r").tool_call_id),
        ("arguments", lambda text: ToolCall("c", "f", text).arguments),
        ("tool name", lambda text: ToolCall("c", text).name),
    ],
)
def test_lone_surrogates_become_the_replacement_character(field: str, build: Any) -> None:
    assert build("a\ud800b\udfffc") == "a\ufffdb\ufffdc"
    assert build("naïve ✓") == "naïve ✓"  # other text is kept as it is


def test_json_with_a_lone_surrogate_escape_round_trips_as_replacement() -> None:
    message = ChatMessage.from_dict(json.loads('{"role": "assistant", "content": "x\\ud800"}'))
    assert message.content == "x\ufffd"
    assert request_hash([message])  # its canonical JSON encodes as UTF-8


def test_reasoning_rides_on_an_assistant_message_through_its_dict_form() -> None:
    reasoning = raf.Reasoning("anthropic", '[{"type":"thinking","signature":"s"}]')
    message = raf.ChatMessage(
        "assistant", None, tool_calls=[raf.ToolCall("c1", "f")], reasoning=reasoning
    )
    data = message.to_dict()
    assert data["reasoning"] == {"source": "anthropic", "data": reasoning.data}
    assert raf.ChatMessage.from_dict(data) == message
    assert "reasoning" not in raf.ChatMessage.assistant("hi").to_dict()
    assert "reasoning" not in repr(message)


def test_reasoning_of_another_type_is_refused_with_the_field_named() -> None:
    with pytest.raises(TypeError, match=r"ChatMessage\.reasoning must be a Reasoning"):
        raf.ChatMessage("assistant", "x", reasoning={"source": "a"})  # type: ignore[arg-type]
