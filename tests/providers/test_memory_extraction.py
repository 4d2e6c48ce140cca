"""The consolidation of an extractor's answer: laws over any stored memories and any answer."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from raf._providers._memory_extraction import (
    MAX_FACT,
    changes_spec,
    consolidated,
    normal,
    shown,
    transcript,
)
from raf._sessions.memories import MemoryRecord
from raf._values.messages import ChatMessage

WORDS = st.sampled_from(["tea", "Tea", "TEA.", "cat", "cat ", "a  cat", "bike", "jazz", ""])
FACTS = st.lists(WORDS, min_size=1, max_size=3).map(" ".join)


@st.composite
def cases(draw: Any) -> tuple[list[MemoryRecord], set[str], Any]:
    """Stored memories (no fact twice, as consolidation keeps them), the ids shown, and
    an answer naming shown, unshown and made-up ids."""
    texts = draw(st.lists(FACTS, max_size=6, unique_by=normal))
    stored = [MemoryRecord(f"m{n}", t, "s", 1.0) for n, t in enumerate(texts) if t.strip()]
    ids = [r.id for r in stored]
    shown_ids = set(draw(st.lists(st.sampled_from(ids), unique=True))) if ids else set()
    some_id = st.sampled_from([*ids, "made-up"])
    data = {
        "add": draw(st.lists(FACTS, max_size=4)),
        "update": [
            {"id": id, "text": text}
            for id, text in draw(st.lists(st.tuples(some_id, FACTS), max_size=4))
        ],
        "delete": draw(st.lists(some_id, max_size=3)),
    }
    answer = changes_spec().validate(json.dumps(data))
    return stored, shown_ids, answer


def applied(stored: list[MemoryRecord], write: Any) -> dict[str, str]:
    """What a table holds after ``write`` (the tables' own law: tests/sessions)."""
    kept = {r.id: r.text for r in stored}
    for record in write.update:
        if record.id in kept:
            kept[record.id] = record.text
    for id in write.delete:
        kept.pop(id, None)
    for record in write.add:
        kept.setdefault(record.id, record.text)
    return kept


@settings(max_examples=300, deadline=None)
@given(cases())
def test_consolidation_keeps_no_fact_twice_and_touches_only_what_was_shown(case: Any) -> None:
    stored, shown_ids, answer = case
    write, _ = consolidated(answer, stored, shown_ids, "s2")
    after = applied(stored, write)
    # No fact is kept twice.
    forms = [normal(text) for text in after.values()]
    assert len(forms) == len(set(forms))
    # A memory the model was not shown is neither changed nor deleted.
    for record in stored:
        if record.id not in shown_ids:
            assert after.get(record.id) == record.text
    # Every new fact the answer gave (not empty, not too long) is said by some memory.
    for fact in answer.add:
        if fact.strip() and len(fact.strip()) <= MAX_FACT:
            assert normal(fact.strip()) in forms
    # New memories have fresh ids, with the session that made them.
    assert {r.id for r in write.add}.isdisjoint(r.id for r in stored)
    assert all(r.session_id == "s2" for r in (*write.add, *write.update))


def test_a_request_shows_at_most_two_hundred_memories_the_most_relevant_first() -> None:
    stored = [MemoryRecord(f"m{n}", f"filler fact {n}", None, 0.0) for n in range(300)]
    stored[5] = MemoryRecord("m5", "The user plays the oboe.", None, 0.0)
    picked = shown(stored, "user: I practised the oboe today")
    assert len(picked) == 200
    assert stored[5] in picked
    assert stored[-1] in picked  # then the newest
    assert [r.id for r in picked] == sorted((r.id for r in picked), key=lambda i: int(i[1:]))


def test_the_transcript_quotes_each_message_briefly_and_the_newest_when_long() -> None:
    long = "x" * 5000
    text = transcript(
        [ChatMessage.system("rules"), ChatMessage.user(long), ChatMessage.assistant("ok")]
    )
    assert "rules" not in text
    assert "x" * 2000 + " [...]" in text
    assert text.endswith("assistant: ok")
    many = [ChatMessage.user(f"{n} " + "y" * 1900) for n in range(40)]
    kept = transcript(many)
    assert len(kept) <= 24_000
    assert kept.endswith("y" * 1900)
    assert kept.startswith("user: 28 ")  # the oldest went first: twelve are kept
