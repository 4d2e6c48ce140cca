"""The merge laws, checked against a list-based model."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import AgentRunOptions, ChatMessage, ContextResult, InMemorySession, Invocation, merge
from raf.errors import ContextResultError
from raf.testing.journal import merge_model
from raf.testing.strategies import chat_messages, context_results, make_tool


def start(request: tuple[ChatMessage, ...] = (ChatMessage.user("hi"),)) -> Invocation:
    return Invocation(None, InMemorySession("s"), request, AgentRunOptions())


def fold(invocation: Invocation, results: list[ContextResult]) -> Invocation:
    for result in results:
        invocation = merge(invocation, result)
    return invocation


results_lists = st.integers(0, 8).flatmap(
    lambda n: st.tuples(*[context_results(tool_prefix=f"r{i}_") for i in range(n)]).map(list)
)


@settings(max_examples=200)
@given(results_lists, st.lists(chat_messages(), min_size=1, max_size=3))
@pytest.mark.slow
def test_merge_folds_like_the_list_model(
    results: list[ContextResult], request: list[ChatMessage]
) -> None:
    first = start(tuple(request))
    merged = fold(first, results)

    instructions, injected, tools = merge_model(results)

    assert merged.instructions == tuple(instructions)
    assert merged.messages == tuple(injected)
    assert tuple(t.name for t in merged.tools) == tools
    # The request messages and the run's identity are never touched.
    assert merged.request_messages is first.request_messages
    assert (merged.agent, merged.session, merged.options) == (
        first.agent,
        first.session,
        first.options,
    )


mixed_lists = st.integers(0, 8).flatmap(
    lambda n: st.tuples(
        *[context_results(tool_prefix=f"r{i}_", volatile=True) for i in range(n)]
    ).map(list)
)


@settings(max_examples=200)
@given(mixed_lists)
def test_volatile_results_fold_into_the_tail_and_leave_the_rest_as_the_model_says(
    results: list[ContextResult],
) -> None:
    merged = fold(start(), results)
    stable = [r for r in results if not r.volatile]
    volatile = [r for r in results if r.volatile]

    instructions, injected, _ = merge_model(stable)
    assert merged.instructions == instructions
    assert merged.messages == injected
    assert merged.tail_instructions == tuple(r.instructions for r in volatile if r.instructions)
    assert merged.tail_messages == tuple(m for r in volatile for m in r.messages)
    # Tools keep the stack order, volatile or not.
    assert tuple(t.name for t in merged.tools) == merge_model(results)[2]


def test_an_empty_volatile_result_returns_the_same_invocation() -> None:
    invocation = start()
    assert merge(invocation, ContextResult(instructions="", volatile=True)) is invocation


def test_a_volatile_result_goes_to_the_tail_not_to_the_history() -> None:
    passage = ChatMessage.user("passage")
    merged = merge(
        merge(start(), ContextResult(messages=[ChatMessage.user("old")])),
        ContextResult(instructions="Now: noon.", messages=[passage], volatile=True),
    )
    assert (merged.instructions, merged.messages) == ((), (ChatMessage.user("old"),))
    assert (merged.tail_instructions, merged.tail_messages) == (("Now: noon.",), (passage,))


def test_a_volatile_result_cannot_replace_the_history() -> None:
    result = ContextResult(messages=[ChatMessage.user("x")], replace_messages=True, volatile=True)
    with pytest.raises(ContextResultError) as info:
        merge(start(), result)
    assert info.value.field == "volatile"
    assert "replace_messages" in str(info.value)


@given(context_results())
def test_merge_never_mutates_its_input(result: ContextResult) -> None:
    first = start()
    before = (first.instructions, first.messages, first.tools)
    merge(first, result)
    assert (first.instructions, first.messages, first.tools) == before


@pytest.mark.parametrize(
    "empty",
    [
        ContextResult(),
        ContextResult(instructions=""),
        ContextResult(instructions=None, messages=[], tools=[]),
    ],
)
def test_an_empty_result_returns_the_same_invocation(empty: ContextResult) -> None:
    invocation = merge(start(), ContextResult(instructions="a", messages=[ChatMessage.user("x")]))
    assert merge(invocation, empty) is invocation


def test_replace_with_no_messages_is_not_empty_it_clears() -> None:
    invocation = merge(start(), ContextResult(messages=[ChatMessage.user("old")]))
    cleared = merge(invocation, ContextResult(replace_messages=True))
    assert cleared is not invocation
    assert cleared.messages == ()


def test_replace_then_append_builds_on_the_replacement() -> None:
    old, summary, new = (
        ChatMessage.user("old"),
        ChatMessage.system("summary"),
        ChatMessage.user("n"),
    )
    merged = fold(
        start(),
        [
            ContextResult(messages=[old]),
            ContextResult(messages=[summary], replace_messages=True),
            ContextResult(messages=[new]),
        ],
    )
    assert merged.messages == (summary, new)


def test_validated_history_is_passed_through_without_a_copy() -> None:
    history = tuple(ChatMessage.user(str(i)) for i in range(100))
    merged = merge(start(), ContextResult(messages=history))
    assert merged.messages is history
    # More providers on top do not copy it either.
    again = merge(merged, ContextResult(instructions="x", tools=[make_tool("t")]))
    assert again.messages is history


def test_a_list_is_frozen_on_merge() -> None:
    source = [ChatMessage.user("a")]
    merged = merge(start(), ContextResult(messages=source))
    source.append(ChatMessage.user("b"))
    assert merged.messages == (ChatMessage.user("a"),)


@pytest.mark.parametrize(
    ("result", "field"),
    [
        (ContextResult(instructions=b"x"), "instructions"),  # type: ignore[arg-type]
        (ContextResult(messages=ChatMessage.user("x")), "messages"),  # type: ignore[arg-type]
        (ContextResult(messages=[{"role": "user"}]), "messages[0]"),  # type: ignore[list-item]
        (ContextResult(tools="read_file"), "tools"),  # type: ignore[arg-type]
        (ContextResult(tools=[make_tool("ok"), 42]), "tools[1]"),  # type: ignore[list-item]
        (ContextResult(replace_messages="yes"), "replace_messages"),  # type: ignore[arg-type]
        (ContextResult(volatile=1), "volatile"),  # type: ignore[arg-type]
        ({"instructions": "x"}, "result"),
    ],
)
def test_wrong_types_name_the_field(result: object, field: str) -> None:
    with pytest.raises(ContextResultError) as info:
        merge(start(), result)  # type: ignore[arg-type]
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: expected")


def test_none_result_hints_at_a_missing_return() -> None:
    with pytest.raises(ContextResultError, match="forget to return"):
        merge(start(), None)  # type: ignore[arg-type]


async def _send(update: object) -> None:
    """An on_update, to see that merge carries it."""


@settings(max_examples=100)
@given(mixed_lists)
def test_merge_carries_every_field_a_provider_does_not_contribute(
    results: list[ContextResult],
) -> None:
    begin = Invocation(
        None,
        InMemorySession("s"),
        (ChatMessage.user("hi"),),
        AgentRunOptions(),
        request_hash="digest",
        repeated=True,
        on_update=_send,
    )
    merged = fold(begin, results)
    assert merged == attrs.evolve(
        begin,
        instructions=merged.instructions,
        messages=merged.messages,
        tools=merged.tools,
        tool_sources=merged.tool_sources,
        tail_instructions=merged.tail_instructions,
        tail_messages=merged.tail_messages,
        # who contributed what (the ledger reads them), contributed with the rest
        instruction_sources=merged.instruction_sources,
        message_sources=merged.message_sources,
        tail_sources=merged.tail_sources,
        tail_message_sources=merged.tail_message_sources,
    )
    assert merged.on_update is _send
    assert merged.run is begin.run  # the run's own object: one for every layer's copy
    assert (merged.request_hash, merged.repeated) == ("digest", True)
