"""A Redis session keeps the tool results ToolOutputLimit spilled: hash {prefix}:{id}:spilled."""

from __future__ import annotations

import uuid

import coredis
import pytest

from raf import ChatMessage, RedisSessionStore
from tests._harness.redis_server import RedisServer
from tests._harness.spilling import spill_survives_restart

pytestmark = [
    pytest.mark.anyio,
    # coredis's unclosed memory streams (see tests/sessions/test_redis.py).
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in.*MemoryObject:pytest.PytestUnraisableExceptionWarning"
    ),
]


@pytest.fixture
def prefix() -> str:
    return f"spill{uuid.uuid4().hex[:8]}"


async def test_a_spilled_result_survives_a_restart(redis_server: RedisServer, prefix: str) -> None:
    found = await spill_survives_restart(lambda: RedisSessionStore(redis_server.url, prefix=prefix))
    assert "line 3000: row 2999" in found


async def test_spills_are_per_session_and_the_last_one_wins(
    redis_server: RedisServer, prefix: str
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix) as store:
        one, two = await store.get("one"), await store.get("two")
        await one.spill_tool_result("c", "first")
        await one.spill_tool_result("c", "second ✓")
        assert await one.spilled_tool_result("c") == "second ✓"
        assert await two.spilled_tool_result("c") is None


async def test_with_a_ttl_the_spills_live_as_long_as_the_session(
    redis_server: RedisServer, prefix: str
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix, ttl=3600) as store:
        session = await store.get("s")
        await session.spill_tool_result("c", "text")
        key = f"{prefix}:{{s}}:spilled"
        async with coredis.Redis.from_url(redis_server.url) as client:
            assert 0 < await client.ttl(key) <= 3600
            await client.persist(key)  # as if its ttl had run down while the session lived on
            await session.touch_request_hash([ChatMessage.user("a new run")])
            assert 0 < await client.ttl(key) <= 3600  # every run puts it on again
