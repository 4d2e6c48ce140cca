"""compose used directly: providers, groups and middleware mixed; retries; contextvars."""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    InMemorySession,
    Invocation,
    ProviderError,
    ScriptedChatClient,
    ToolCall,
    compose,
    parallel,
    tool,
)

pytestmark = pytest.mark.anyio


class Logged(ContextProvider):
    """Adds its name as instructions; logs both stages; its post stage may fail."""

    def __init__(self, name: str, log: list[Any], *, fail_post: bool = False) -> None:
        self.name = name
        self.log = log
        self.fail_post = fail_post

    async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
        self.log.append(("pre", self.name))
        return ContextResult(instructions=self.name)

    async def on_invoked(
        self, agent: Any, session: Any, request: Any, response: Any, error: Any
    ) -> None:
        self.log.append(("post", self.name, type(error).__name__ if error else "ok"))
        if self.fail_post:
            raise OSError(f"{self.name}: disk full")


def invocation() -> Invocation:
    return Invocation(None, InMemorySession(), (ChatMessage.user("hi"),), AgentRunOptions())


async def test_compose_without_an_agent_mixes_providers_groups_and_middleware() -> None:
    log: list[Any] = []

    async def core(request: Invocation) -> AgentResponse:
        log.append(("core", request.instructions))
        return AgentResponse((ChatMessage.assistant("done"),))

    def middleware(name: str) -> Any:
        async def layer(request: Invocation, call_next: Any) -> AgentResponse:
            log.append(("mw", name, request.instructions))
            response: AgentResponse = await call_next(request)
            log.append(("mw-out", name))
            return response

        return layer

    run = compose(
        core,
        [
            Logged("a", log),
            middleware("m1"),
            Logged("b", log),
            parallel(Logged("c", log), Logged("d", log)),
            Logged("e", log),
            middleware("m2"),
        ],
    )
    response = await run(invocation())
    assert response.text == "done"
    pre_cd = {log[3], log[4]}
    assert pre_cd == {("pre", "c"), ("pre", "d")}
    assert log[:3] + log[5:] == [
        ("pre", "a"),
        ("mw", "m1", ("a",)),
        ("pre", "b"),
        ("pre", "e"),
        ("mw", "m2", ("a", "b", "c", "d", "e")),
        ("core", ("a", "b", "c", "d", "e")),
        ("mw-out", "m2"),
        ("post", "e", "ok"),
        ("post", "d", "ok"),
        ("post", "c", "ok"),
        ("post", "b", "ok"),
        ("mw-out", "m1"),
        ("post", "a", "ok"),
    ]


async def test_a_retrying_middleware_gives_every_attempt_its_post_stages() -> None:
    """Each attempt is a full trip through the inner layers.

    The first attempt's inner post stage saw the model's error and failed (a
    note on that error, which the middleware handled by retrying). The retry
    succeeded but its inner post stage failed too: that failure does not
    change what the layers outside see (the middleware and the outer
    provider get the response); the run raises it once every post stage ran.
    No stale failure of the first attempt surfaces after the retry.
    """
    log: list[Any] = []

    async def retry_once(request: Invocation, call_next: Any) -> AgentResponse:
        try:
            response: AgentResponse = await call_next(request)
        except RuntimeError as error:
            log.append(("retrying", [n.split(" (cause")[0] for n in error.__notes__]))
            response = await call_next(request)
        return response

    client = ScriptedChatClient([RuntimeError("flaky"), "fine"])
    agent = Agent(
        client, stack=[Logged("outer", log), retry_once, Logged("inner", log, fail_post=True)]
    )
    with pytest.raises(ProviderError) as caught:
        await agent.run("hi")
    assert log == [
        ("pre", "outer"),
        ("pre", "inner"),
        ("post", "inner", "RuntimeError"),
        (
            "retrying",
            [
                "raf: while this propagated, context provider inner.on_invoked failed: "
                "OSError: inner: disk full"
            ],
        ),
        ("pre", "inner"),
        ("post", "inner", "ok"),
        ("post", "outer", "ok"),
    ]
    assert len(client.requests) == 2
    error = caught.value
    assert (error.provider, error.stage) == ("inner", "on_invoked")
    assert not getattr(error, "__notes__", [])


async def test_a_post_stage_failure_does_not_change_what_a_middleware_outside_sees() -> None:
    """A middleware around a provider whose post stage fails gets the response; the run
    raises the failure once every post stage has run (design.md, "Error and cancellation
    rules")."""
    seen: list[str] = []

    async def watch(request: Invocation, call_next: Any) -> AgentResponse:
        try:
            response: AgentResponse = await call_next(request)
        except ProviderError as error:
            seen.append(f"error {error.provider}")
            raise
        seen.append("ok")
        return response

    log: list[Any] = []
    agent = Agent(
        ScriptedChatClient(["fine"]),
        stack=[watch, Logged("a", log), Logged("b", log, fail_post=True)],
    )
    with pytest.raises(ProviderError) as caught:
        await agent.run("hi")
    assert seen == ["ok"]
    assert caught.value.provider == "b"
    # The provider next to the failing one, inside the same middleware, got the response.
    assert ("post", "a", "ok") in log


async def test_a_retry_whose_attempts_all_succeed_returns_the_response() -> None:
    log: list[Any] = []

    async def twice(request: Invocation, call_next: Any) -> AgentResponse:
        await call_next(request)
        response: AgentResponse = await call_next(request)
        return response

    agent = Agent(ScriptedChatClient(["one", "two"]), stack=[twice, Logged("p", log)])
    response = await agent.run("hi")
    assert response.text == "two"
    assert log == [("pre", "p"), ("post", "p", "ok")] * 2


current: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="unset")


async def test_contextvars_set_outside_reach_inner_layers_the_model_and_the_tools() -> None:
    seen: dict[str, str] = {}

    class Sets(ContextProvider):
        async def on_invoking(self, *args: Any) -> ContextResult:
            current.set("outer provider")
            return ContextResult()

    class Reads(ContextProvider):
        def __init__(self, name: str) -> None:
            self.name = name

        async def on_invoking(self, *args: Any) -> ContextResult:
            seen[self.name] = current.get()
            return ContextResult()

    class SetsInGroup(ContextProvider):
        async def on_invoking(self, *args: Any) -> ContextResult:
            current.set("group member")  # a child task's copy: not seen outside the group
            return ContextResult()

    async def middleware(request: Invocation, call_next: Any) -> AgentResponse:
        seen["middleware"] = current.get()
        response: AgentResponse = await call_next(request)
        return response

    def reader(name: str) -> Any:
        async def read() -> str:
            seen[name] = current.get()
            return name

        read.__name__ = name
        read.__doc__ = f"Reads the context ({name})."
        return tool(read)

    async def model(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
        seen["model"] = current.get()
        return "done"

    turn = ScriptedChatClient.tool_turn(ToolCall("1", "tool_a"), ToolCall("2", "tool_b"))
    agent = Agent(
        ScriptedChatClient([turn, model]),
        tools=[reader("tool_a"), reader("tool_b")],
        stack=[
            Sets(),
            Reads("same layer"),
            middleware,
            parallel(SetsInGroup(), Reads("group")),
            Reads("after the group"),
        ],
    )

    # In a child task, which runs in a copy of the context: nothing leaks into the test's.
    async with anyio.create_task_group() as group:
        group.start_soon(agent.run, "hi")
    assert current.get() == "unset"
    assert seen == dict.fromkeys(
        ["same layer", "middleware", "group", "after the group", "tool_a", "tool_b", "model"],
        "outer provider",
    )


async def test_concurrent_runs_with_different_options_each_get_their_own() -> None:
    """The agent's cached chat options never leak from one run into another."""
    seen: dict[str, str | None] = {}
    both_started = anyio.Event()
    started: list[str] = []

    async def model(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
        text = messages[-1].content or ""
        started.append(text)
        if len(started) == 2:
            both_started.set()
        await both_started.wait()
        seen[text] = options.model
        return text

    agent = Agent(ScriptedChatClient([model, model, model]))
    fast, large = AgentRunOptions(model="fast"), AgentRunOptions(model="large")
    with anyio.fail_after(5):  # a deadlock guard
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: agent.run("a", options=fast))
            group.start_soon(lambda: agent.run("b", options=large))
    await agent.run("c", options=fast)
    assert seen == {"a": "fast", "b": "large", "c": "fast"}
