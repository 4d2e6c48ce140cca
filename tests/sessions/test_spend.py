"""Spending budgets counted in every store (memory, SQLite, Redis, PostgreSQL): another
SpendLimits on the same store sees the spending, and two real processes never both spend a
budget's last cent."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest

from raf import (
    Agent,
    AgentResponse,
    Budget,
    BudgetExceeded,
    ChatMessage,
    ChatOptions,
    Prices,
    ScriptedChatClient,
    SpendLimits,
    SqliteSessionStore,
    Usage,
)
from raf.errors import ConfigError
from tests._harness.postgres_server import PostgresServer
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
PRICES = Prices(overrides={"house": {"input": 1000, "output": 1000}})  # $0.001 a token


def agent(limits: SpendLimits, calls: int = 5) -> Agent:
    def step(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        return AgentResponse((ChatMessage.assistant("ok"),), Usage(10, 0))  # $0.01

    client = ScriptedChatClient([step] * calls)
    client.model = "house"  # type: ignore[attr-defined]
    client.count_tokens = lambda messages, tools=(): 10  # type: ignore[attr-defined]
    return Agent(client, name=f"agent-{uuid.uuid4().hex}", chat_stack=[limits])


@pytest.fixture(params=["sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "spend.db")
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        yield server.url
    else:
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        yield postgres.url()


async def test_two_limits_on_one_store_share_the_budget(store_url: str) -> None:
    budget = Budget("0.02", "hour", "agent")
    async with (
        SpendLimits(budget, store=store_url, prices=PRICES) as first,
        SpendLimits(budget, store=store_url, prices=PRICES) as second,  # another process's
    ):
        one = agent(first)
        await one.run("hi")
        await one.replace(chat_stack=[second]).run("hi")
        with pytest.raises(BudgetExceeded) as caught:
            await one.run("hi")
        assert str(caught.value.spent) == "0.02"


async def test_sqlite_and_postgres_urls_open_on_the_first_call(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    for url in (str(tmp_path / "spend.db"), postgres_server.url()):
        limits = SpendLimits(Budget("0.01", "day", "agent"), store=url, prices=PRICES)
        one = agent(limits)
        await one.run("hi")
        with pytest.raises(BudgetExceeded):
            await one.run("hi")
        await one.aclose()  # closes the store the limits opened


async def test_a_redis_url_must_be_opened_first(redis_server: RedisServer) -> None:
    limits = SpendLimits(Budget("0.01", "day"), store=redis_server.url, prices=PRICES)
    with pytest.raises(ConfigError, match="open the Redis store before the first call"):
        await agent(limits).run("hi")


async def test_a_store_given_as_an_object_is_its_owners(tmp_path: Path) -> None:
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        limits = SpendLimits(Budget("0.01", "day", "agent"), store=store, prices=PRICES)
        one = agent(limits)
        await one.run("hi")
        with pytest.raises(BudgetExceeded):
            await one.run("hi")
        await limits.aclose()  # leaves the store open
        assert await store.session_ids() == []


async def test_a_given_redis_and_postgres_store_count_too(
    redis_server: RedisServer, postgres_server: PostgresServer
) -> None:
    from raf._sessions.postgres import PostgresSessionStore
    from raf._sessions.redis import RedisSessionStore

    async with (
        RedisSessionStore(redis_server.url) as redis,
        PostgresSessionStore(postgres_server.url()) as postgres,
    ):
        for store in (redis, postgres):
            limits = SpendLimits(Budget("0.01", "day", "agent"), store=store, prices=PRICES)
            one = agent(limits)
            await one.run("hi")
            with pytest.raises(BudgetExceeded):
                await one.run("hi")


def race(store: str) -> list[str]:
    """Two processes, each one call of $0.01, for a budget of $0.01: what each got."""
    argv = [sys.executable, "-m", "tests._harness.spend_worker", store, uuid.uuid4().hex]
    workers = [
        subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().strip() == "ready"
        for worker in workers:  # both connected: the start, as close together as can be
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outcomes = [worker.communicate(timeout=60)[0].strip() for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [worker.returncode for worker in workers] == [0, 0]
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_two_processes_never_both_spend_the_last_cent(store_url: str) -> None:
    for _ in range(3):
        outcomes = await anyio.to_thread.run_sync(race, store_url)
        assert sorted(outcomes) == ["refused", "sent"]
