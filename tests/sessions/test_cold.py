"""cold_after: a window makes its next cut when the cache has expired, and stays there.

The session's last model call is data in its store: a test moves it an hour
back (``record_model_call``) instead of waiting for the cache to expire.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    CompressionProvider,
    HistoryProvider,
    InMemorySession,
    Session,
    SqliteSessionStore,
)
from raf.compression import SummaryStrategy, TokenBudgetStrategy, TruncationStrategy
from tests._harness.postgres_server import PostgresServer
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio


class Model:
    """Answers every call; records what each call sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[ChatMessage, ...]] = []

    async def complete(self, messages: Sequence[ChatMessage], options: object) -> AgentResponse:
        self.seen.append(tuple(messages))
        return AgentResponse((ChatMessage.assistant(f"answer {len(self.seen)}"),))


def texts(messages: Sequence[ChatMessage]) -> list[str]:
    return [m.content or "" for m in messages if m.role != "system"]


@asynccontextmanager
async def memory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Session]:
    yield InMemorySession()


@asynccontextmanager
async def sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Session]:
    async with SqliteSessionStore(tmp_path / "s.db") as store:
        yield await store.get("s")


@asynccontextmanager
async def redis(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Session]:
    from raf import RedisSessionStore  # the extra: only this store's rows need it

    server: RedisServer = request.getfixturevalue("redis_server")
    async with RedisSessionStore(server.url, prefix=f"cold-{uuid.uuid4().hex[:8]}") as store:
        yield await store.get("s")


@asynccontextmanager
async def postgres(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Session]:
    from raf import PostgresSessionStore  # the extra: only this store's rows need it

    server: PostgresServer = request.getfixturevalue("postgres_server")
    prefix = f"cold{uuid.uuid4().hex[:8]}"
    async with PostgresSessionStore(server.url(), prefix=prefix) as store:
        yield await store.get("s")


STORES: dict[str, Any] = {"memory": memory, "sqlite": sqlite, "redis": redis, "postgres": postgres}


@pytest.fixture(params=sorted(STORES))
async def session(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Session]:
    opened: AbstractAsyncContextManager[Session] = STORES[request.param](request, tmp_path)
    async with opened as made:
        yield made


async def cool(session: Any) -> None:
    """The session's last model call, an hour ago: the provider's cache has expired."""
    await session.record_model_call(time.time() - 3600, {})


async def test_a_cold_window_cuts_to_its_low_mark_and_stays_there(session: Session) -> None:
    model = Model()
    agent = Agent(model, stack=[HistoryProvider(max_messages=12, step=4)])
    for n in range(6):  # 10 stored, then 12: within the bound, the window holds them all
        await agent.run(f"q{n}", session=session)
    assert texts(model.seen[-1])[0] == "q0"
    await cool(session)
    await agent.run("q6", session=session)
    # The cut due next (at 13 stored), now: to the low mark, 12 - 4 = 8 messages.
    assert texts(model.seen[-1]) == texts(model.seen[-2])[4:] + ["answer 6", "q6"]
    cold = model.seen[-1]
    await agent.run("q7", session=session)  # warm: the window does not move back
    assert model.seen[-1][: len(cold)] == cold


async def test_a_warm_call_does_not_cut_early(session: Session) -> None:
    model = Model()
    agent = Agent(model, stack=[HistoryProvider(max_messages=12, step=4)])
    for n in range(5):
        await agent.run(f"q{n}", session=session)
    assert [len(call) for call in model.seen] == [1, 3, 5, 7, 9]  # each extends the last


@pytest.mark.parametrize("store", ["memory"])
async def test_cold_after_none_never_cuts_and_zero_always_cuts(store: str) -> None:
    for cold_after, sizes in ((None, [1, 3, 5, 7, 6]), (0, [1, 3, 2, 4, 3])):
        model, session = Model(), InMemorySession()
        provider = HistoryProvider(max_messages=6, step=3, cold_after=cold_after)
        agent = Agent(model, stack=[provider])
        for n in range(5):
            if n:
                await cool(session)
            await agent.run(f"q{n}", session=session)
        assert [len(call) for call in model.seen] == sizes


async def strategy_run(strategy: Any, cold: bool) -> list[str]:
    model, session = Model(), InMemorySession()
    agent = Agent(
        model, stack=[HistoryProvider(inject=False), CompressionProvider(strategy)]
    )
    for n in range(6):  # 12 stored: a window of 12 holds them all
        await agent.run(f"q{n}", session=session)
    if cold:
        await cool(session)
    await agent.run("q6", session=session)
    return texts(model.seen[-1])


async def test_every_strategy_makes_its_next_cut_when_cold() -> None:
    warm = await strategy_run(TruncationStrategy(12, step=4), cold=False)
    assert warm[0] == "q0"
    assert (await strategy_run(TruncationStrategy(12, step=4), cold=True))[0] == "q2"
    # By tokens (one message, one token): the same cut.
    def one(message: ChatMessage) -> int:
        return 1

    assert (await strategy_run(TokenBudgetStrategy(12, one, step=4), cold=False))[0] == "q0"
    assert (await strategy_run(TokenBudgetStrategy(12, one, step=4), cold=True))[0] == "q2"


class Summarizer:
    async def complete(self, messages: Sequence[ChatMessage], options: object) -> AgentResponse:
        return AgentResponse((ChatMessage.assistant("the summary"),))


async def test_a_cold_summary_strategy_summarises_now() -> None:
    strategy = SummaryStrategy(Summarizer(), keep_last=12, step=4)  # type: ignore[arg-type]
    model, session = Model(), InMemorySession()
    agent = Agent(model, stack=[HistoryProvider(inject=False), CompressionProvider(strategy)])
    for n in range(6):
        await agent.run(f"q{n}", session=session)
    await cool(session)
    await agent.run("q6", session=session)
    assert model.seen[-1][0].content == "Summary of the earlier conversation: the summary"
    assert texts(model.seen[-1])[0] == "q2"


def test_a_bad_cold_after_says_what_to_write() -> None:
    for make in (
        lambda: HistoryProvider(max_messages=4, cold_after=-1),
        lambda: TruncationStrategy(4, cold_after=float("nan")),
        lambda: CompressionProvider(TruncationStrategy(4), cold_after="5"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ValueError, match=r"cold_after must be None .* write e\.g\."):
            make()
