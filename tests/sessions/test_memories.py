"""The memory tables of the four stores (in memory, SQLite, Redis, PostgreSQL), against
real servers: the same laws for each (what a write does, namespaces that never meet)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raf import (
    InMemoryMemories,
    InMemorySessionStore,
    PostgresSessionStore,
    RedisSessionStore,
    SqliteSessionStore,
)
from raf._sessions.memories import MemoryRecord, MemoryWrite
from raf._sessions.memory_tables import memory_table
from tests._harness.postgres_server import PostgresServer
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio

STORES = ["memory", "memory-store", "sqlite", "redis", "postgres"]


@pytest.fixture(params=STORES)
async def table(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """The memory table of one store, empty (a prefix of its own on the shared servers)."""
    prefix = f"m{uuid.uuid4().hex[:10]}"
    if request.param == "memory":
        yield InMemoryMemories()
    elif request.param == "memory-store":
        yield memory_table(InMemorySessionStore())
    elif request.param == "sqlite":
        async with SqliteSessionStore(tmp_path / "memories.db") as store:
            yield memory_table(store)
    elif request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        async with RedisSessionStore(redis.url, prefix=prefix) as store:
            yield memory_table(store)
    else:
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        async with PostgresSessionStore(postgres.url(), prefix=prefix) as store:
            yield memory_table(store)


def fact(id: str, text: str, session: str | None = "s1", at: float = 1.5) -> MemoryRecord:
    return MemoryRecord(id, text, session, at)


async def test_a_namespace_starts_empty(table: Any) -> None:
    assert await table.list("alice") == ()


async def test_added_memories_come_back_in_order_with_their_provenance(table: Any) -> None:
    written = (fact("a", "likes tea"), fact("b", "lives in Lyon", None, 2.25))
    assert await table.write("alice", MemoryWrite(add=written)) == 0
    assert await table.list("alice") == written


async def test_an_update_replaces_text_and_provenance_and_keeps_its_place(table: Any) -> None:
    await table.write("alice", MemoryWrite(add=(fact("a", "likes tea"), fact("b", "has a cat"))))
    found = await table.write(
        "alice", MemoryWrite(update=(fact("a", "likes green tea", "s2", 9.0), fact("zz", "x")))
    )
    assert found == 1  # the unknown id is skipped
    assert await table.list("alice") == (
        fact("a", "likes green tea", "s2", 9.0),
        fact("b", "has a cat"),
    )


async def test_a_deletion_forgets_and_says_whether_it_found(table: Any) -> None:
    await table.write("alice", MemoryWrite(add=(fact("a", "likes tea"), fact("b", "has a cat"))))
    assert await table.write("alice", MemoryWrite(delete=("a", "nope"))) == 1
    assert [m.id for m in await table.list("alice")] == ["b"]
    assert await table.write("alice", MemoryWrite(delete=("b",))) == 1
    assert await table.list("alice") == ()


async def test_one_write_adds_updates_and_deletes_at_once(table: Any) -> None:
    await table.write("alice", MemoryWrite(add=(fact("a", "one"), fact("b", "two"))))
    write = MemoryWrite(add=(fact("c", "three"),), update=(fact("b", "2"),), delete=("a",))
    assert await table.write("alice", write) == 2
    assert [(m.id, m.text) for m in await table.list("alice")] == [("b", "2"), ("c", "three")]


async def test_an_id_added_twice_keeps_the_first(table: Any) -> None:
    await table.write("alice", MemoryWrite(add=(fact("a", "first"),)))
    await table.write("alice", MemoryWrite(add=(fact("a", "second"),)))
    assert [m.text for m in await table.list("alice")] == ["first"]


async def test_namespaces_never_read_or_change_each_other(table: Any) -> None:
    # Names that a careless key scheme would mix up: a prefix of another, separators.
    names = ["alice", "alice:", "alic", "al\x1fice", "{alice}", "alice}", "bob"]
    for name in names:
        await table.write(name, MemoryWrite(add=(fact("same-id", f"of {name}"),)))
    await table.write("alice", MemoryWrite(delete=("same-id",)))
    await table.write("bob", MemoryWrite(update=(fact("same-id", "bob's new"),)))
    assert await table.list("alice") == ()
    for name in names[1:-1]:
        assert [m.text for m in await table.list(name)] == [f"of {name}"], name
    assert [m.text for m in await table.list("bob")] == ["bob's new"]


async def test_text_of_any_kind_is_kept_as_written(table: Any) -> None:
    texts = ["émoji 🍵 and 漢字", 'quotes " and \\ and \n newline', '{"order": [1, 2], "x": 1}']
    records = tuple(fact(str(n), text) for n, text in enumerate(texts))
    await table.write("alice", MemoryWrite(add=records))
    await table.write("alice", MemoryWrite(update=(fact("2", '{"order": [9], ' + texts[2]),)))
    assert [m.text for m in await table.list("alice")] == [
        texts[0],
        texts[1],
        '{"order": [9], ' + texts[2],
    ]


@pytest.mark.parametrize("namespace", ["", "a\x00b", "x" * 513, "\ud800"])
async def test_a_namespace_no_store_can_keep_is_refused(table: Any, namespace: str) -> None:
    with pytest.raises(ValueError, match="namespace"):
        await table.list(namespace)
    with pytest.raises(ValueError, match="namespace"):
        await table.write(namespace, MemoryWrite(add=(fact("a", "x"),)))


async def test_nul_in_a_memory_is_refused_before_anything_is_written(table: Any) -> None:
    with pytest.raises(ValueError, match="NUL"):
        await table.write("alice", MemoryWrite(add=(fact("a", "ok"), fact("b", "n\x00ul"))))
    assert await table.list("alice") == ()


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "update", "delete"]),
            st.sampled_from(["a", "b", "c"]),
            st.text(min_size=1, max_size=12).filter(lambda t: "\x00" not in t),
        ),
        max_size=12,
    )
)
async def test_every_store_does_what_a_dict_does(table: Any, steps: list[Any]) -> None:
    # The law of a table: a sequence of writes leaves what the same writes leave in a dict
    # (an id added once, updated in place, deleted), in the order ids were first added.
    namespace = uuid.uuid4().hex
    model: dict[str, str] = {}
    for op, id, text in steps:
        if op == "add":
            await table.write(namespace, MemoryWrite(add=(fact(id, text),)))
            model.setdefault(id, text)
        elif op == "update":
            found = await table.write(namespace, MemoryWrite(update=(fact(id, text),)))
            assert found == (id in model)
            if id in model:
                model[id] = text
        else:
            assert await table.write(namespace, MemoryWrite(delete=(id,))) == (id in model)
            model.pop(id, None)
    assert [(m.id, m.text) for m in await table.list(namespace)] == list(model.items())
