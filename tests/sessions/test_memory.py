"""InMemorySession: history, snapshots, ids and request hashes."""

from __future__ import annotations

import hashlib
import json

import pytest

from raf import REQUEST_HASH_LIMIT, ChatMessage, InMemorySession, RequestHash, Session, request_hash

pytestmark = pytest.mark.anyio


async def test_a_new_session_is_empty() -> None:
    session = InMemorySession()
    history = await session.get_messages()
    assert history == ()
    assert type(history) is tuple
    assert await session.request_hashes() == {}


async def test_add_then_get_keeps_order_across_calls() -> None:
    session = InMemorySession()
    first = [ChatMessage.user("a"), ChatMessage.assistant("b")]
    await session.add_messages(first)
    await session.add_messages((ChatMessage.user("c"),))
    history = await session.get_messages()
    assert [m.content for m in history] == ["a", "b", "c"]
    assert type(history) is tuple


async def test_add_accepts_a_generator_and_a_tuple() -> None:
    session = InMemorySession()
    await session.add_messages(ChatMessage.user(str(i)) for i in range(2))
    await session.add_messages((ChatMessage.user("2"),))
    assert [m.content for m in await session.get_messages()] == ["0", "1", "2"]


async def test_a_bad_item_rejects_the_whole_call() -> None:
    session = InMemorySession()
    await session.add_messages([ChatMessage.user("kept")])
    with pytest.raises(
        TypeError, match=r"add_messages\(messages\)\[1\] must be a ChatMessage, got str"
    ):
        await session.add_messages([ChatMessage.user("lost?"), "not a message"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="an iterable of ChatMessage, got ChatMessage"):
        await session.add_messages(ChatMessage.user("one message, not a list"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="an iterable of ChatMessage, got str"):
        await session.add_messages("hello")  # type: ignore[arg-type]
    assert [m.content for m in await session.get_messages()] == ["kept"]


async def test_snapshot_is_shared_until_the_next_add() -> None:
    session = InMemorySession()
    await session.add_messages([ChatMessage.user("a")])
    first = await session.get_messages()
    assert await session.get_messages() is first
    await session.add_messages([])  # adding nothing changes nothing
    assert await session.get_messages() is first
    await session.add_messages([ChatMessage.user("b")])
    second = await session.get_messages()
    assert second is not first
    assert len(first) == 1  # the old snapshot is immutable, not a view
    assert len(second) == 2
    assert await session.get_messages() is second


async def test_ids() -> None:
    assert InMemorySession("s1").id == "s1"
    one, two = InMemorySession(), InMemorySession()
    assert one.id != two.id
    assert len(one.id) == 32
    int(one.id, 16)  # a uuid4 hex
    assert "s1" in repr(InMemorySession("s1"))


async def test_is_a_session() -> None:
    assert isinstance(InMemorySession(), Session)


async def test_touch_request_hash_records_and_returns_the_digest() -> None:
    session = InMemorySession()
    messages = [ChatMessage.user("hi"), ChatMessage.assistant("hello")]
    touched = await session.touch_request_hash(messages)
    canonical = json.dumps(
        [{"content": "hi", "role": "user"}, {"content": "hello", "role": "assistant"}],
        sort_keys=True,
        separators=(",", ":"),
    )
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    assert touched == RequestHash(digest, repeated=False)
    assert digest == request_hash(messages)
    recorded = await session.request_hashes()
    assert list(recorded) == [digest]
    assert isinstance(recorded[digest], float)
    # the same request again is recognised, not recorded twice
    assert await session.touch_request_hash(tuple(messages)) == RequestHash(digest, True)
    assert list(await session.request_hashes()) == [digest]
    other = await session.touch_request_hash([ChatMessage.user("bye")])
    assert other.digest != digest
    assert not other.repeated
    assert list(await session.request_hashes()) == [digest, other.digest]
    # touching a hash does not add history
    assert await session.get_messages() == ()


async def test_the_record_is_bounded() -> None:
    session = InMemorySession()
    for turn in range(3 * REQUEST_HASH_LIMIT):
        await session.touch_request_hash([ChatMessage.user(str(turn))])
    recorded = await session.request_hashes()
    assert len(recorded) == REQUEST_HASH_LIMIT
    assert next(iter(recorded)) == request_hash([ChatMessage.user(str(2 * REQUEST_HASH_LIMIT))])
