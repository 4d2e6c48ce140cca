"""request_hash reuses each message's canonical JSON, and gives the digest it always gave."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import ChatMessage, request_hash
from raf.testing.strategies import chat_messages, histories


def encoded_whole(messages: Iterable[ChatMessage]) -> str:
    """The stated rule: SHA-256 of the messages' canonical JSON (their ``to_dict()``s, sorted
    keys, no spaces, UTF-8 kept), encoded at once, then hashed."""
    canonical = json.dumps(
        [m.to_dict() for m in messages], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


@settings(max_examples=60, deadline=None)
@given(history=histories(max_turns=10), more=st.lists(chat_messages(tool_traffic=True), max_size=5))
def test_the_digest_is_the_one_of_the_whole_encoding(
    history: tuple[ChatMessage, ...], more: list[ChatMessage]
) -> None:
    messages = [*history, *more]
    assert request_hash(messages) == encoded_whole(messages)
    # Again with every message's JSON cached, and as a tuple, a generator, a longer input.
    assert request_hash(tuple(messages)) == encoded_whole(messages)
    assert request_hash(m for m in messages) == encoded_whole(messages)
    grown = [*messages, ChatMessage.user("and one more")]
    assert request_hash(grown) == encoded_whole(grown)


def test_equal_messages_that_are_different_objects_hash_alike() -> None:
    one = [ChatMessage.user("caf\u00e9 \U0001f600"), ChatMessage.assistant("ok")]
    two = [ChatMessage.user("caf\u00e9 \U0001f600"), ChatMessage.assistant("ok")]
    assert request_hash(one) == request_hash(two) == encoded_whole(one)
    assert request_hash([]) == hashlib.sha256(b"[]").hexdigest()


def test_an_item_that_is_not_a_message_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"messages\[1\] must be a ChatMessage, got str"):
        request_hash([ChatMessage.user("hi"), "oops"])  # type: ignore[list-item]
