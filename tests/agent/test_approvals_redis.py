"""The pending calls of a Redis session: ttl, foreign keys, and an entry altered in place."""

from __future__ import annotations

import hashlib
import itertools
import json
import uuid
from collections.abc import AsyncIterator

import coredis
import pytest

import raf
from raf import ChatMessage, Decision, PendingCall, RedisSessionStore, ToolCall
from raf.errors import ApprovalError, SessionStoreError
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio

_prefixes = itertools.count()


@pytest.fixture
def prefix() -> str:
    return f"approvals-{uuid.uuid4().hex[:8]}-{next(_prefixes)}"


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[coredis.Redis[bytes]]:
    async with coredis.Redis.from_url(redis_server.url) as client:
        yield client


def _pending(session_id: str, path: str = "a") -> PendingCall:
    """A pending call as the store is given it: the store keeps the token, never derives it.

    The token follows the rule of docs/approvals.md (the SHA-256 of the session id, the call
    id, the tool name and the canonical arguments); only its being unique matters here.
    """
    call = ToolCall("call_1", "delete", json.dumps({"path": path}))
    arguments = json.dumps(call.parsed_arguments, sort_keys=True, separators=(",", ":"))
    fields = json.dumps([session_id, call.id, call.name, arguments], separators=(",", ":"))
    return PendingCall(call, hashlib.sha256(fields.encode()).hexdigest())


async def test_record_and_claim_put_the_ttl_on_every_key(
    redis_server: RedisServer, prefix: str, admin: coredis.Redis[bytes]
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix, ttl=1000) as store:
        session = await store.get("s")
        pending = _pending("s")
        await session.record_pending([ChatMessage.user("q")], [pending])
        await session.touch_request_hash([ChatMessage.user("q")])
        keys = [*session.keys, f"{prefix}:{{s}}:pending"]
        assert [990 < await admin.ttl(key) <= 1000 for key in keys] == [True] * 3
        for key in keys:
            await admin.expire(key, 5)  # as if time had passed
        assert await session.list_pending() == (pending,)  # a look writes nothing
        assert [await admin.ttl(key) <= 5 for key in keys] == [True] * 3
        assert await session.claim_all_pending() == (pending,)
        assert [990 < await admin.ttl(key) <= 1000 for key in keys[:2]] == [True] * 2


async def test_a_pending_key_of_another_type_fails_and_changes_nothing(
    redis_server: RedisServer, prefix: str, admin: coredis.Redis[bytes]
) -> None:
    async with RedisSessionStore(redis_server.url, prefix=prefix) as store:
        session = await store.get("s")
        await admin.set(f"{prefix}:{{s}}:pending", "not a hash")
        with pytest.raises(SessionStoreError, match="another type"):
            await session.record_pending([ChatMessage.user("q")], [_pending("s")])
        assert await session.get_messages() == ()
        with pytest.raises(SessionStoreError, match="another type"):
            await session.claim_all_pending()


async def test_an_entry_altered_in_the_store_is_refused_and_never_runs(
    redis_server: RedisServer, prefix: str, admin: coredis.Redis[bytes]
) -> None:
    ran: list[str] = []

    @raf.tool(approval=True)
    def delete(path: str) -> str:
        """Delete."""
        ran.append(path)
        return "ok"

    turn = raf.ScriptedChatClient.tool_turn(ToolCall("call_1", "delete", '{"path": "a"}'))
    agent = raf.Agent(raf.ScriptedChatClient([turn, "done"]), tools=[delete], history=True)
    async with RedisSessionStore(redis_server.url, prefix=prefix) as store:
        session = await store.get("s")
        (pending,) = (await agent.run("go", session=session)).pending
        altered = _pending("s", "/")  # same call id, other arguments, under the old token
        entry = json.dumps({**altered.to_dict(), "token": pending.token, "order": [0, 0]})
        await admin.hset(f"{prefix}:{{s}}:pending", {pending.token: entry})
        with pytest.raises(ApprovalError, match="arguments changed"):
            await agent.run(Decision(pending.token, approve=True), session=session)
        assert ran == []
        assert raf.compression.check_tool_pairing(await session.get_messages()) is None
