"""What each wire is sent of a history that holds compactions (for_wire): its own item from
that message on, another's summary in place of what it replaced, never a foreign item."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raf import ChatMessage, Compaction
from raf._values.compacted import SUMMARY_NOTE, for_wire

SYSTEM = ChatMessage.system("Be brief.")
OLD = [ChatMessage.user("first"), ChatMessage.assistant("one"), ChatMessage.user("second")]
THEIRS = Compaction("openai.responses", '{"type":"compaction","encrypted_content":"e"}')
OURS = Compaction("anthropic", '{"type":"compaction","content":"s"}', "what was said")


def test_a_history_without_compaction_is_sent_as_it_is() -> None:
    history = [SYSTEM, *OLD]
    assert for_wire(history, "anthropic", 2) == (history, 2)


def test_its_own_wire_gets_the_standing_prompt_and_the_history_from_the_compaction_on() -> None:
    done = ChatMessage.assistant("two", compaction=OURS)
    new = ChatMessage.user("third")
    sent, end = for_wire([SYSTEM, *OLD, done, new], "anthropic", 5)
    assert sent == [SYSTEM, done, new]
    assert end == 2  # what was history stays history, moved with the cut


def test_another_wire_gets_the_summary_in_place_of_what_the_item_replaced() -> None:
    done = ChatMessage.assistant("two", compaction=OURS)
    sent, end = for_wire([SYSTEM, *OLD, done], "gemini", None)
    assert sent == [
        SYSTEM,
        ChatMessage.system(SUMMARY_NOTE + "what was said"),
        ChatMessage.assistant("two"),
    ]
    assert all(message.compaction is None for message in sent)
    assert end is None


def test_a_foreign_item_with_no_summary_is_taken_off_and_the_history_sent_whole() -> None:
    done = ChatMessage.assistant("two", compaction=THEIRS)
    bare = ChatMessage.assistant(compaction=THEIRS)  # a compaction and nothing else
    sent, _ = for_wire([SYSTEM, *OLD, bare, done], "anthropic", None)
    assert sent == [SYSTEM, *OLD, ChatMessage.assistant("two")]


def test_the_last_usable_compaction_rules_and_later_foreign_items_go() -> None:
    first = ChatMessage.assistant("two", compaction=OURS)
    later = ChatMessage.assistant("three", compaction=THEIRS)
    sent, _ = for_wire([SYSTEM, *OLD, first, ChatMessage.user("q"), later], "anthropic", None)
    assert sent == [SYSTEM, first, ChatMessage.user("q"), ChatMessage.assistant("three")]


@given(
    before=st.integers(0, 6),
    after=st.integers(0, 4),
    source=st.sampled_from(["anthropic", "openai.responses", "gemini"]),
)
def test_no_wire_ever_gets_a_foreign_item(before: int, after: int, source: str) -> None:
    history = [
        SYSTEM,
        *(ChatMessage.user(str(n)) for n in range(before)),
        ChatMessage.assistant("a", compaction=THEIRS),
        ChatMessage.assistant("b", compaction=OURS),
        *(ChatMessage.user(str(n)) for n in range(after)),
    ]
    sent, end = for_wire(history, source, len(history))
    for message in sent:
        assert message.compaction is None or message.compaction.source == source
    assert end == len(sent)
    assert sent[0] == SYSTEM
