"""ChatMessage, ToolCall, Messages, Usage and AgentResponse."""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from itertools import accumulate

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import AgentResponse, ChatMessage, Messages, ToolCall, Usage
from raf.messages import join_messages, messages_to_json, trusted_messages

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
    text = messages_to_json(messages)
    expected = json.dumps(
        [m.to_dict() for m in messages], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert text == expected
    assert [ChatMessage.from_dict(d) for d in json.loads(text)] == messages


def test_from_dict_validates_like_the_constructor() -> None:
    with pytest.raises(ValueError, match="role"):
        ChatMessage.from_dict({"role": "robot", "content": "hi"})
    with pytest.raises(TypeError, match="content"):
        ChatMessage.from_dict({"role": "user", "content": 5})


# -- Messages ------------------------------------------------------------------


def test_messages_is_a_sequence_of_checked_messages() -> None:
    items = [ChatMessage.user("a"), ChatMessage.assistant("b")]
    messages = Messages(items)
    assert isinstance(messages, Sequence)
    assert list(messages) == items
    assert messages == tuple(items)
    assert tuple(items) == messages
    assert Messages() == ()
    assert repr(Messages([ChatMessage.user("a")])).startswith("Messages([ChatMessage(")


message_pool = [ChatMessage.user(str(i)) for i in range(400)]
chunk_sizes = st.lists(st.integers(0, 40), max_size=12)


def build(sizes: list[int]) -> tuple[Messages, tuple[ChatMessage, ...]]:
    """A Messages grown by appends of the given sizes, and the tuple it must equal."""
    rope, model, used = Messages(), (), 0
    for size in sizes:
        part = tuple(message_pool[used : used + size])
        used += size
        rope = rope + part if size % 2 else join_messages(rope, part)
        model = model + part
    return rope, model


@settings(max_examples=150)
@given(chunk_sizes, st.data())
def test_messages_behaves_like_the_tuple_it_holds(sizes: list[int], data: st.DataObject) -> None:
    rope, model = build(sizes)
    assert len(rope) == len(model)
    assert tuple(rope) == model
    assert list(reversed(rope)) == list(reversed(model))
    assert rope == model
    assert hash(rope) == hash(model)
    for index in range(-len(model), len(model)):
        assert rope[index] is model[index]
    with pytest.raises(IndexError):
        rope[len(model)]
    start = data.draw(st.integers(-450, 450) | st.none())
    stop = data.draw(st.integers(-450, 450) | st.none())
    step = data.draw(st.sampled_from([None, 1, 2, -1, 3]))
    piece = rope[start:stop:step]
    assert type(piece) is Messages
    assert piece == model[start:stop:step]
    other, other_model = build(data.draw(chunk_sizes))
    assert rope + other == model + other_model
    assert pickle.loads(pickle.dumps(rope)) == model


@given(st.lists(st.integers(1, 6), min_size=1, max_size=300))
def test_appends_keep_few_chunks(sizes: list[int]) -> None:
    rope, model = build([s | 1 for s in sizes])
    assert rope == model
    # Sizes fall by more than half towards the end, so chunks stay near log2(n).
    assert len(rope._chunks) <= max(1, len(model)).bit_length() + 1


def test_joining_shares_the_history_instead_of_copying_it() -> None:
    history = Messages(message_pool[:300])
    request = (ChatMessage.user("now"),)
    seen = join_messages((ChatMessage.system("sys"),), history, request)
    assert seen == (ChatMessage.system("sys"), *message_pool[:300], *request)
    assert any(chunk is history._chunks[0] for chunk in seen._chunks)


def test_a_few_messages_before_a_long_history_do_not_copy_it() -> None:
    """A provider injecting one message before a history provider: the history is shared."""
    history = Messages(message_pool[:300])
    first = (ChatMessage.system("retrieved"),)
    for joined in (join_messages(first, history), join_messages((), first, history)):
        assert joined == (*first, *message_pool[:300])
        assert any(chunk is history._chunks[0] for chunk in joined._chunks)


@settings(max_examples=150)
@given(chunk_sizes, st.data())
def test_every_slice_keeps_the_chunks_non_empty(sizes: list[int], data: st.DataObject) -> None:
    rope, model = build(sizes)
    start = data.draw(st.integers(-450, 450) | st.none())
    stop = data.draw(st.integers(-450, 450) | st.none())
    step = data.draw(st.sampled_from([None, 1, 2, -1, -2, 3]))
    piece = rope[start:stop:step]
    assert piece == model[start:stop:step]
    assert all(piece._chunks)
    assert piece._ends == tuple(accumulate(map(len, piece._chunks)))


def test_adding_a_non_message_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Messages\[0\] must be a ChatMessage"):
        Messages() + ("nope",)  # type: ignore[operator]


@pytest.mark.parametrize("bad", ["a string", {"role": "user"}, None, ("user", "hi")])
def test_messages_rejects_a_non_message_naming_the_index(bad: object) -> None:
    with pytest.raises(TypeError, match=r"Messages\[1\] must be a ChatMessage"):
        Messages([ChatMessage.user("ok"), bad])  # type: ignore[list-item]


def test_messages_takes_any_iterable() -> None:
    generated = Messages(ChatMessage.user(str(i)) for i in range(3))
    assert [m.content for m in generated] == ["0", "1", "2"]


def test_trusted_messages_wraps_without_checking() -> None:
    items = (ChatMessage.user("a"),)
    trusted = trusted_messages(items)
    assert type(trusted) is Messages
    assert trusted == items
    # trusted means "not looked at": that is the point, and the caller's promise
    assert tuple(trusted_messages(["not a message"])) == ("not a message",)  # type: ignore[list-item]


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
