"""raf.Run, the run's own object: one per run, seen by every layer; its sink, its early
close and the post stages that failed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import pytest

import raf
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ContextProvider,
    Invocation,
    ProviderError,
    Run,
    StreamClosedError,
    Update,
)

pytestmark = pytest.mark.anyio


class Seen(ContextProvider):
    """Keeps the run each stage saw, and what its post stage got."""

    def __init__(self, name: str, *, fail_post: bool = False) -> None:
        self.name = name
        self.fail_post = fail_post
        self.errors: list[BaseException | None] = []

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        self.errors.append(error)
        if self.fail_post:
            raise OSError(f"{self.name}: disk full")


class FirstWordThenWaits:
    """A streaming model that sends one word and then waits until it is cancelled."""

    async def complete(self, messages: Sequence[ChatMessage], options: Any) -> AgentResponse:
        raise AssertionError("a streamed run calls stream()")

    async def stream(self, messages: Sequence[ChatMessage], options: Any) -> AsyncIterator[Update]:
        yield Update.of_text("Once ")
        await anyio.sleep_forever()


async def test_every_layer_sees_the_run_handed_in() -> None:
    seen: list[Run] = []

    async def middleware(invocation: Invocation, call_next: Any) -> AgentResponse:
        seen.append(invocation.run)
        response: AgentResponse = await call_next(invocation)
        return response

    updates: list[Update] = []

    async def sink(update: Update) -> None:
        updates.append(update)

    run = Run(sink)
    agent = Agent(raf.EchoChatClient(), stack=[Seen("outer"), middleware, Seen("inner")])
    response = await agent.run("hello", on_update=run)
    assert response.text == "hello"
    assert seen == [run]
    assert "".join(update.text or "" for update in updates) == "hello"
    assert run.failures == []
    assert run.closed is None


async def test_a_run_that_makes_its_own_gives_each_run_a_new_one() -> None:
    seen: list[Run] = []

    async def middleware(invocation: Invocation, call_next: Any) -> AgentResponse:
        seen.append(invocation.run)
        response: AgentResponse = await call_next(invocation)
        return response

    agent = Agent(raf.EchoChatClient(), stack=[middleware])
    await agent.run("one")
    await agent.run("two")
    assert len(seen) == 2
    assert seen[0] is not seen[1]
    assert not seen[0].streamed


async def test_closing_a_callback_run_from_another_task_is_an_early_close() -> None:
    got_one = anyio.Event()

    async def sink(update: Update) -> None:
        got_one.set()

    run = Run(sink)
    outer, inner = Seen("outer"), Seen("inner", fail_post=True)
    agent = Agent(FirstWordThenWaits(), stack=[outer, inner])  # type: ignore[arg-type]
    raised: list[BaseException] = []

    async def go() -> None:
        try:
            await agent.run("Tell me a story", on_update=run)
        except StreamClosedError as exc:
            raised.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(go)
        await got_one.wait()
        run.close(AgentResponse((ChatMessage.assistant("Once "),)))
    assert run.closed is not None
    assert raised == [run.closed]
    assert outer.errors == [run.closed]
    assert inner.errors == [run.closed]
    assert run.closed.partial.text == "Once "
    # The post stage that failed is the run's own, kept to be raised (the consumer left),
    # and a note on the close.
    assert [(failure.provider, failure.stage) for failure in run.failures] == [
        ("inner", "on_invoked")
    ]
    assert any("inner.on_invoked" in note for note in run.closed.__notes__)


async def test_after_the_close_a_send_raises_it_and_the_sink_sees_nothing() -> None:
    sent: list[Update] = []

    async def sink(update: Update) -> None:
        sent.append(update)

    run = Run(sink)
    await run.send(Update.of_text("a"))
    run.close(AgentResponse((ChatMessage.assistant("a"),)))
    with pytest.raises(StreamClosedError) as caught:
        await run.send(Update.of_text("b"))
    assert caught.value is run.closed
    assert [update.text for update in sent] == ["a"]


async def test_a_core_entered_after_the_close_raises_it_at_once() -> None:
    run = Run()
    run.close(AgentResponse())
    called: list[int] = []

    async def core() -> int:
        called.append(1)
        return 1

    with pytest.raises(StreamClosedError):
        await run.core(core)
    assert called == []


async def test_a_run_serves_one_run() -> None:
    run = Run()
    agent = Agent(raf.EchoChatClient())
    await agent.run("hi", on_update=run)
    with pytest.raises(RuntimeError, match="serves one run"):
        await agent.run("hi", on_update=run)


def test_the_failures_of_an_early_close_moved_off_the_error() -> None:
    closed = StreamClosedError(AgentResponse())
    with pytest.raises(AttributeError, match=r"invocation\.run\.failures"):
        closed.post_failures  # noqa: B018


async def test_a_failed_post_stage_on_success_is_in_the_run_and_raised() -> None:
    seen: list[Run] = []

    async def middleware(invocation: Invocation, call_next: Any) -> AgentResponse:
        seen.append(invocation.run)
        response: AgentResponse = await call_next(invocation)
        return response

    agent = Agent(raf.EchoChatClient(), stack=[middleware, Seen("audit", fail_post=True)])
    with pytest.raises(ProviderError) as caught:
        await agent.run("hi")
    assert seen[0].failures == [caught.value]


async def test_a_middlewares_state_lives_on_its_run_and_no_other() -> None:
    # A run middleware keeps per-run state in run.state; the chat middleware of the same run
    # reads it from request.invocation; a concurrent run of the same agent has its own.
    seen: dict[str, list[object]] = {}

    async def tag(invocation: raf.Invocation, call_next: Any) -> raf.AgentResponse:
        invocation.run.state["tag"] = invocation.request_messages[0].content
        await anyio.lowlevel.checkpoint()  # the other run starts meanwhile
        return await call_next(invocation)

    async def read(request: raf.ChatRequest, call_next: Any) -> raf.AgentResponse:
        assert request.invocation is not None
        tag_ = request.invocation.run.state["tag"]
        seen.setdefault(str(tag_), []).append(tag_)
        return await call_next(request)

    agent = raf.Agent(raf.EchoChatClient(), stack=[tag], chat_stack=[read])
    async with anyio.create_task_group() as group:
        for text in ("a", "b"):
            group.start_soon(agent.run, text)
    assert seen == {"a": ["a"], "b": ["b"]}
    assert raf.Run().state == {}
