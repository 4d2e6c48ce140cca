"""The laws of approvals, as hypothesis properties on every store and both backends.

Random model turns mix tools that need approval with plain ones; then a
random sequence of approve, deny, a new message, a cancelled run and an
early-closed stream. Whatever the sequence:

- each approved call runs exactly once, each denied call never runs;
- every history the model is sent is valid (each call answered, each
  result after its call);
- the stored history is valid but for the calls that wait (pending).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import raf
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    Decision,
    HistoryProvider,
    InMemorySession,
    Session,
    SqliteSessionStore,
    ToolCall,
    Update,
)
from raf.compression import check_tool_pairing
from raf.errors import ApprovalError
from tests._harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio

_ids = itertools.count()

#: A model turn: the tools it calls, "gated" (needs approval) or "plain"; () is a text answer.
turns = st.lists(st.lists(st.sampled_from(["gated", "plain"]), max_size=3), max_size=6)
OPS = ("message", "approve", "deny", "both", "replay", "cancel", "close")
ops = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 5)), min_size=1, max_size=8)


class Model:
    """Plays the drawn turns (then text) and checks every history it is sent."""

    def __init__(self, plan: Sequence[Sequence[str]]) -> None:
        self.plan = list(plan)
        self.broken: list[str] = []

    def _answer(self, messages: Sequence[ChatMessage]) -> AgentResponse:
        problem = check_tool_pairing([m for m in messages if m.role != "system"])
        if problem is not None:
            self.broken.append(problem)
        kinds = self.plan.pop(0) if self.plan else []
        calls = [ToolCall(f"c{next(_ids)}", kind, json.dumps({"n": next(_ids)})) for kind in kinds]
        if not calls:
            return AgentResponse((ChatMessage.assistant("ok"),))
        return AgentResponse((ChatMessage.assistant("calling", tool_calls=calls),))

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        return self._answer(messages)

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        for update in self._answer(messages).to_updates():
            yield update


class World:
    """The tools, what ran, and the switch that makes the next tool call hang."""

    def __init__(self) -> None:
        self.started: dict[str, int] = {}
        self.hang = False
        self.hanging = anyio.Event()

    async def run(self, call_id: str) -> str:
        self.started[call_id] = self.started.get(call_id, 0) + 1
        if self.hang:
            self.hanging.set()
            await anyio.sleep_forever()
        return "done"

    def tools(self) -> list[Any]:
        world = self

        class Gated:
            name, description = "gated", "Needs approval."
            parameters: ClassVar = {"type": "object", "properties": {"n": {"type": "integer"}}}
            approval = True

            async def invoke(self, arguments: Any) -> str:
                return await world.run(f"gated:{arguments['n']}")

        @raf.tool
        async def plain(n: int) -> str:
            """Plain."""
            return await world.run(f"plain:{n}")

        return [Gated(), plain]


@asynccontextmanager
async def memory() -> AsyncIterator[Session]:
    yield InMemorySession()


@asynccontextmanager
async def sqlite() -> AsyncIterator[Session]:
    async with SqliteSessionStore(":memory:") as store:
        yield await store.get("s")


STORES = {"memory": memory, "sqlite": sqlite}


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request: pytest.FixtureRequest) -> Any:
    if request.param != "redis":
        return STORES[request.param]
    server: RedisServer = request.getfixturevalue("redis_server")

    @asynccontextmanager
    async def redis() -> AsyncIterator[Session]:
        async with raf.RedisSessionStore(server.url, prefix=f"laws{next(_ids)}") as opened:
            yield await opened.get("s")

    return redis


def _arguments_n(call: ToolCall) -> str:
    return f"{call.name}:{call.parsed_arguments['n']}"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=turns, script=ops)
async def test_approved_calls_run_once_denied_never_and_every_history_is_valid(
    store: Any, plan: list[list[str]], script: list[tuple[str, int]]
) -> None:
    model, world = Model(plan), World()
    agent = Agent(model, tools=world.tools(), stack=[HistoryProvider(persist_partial=True)])
    approved: set[str] = set()
    denied: set[str] = set()
    used: list[str] = []
    async with store() as session:
        await agent.run("start", session=session)
        for op, pick in script:
            waiting = await session.list_pending()
            choice = waiting[pick % len(waiting)] if waiting else None
            if op == "message":
                await agent.run(f"message {pick}", session=session)
                denied |= {_arguments_n(p.call) for p in waiting}
            elif op in ("approve", "deny") and choice is not None:
                decision = Decision(choice.token, approve=op == "approve")
                await agent.run(decision, session=session)
                (approved if op == "approve" else denied).add(_arguments_n(choice.call))
                used.append(choice.token)
            elif op == "both" and len(waiting) >= 2:
                first, second = waiting[0], waiting[1]
                await agent.run(
                    [Decision(first.token, approve=True), Decision(second.token, approve=False)],
                    session=session,
                )
                approved.add(_arguments_n(first.call))
                denied.add(_arguments_n(second.call))
                used += [first.token, second.token]
            elif op == "replay" and used:
                with pytest.raises(ApprovalError):
                    await agent.run(Decision(used[pick % len(used)], approve=True), session=session)
            elif op == "cancel":
                world.hang, world.hanging = True, anyio.Event()
                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as group:
                        group.start_soon(_cancel_when, world.hanging, scope)
                        if choice is not None and pick % 2:
                            await agent.run(Decision(choice.token, approve=True), session=session)
                            approved.add(_arguments_n(choice.call))
                        else:
                            await agent.run("then cancelled", session=session)
                            denied |= {_arguments_n(p.call) for p in waiting}
                        scope.cancel()
                world.hang = False
            elif op == "close":
                async with agent.stream("closed early", session=session) as stream:
                    async for _ in stream:
                        break
                denied |= {_arguments_n(p.call) for p in waiting}
        # The laws.
        for key in approved:
            assert world.started.get(key) == 1, (key, world.started)
        for key in denied:
            assert world.started.get(key, 0) == 0, (key, world.started)
        assert all(count == 1 for count in world.started.values()), world.started
        assert model.broken == []
        history = await session.get_messages()
        waiting = await session.list_pending()
        answers = [ChatMessage.tool(p.call.id, "waiting") for p in waiting]
        assert check_tool_pairing([*history, *answers]) is None, history


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
