"""Agent: building the stacks, what the model sees, and a run end to end."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from raf import (
    Agent,
    AgentResponse,
    AgentRunOptions,
    ChatMessage,
    ChatOptions,
    ChatRequest,
    ContextProvider,
    ContextResult,
    InMemorySession,
    Invocation,
    ProviderError,
    RequestHash,
    ScriptedChatClient,
    ToolCall,
    request_hash,
    tool,
)
from raf.errors import ToolConflictError

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


class Adds(ContextProvider):
    """A provider that contributes a fixed result."""

    def __init__(self, name: str, result: ContextResult) -> None:
        self.name = name
        self.result = result

    async def on_invoking(
        self, agent: Any, session: Any, messages: Sequence[ChatMessage], options: Any
    ) -> ContextResult:
        return self.result


def named_tool(name: str) -> Any:
    @tool(name=name)
    def impl() -> str:
        """A tool."""
        return name

    return impl


# -- construction --------------------------------------------------------------


async def test_stack_items_are_providers_or_middleware() -> None:
    async def middleware(request: Any, call_next: Any) -> AgentResponse:
        return await call_next(request)  # type: ignore[no-any-return]

    provider = Adds("p", ContextResult())
    agent = Agent(ScriptedChatClient(), stack=[provider, middleware])
    assert agent.providers == (provider,)
    assert agent.stack == (provider, middleware)


@pytest.mark.parametrize("item", [42, "a string", None, object()])
async def test_a_stack_item_that_is_neither_is_a_type_error(item: object) -> None:
    with pytest.raises(TypeError, match=r"stack\[1\] is neither a context provider"):
        Agent(ScriptedChatClient(), stack=[Adds("p", ContextResult()), item])


async def test_a_provider_in_the_chat_stack_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"chat_stack\[0\] must be middleware.*go in stack"):
        Agent(ScriptedChatClient(), chat_stack=[Adds("p", ContextResult())])
    with pytest.raises(TypeError, match=r"chat_stack\[0\] must be middleware"):
        Agent(ScriptedChatClient(), chat_stack=[42])


async def test_bad_constructor_arguments() -> None:
    with pytest.raises(TypeError, match="chat_client must have an async complete"):
        Agent(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="instructions must be a str or None"):
        Agent(ScriptedChatClient(), instructions=["be brief"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="post_timeout must be positive"):
        Agent(ScriptedChatClient(), post_timeout=0)
    with pytest.raises(TypeError, match=r"tools\[0\] is not a Tool"):
        Agent(ScriptedChatClient(), tools=["add"])  # type: ignore[list-item]


# -- tool conflicts ----------------------------------------------------------------


async def test_two_agent_tools_with_one_name_fail_at_construction() -> None:
    with pytest.raises(ToolConflictError, match="two tools are named 'search'"):
        Agent(ScriptedChatClient(), tools=[named_tool("search"), named_tool("search")])


@pytest.mark.parametrize("agent_tools", [["search"], []])
async def test_tool_conflicts_with_providers_are_raised_before_the_model_is_called(
    agent_tools: list[str],
) -> None:
    stack = [Adds("docs", ContextResult(tools=[named_tool("search")]))]
    if not agent_tools:  # provider against provider
        stack.append(Adds("web", ContextResult(tools=[named_tool("search")])))
    client = ScriptedChatClient(["never"])
    agent = Agent(client, tools=[named_tool(n) for n in agent_tools], stack=stack)
    with pytest.raises(ToolConflictError, match="'search'") as caught:
        await agent.run("go")
    assert caught.value.name == "search"
    first, second = ("the agent", "docs") if agent_tools else ("provider 'docs'", "web")
    assert f"one from {first}, one from provider '{second}'" in str(caught.value)
    assert client.requests == []


# -- what the model sees ------------------------------------------------------------


async def test_instructions_agent_first_then_providers_in_order() -> None:
    client = ScriptedChatClient(["ok"])
    agent = Agent(
        client,
        instructions="You are helpful.",
        stack=[
            Adds("a", ContextResult(instructions="From a.")),
            Adds("none", ContextResult(instructions=None)),
            Adds("empty", ContextResult(instructions="")),
            Adds("b", ContextResult(instructions="From b.\nTwo lines.")),
        ],
    )
    await agent.run("hi")
    (request,) = client.requests
    assert request.messages == (
        ChatMessage.system("You are helpful.\nFrom a.\nFrom b.\nTwo lines."),
        ChatMessage.user("hi"),
    )


@pytest.mark.parametrize("agent_instructions", [None, ""])
async def test_no_text_at_all_means_no_system_message(agent_instructions: str | None) -> None:
    client = ScriptedChatClient(["ok"])
    agent = Agent(
        client,
        instructions=agent_instructions,
        stack=[Adds("empty", ContextResult(instructions=""))],
    )
    await agent.run("hi")
    assert client.requests[0].messages == (ChatMessage.user("hi"),)


async def test_provider_instructions_alone_make_the_system_message() -> None:
    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=[Adds("a", ContextResult(instructions="Only me."))]).run("hi")
    assert client.requests[0].messages[0] == ChatMessage.system("Only me.")


async def test_injected_messages_come_before_the_request_messages() -> None:
    history = [ChatMessage.user("earlier"), ChatMessage.assistant("noted")]
    client = ScriptedChatClient(["ok"])
    agent = Agent(
        client,
        instructions="sys",
        stack=[
            Adds("history", ContextResult(messages=history)),
            Adds("facts", ContextResult(messages=[ChatMessage.system("fact")])),
        ],
    )
    request = [ChatMessage.user("now"), ChatMessage.user("and this")]
    response = await agent.run(request)
    assert client.requests[0].messages == (
        ChatMessage.system("sys"),
        *history,
        ChatMessage.system("fact"),
        *request,
    )
    # what was injected is context, not something the run produced
    assert response.messages == (ChatMessage.assistant("ok"),)


async def test_without_instructions_the_model_gets_injected_then_request_as_a_tuple() -> None:
    history = tuple(ChatMessage.user(f"m{i}") for i in range(3))
    client = ScriptedChatClient(["ok", "ok"])

    async def as_a_list(invocation: Invocation, call_next: Any) -> AgentResponse:
        # Invocation.messages is any sequence: a middleware may hand on a list.
        return await call_next(attrs.evolve(invocation, messages=list(invocation.messages)))

    injects = Adds("history", ContextResult(messages=history))
    await Agent(client, stack=[injects]).run("now")
    await Agent(client, stack=[injects, as_a_list]).run("now")
    for request in client.requests:
        assert type(request.messages) is tuple
        assert request.messages == (*history, ChatMessage.user("now"))
        assert all(sent is kept for sent, kept in zip(request.messages, history, strict=False))


async def test_options_map_into_chat_options_with_tools_agent_first() -> None:
    agent_tool, first, second = named_tool("mine"), named_tool("p1"), named_tool("p2")
    client = ScriptedChatClient(["ok"])
    agent = Agent(
        client,
        tools=[agent_tool],
        stack=[
            Adds("one", ContextResult(tools=[first])),
            Adds("two", ContextResult(tools=[second])),
        ],
    )
    options = AgentRunOptions(
        model="m-1",
        temperature=0.2,
        max_tokens=64,
        tool_choice="auto",
        extra={"seed": 7},
    )
    session = InMemorySession()
    await agent.run("hi", session=session, options=options)
    sent = client.requests[0].options
    assert sent == ChatOptions(
        model="m-1",
        temperature=0.2,
        max_tokens=64,
        tool_choice="auto",
        extra={"seed": 7},
        tools=(agent_tool, first, second),
        session_id=session.id,
    )


async def test_default_options_leave_the_choices_to_the_client() -> None:
    client = ScriptedChatClient(["ok"])
    session = InMemorySession()
    await Agent(client).run("hi", session=session)
    assert client.requests[0].options == ChatOptions(session_id=session.id)


# -- run() arguments ------------------------------------------------------------------


@pytest.mark.parametrize(
    "given",
    [
        "hello",
        ChatMessage.user("hello"),
        [ChatMessage.user("hello")],
        (ChatMessage.user("hello"),),
    ],
)
async def test_run_accepts_str_message_or_sequence(given: Any) -> None:
    client = ScriptedChatClient(["ok"])
    await Agent(client).run(given)
    assert client.requests[0].messages == (ChatMessage.user("hello"),)


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        (42, "got int"),
        (None, "got NoneType"),
        ({"role": "user", "content": "hi"}, "got dict"),
        ([ChatMessage.user("a"), "b"], r"\[1\] must be a ChatMessage"),
        (b"hi", r"\[0\] must be a ChatMessage, got int"),
    ],
)
async def test_run_rejects_anything_else(given: Any, problem: str) -> None:
    client = ScriptedChatClient(["ok"])
    with pytest.raises(TypeError, match=rf"run\(messages\).*{problem}"):
        await Agent(client).run(given)
    assert client.requests == []


async def test_run_rejects_options_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="options must be AgentRunOptions, got dict"):
        await Agent(ScriptedChatClient(["ok"])).run("hi", options={"model": "x"})  # type: ignore[arg-type]


async def test_session_none_means_a_fresh_in_memory_session_each_run() -> None:
    seen: list[Any] = []

    class Spy(ContextProvider):
        async def on_invoking(
            self, agent: Any, session: Any, messages: Any, options: Any
        ) -> ContextResult:
            seen.append(session)
            return ContextResult()

    agent = Agent(ScriptedChatClient(["one", "two", "three"]), stack=[Spy()])
    await agent.run("a")
    await agent.run("b")
    mine = InMemorySession("mine")
    await agent.run("c", session=mine)
    assert all(type(s) is InMemorySession for s in seen)
    assert seen[0] is not seen[1]
    assert seen[2] is mine
    assert len(await seen[0].get_messages()) == 0  # a bare agent stores nothing


# -- request hash -----------------------------------------------------------------------

REQUEST = [ChatMessage.user("Grüße"), ChatMessage.assistant("ok", tool_calls=[ToolCall("1", "f")])]


def independent_digest(messages: Sequence[ChatMessage]) -> str:
    rows = []
    for message in messages:
        row: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            row["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls
            ]
        rows.append(row)
    canonical = json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


async def test_touch_request_hash_is_called_with_the_request_messages() -> None:
    touched: list[tuple[ChatMessage, ...]] = []

    class Recording(InMemorySession):
        async def touch_request_hash(self, messages: Sequence[ChatMessage]) -> RequestHash:
            touched.append(tuple(messages))
            return await super().touch_request_hash(messages)

    session = Recording()
    agent = Agent(
        ScriptedChatClient(["ok"]),
        instructions="sys",
        stack=[Adds("h", ContextResult(messages=[ChatMessage.user("injected")]))],
    )
    await agent.run(REQUEST, session=session)
    assert touched == [tuple(REQUEST)]  # not the instructions, not what was injected
    assert list(await session.request_hashes()) == [independent_digest(REQUEST)]


def test_request_hash_is_stable_across_processes() -> None:
    code = (
        "import sys; from raf import ChatMessage, ToolCall, request_hash;"
        "print(request_hash([ChatMessage.user('Grüße'),"
        " ChatMessage.assistant('ok', tool_calls=[ToolCall('1', 'f')])]))"
    )
    digests = set()
    for seed in ("1", "2"):  # a different str hash seed must not matter
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        digests.add(done.stdout.strip())
    assert digests == {independent_digest(REQUEST)}
    assert request_hash(REQUEST) == independent_digest(REQUEST)


# -- middleware ----------------------------------------------------------------------------


async def test_middleware_see_the_right_request_types() -> None:
    seen: list[str] = []

    async def run_layer(request: Any, call_next: Any) -> AgentResponse:
        assert isinstance(request, Invocation)
        seen.append(f"run: {[m.content for m in request.request_messages]}")
        return await call_next(request)  # type: ignore[no-any-return]

    async def chat_layer(request: Any, call_next: Any) -> AgentResponse:
        assert isinstance(request, ChatRequest)
        seen.append(f"chat: {len(request.messages)} messages, {len(request.options.tools)} tools")
        return await call_next(request)  # type: ignore[no-any-return]

    client = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "t")), "ok"])
    agent = Agent(client, tools=[named_tool("t")], stack=[run_layer], chat_stack=[chat_layer])
    await agent.run("hi")
    # the run stack runs once per run, the chat stack once per model call
    assert seen == ["run: ['hi']", "chat: 1 messages, 1 tools", "chat: 3 messages, 1 tools"]


async def test_run_middleware_can_answer_without_the_model() -> None:
    async def cached(request: Invocation, call_next: Any) -> AgentResponse:
        return AgentResponse((ChatMessage.assistant("from cache"),))

    client = ScriptedChatClient(["never"])
    response = await Agent(client, stack=[cached, Adds("p", ContextResult())]).run("hi")
    assert response.text == "from cache"
    assert client.requests == []


async def test_chat_middleware_can_answer_or_call_twice() -> None:
    async def canned(request: ChatRequest, call_next: Any) -> AgentResponse:
        return AgentResponse((ChatMessage.assistant("canned"),))

    client = ScriptedChatClient(["never"])
    assert (await Agent(client, chat_stack=[canned]).run("hi")).text == "canned"
    assert client.requests == []

    async def second_opinion(request: ChatRequest, call_next: Any) -> AgentResponse:
        first = await call_next(request)
        second = await call_next(request)
        return AgentResponse(first.messages + second.messages)

    client = ScriptedChatClient(["one", "two"])
    response = await Agent(client, chat_stack=[second_opinion]).run("hi")
    assert [m.content for m in response.messages] == ["one", "two"]
    assert len(client.requests) == 2
    assert client.requests[0] == client.requests[1]


async def test_run_middleware_calling_twice_runs_inner_providers_twice() -> None:
    events: list[str] = []

    class Tracer(ContextProvider):
        async def on_invoking(
            self, agent: Any, session: Any, messages: Any, options: Any
        ) -> ContextResult:
            events.append("pre")
            return ContextResult(instructions="traced")

        async def on_invoked(
            self, agent: Any, session: Any, request: Any, response: Any, error: Any
        ) -> None:
            events.append(f"post {response.text}")

    async def twice(request: Invocation, call_next: Any) -> AgentResponse:
        await call_next(request)
        return await call_next(request)  # type: ignore[no-any-return]

    client = ScriptedChatClient(["first", "second"])
    response = await Agent(client, stack=[twice, Tracer()]).run("hi")
    assert response.text == "second"
    assert events == ["pre", "post first", "pre", "post second"]
    # each pass starts from the invocation the middleware got: no doubled instructions
    assert [r.messages[0].content for r in client.requests] == ["traced", "traced"]


async def test_run_middleware_can_change_the_invocation() -> None:
    async def force_model(request: Invocation, call_next: Any) -> AgentResponse:
        options = attrs.evolve(request.options, model="forced")
        return await call_next(attrs.evolve(request, options=options))  # type: ignore[no-any-return]

    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=[force_model]).run("hi", options=AgentRunOptions(model="asked"))
    assert client.requests[0].options.model == "forced"


# -- context variables -----------------------------------------------------------------

request_id: ContextVar[str] = ContextVar("request_id", default="unset")


async def test_contextvars_of_outer_layers_reach_inner_layers_client_and_tools() -> None:
    seen: dict[str, str] = {}

    async def outer(request: Invocation, call_next: Any) -> AgentResponse:
        token = request_id.set("r-42")
        try:
            return await call_next(request)  # type: ignore[no-any-return]
        finally:
            request_id.reset(token)

    class Reader(ContextProvider):
        async def on_invoking(
            self, agent: Any, session: Any, messages: Any, options: Any
        ) -> ContextResult:
            seen["provider"] = request_id.get()
            return ContextResult()

    async def chat_layer(request: ChatRequest, call_next: Any) -> AgentResponse:
        seen["chat middleware"] = request_id.get()
        return await call_next(request)  # type: ignore[no-any-return]

    def client_step(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
        seen["client"] = request_id.get()
        return "done"

    @tool
    def alone() -> str:
        """Called alone in its turn."""
        seen["single tool"] = request_id.get()
        return "ok"

    @tool
    async def pair_a() -> str:
        """Called with pair_b, in a child task."""
        seen["concurrent tool a"] = request_id.get()
        return "ok"

    @tool
    def pair_b() -> str:
        """Called with pair_a, in a child task."""
        seen["concurrent tool b"] = request_id.get()
        return "ok"

    turn = ScriptedChatClient.tool_turn
    client = ScriptedChatClient(
        [
            turn(ToolCall("1", "alone")),
            turn(ToolCall("2", "pair_a"), ToolCall("3", "pair_b")),
            client_step,
        ]
    )
    agent = Agent(
        client, tools=[alone, pair_a, pair_b], stack=[outer, Reader()], chat_stack=[chat_layer]
    )
    await agent.run("hi")
    assert seen == dict.fromkeys(
        [
            "provider",
            "chat middleware",
            "client",
            "single tool",
            "concurrent tool a",
            "concurrent tool b",
        ],
        "r-42",
    )
    assert request_id.get() == "unset"


async def test_a_contextvar_set_in_on_invoking_is_seen_further_in() -> None:
    seen: list[str] = []

    class Setter(ContextProvider):
        async def on_invoking(
            self, agent: Any, session: Any, messages: Any, options: Any
        ) -> ContextResult:
            request_id.set("from provider")
            return ContextResult()

    def step(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
        seen.append(request_id.get())
        return "ok"

    async def run_in_fresh_context() -> None:
        await Agent(ScriptedChatClient([step]), stack=[Setter()]).run("hi")

    # a task of its own, so the value set by the provider does not leak into this test
    async with anyio.create_task_group() as group:
        group.start_soon(run_in_fresh_context)
    assert seen == ["from provider"]


# -- ContextProvider as a base class --------------------------------------------------------


class Bare(ContextProvider):
    """Overrides nothing."""


class NoSuper(ContextProvider):
    def __init__(self, text: str) -> None:  # no super().__init__(): allowed
        self.text = text

    async def on_invoking(
        self, agent: Any, session: Any, messages: Any, options: Any
    ) -> ContextResult:
        return ContextResult(instructions=self.text)


class ClassAttribute(ContextProvider):
    name = "class-attr"
    kind = "custom"


class Property(ContextProvider):
    @property
    def name(self) -> str:  # type: ignore[override]
        return "from-property"

    @property
    def kind(self) -> str:  # type: ignore[override]
        return "prop-kind"


class Instance(ContextProvider):
    def __init__(self, name: str) -> None:
        self.name = name


async def test_provider_names_and_kinds() -> None:
    assert (Bare().name, Bare().kind) == ("Bare", "unknown")
    assert Bare.name == "Bare"
    assert (NoSuper("x").name, NoSuper("x").kind) == ("NoSuper", "unknown")
    assert (ClassAttribute().name, ClassAttribute().kind) == ("class-attr", "custom")
    assert (Property().name, Property().kind) == ("from-property", "prop-kind")
    assert Instance("given").name == "given"
    assert Instance("given").kind == "unknown"
    assert repr(Instance("given")) == "<Instance name='given' kind='unknown'>"


async def test_a_subclass_without_super_init_works_in_a_run() -> None:
    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=[NoSuper("no super needed"), Bare()]).run("hi")
    assert client.requests[0].messages[0] == ChatMessage.system("no super needed")


@pytest.mark.parametrize(
    ("base", "expected"),
    [(Bare, "Bare"), (ClassAttribute, "class-attr"), (Property, "from-property")],
)
async def test_provider_errors_carry_the_providers_name(base: type, expected: str) -> None:
    async def failing(self: Any, *args: Any) -> ContextResult:
        raise RuntimeError("down")

    failing_type = type(base.__name__, (base,), {"on_invoking": failing})
    with pytest.raises(ProviderError) as caught:
        await Agent(ScriptedChatClient(["never"]), stack=[failing_type()]).run("hi")
    assert caught.value.provider == expected
    assert caught.value.stage == "on_invoking"
    assert isinstance(caught.value.__cause__, RuntimeError)


async def test_a_duck_typed_provider_needs_only_on_invoking() -> None:
    class Duck:
        async def on_invoking(
            self, agent: Any, session: Any, messages: Any, options: Any
        ) -> ContextResult:
            return ContextResult(instructions="quack")

    client = ScriptedChatClient(["ok"])
    agent = Agent(client, stack=[Duck()])
    assert len(agent.providers) == 1
    await agent.run("hi")
    assert client.requests[0].messages[0].content == "quack"


async def test_the_agent_is_passed_to_providers() -> None:
    got: list[Any] = []

    class Spy(ContextProvider):
        async def on_invoking(
            self, agent: Any, session: Any, messages: Any, options: Any
        ) -> ContextResult:
            got.append((agent, tuple(messages), options))
            return ContextResult()

    options = AgentRunOptions(model="m")
    agent = Agent(ScriptedChatClient(["ok"]), name="helper", stack=[Spy()])
    await agent.run("hi", options=options)
    assert got == [(agent, (ChatMessage.user("hi"),), options)]
    assert "helper" in repr(agent)


# -- review of the core: read-only agents, mistakes caught when the agent is built -------


def test_agent_attributes_are_read_only() -> None:
    agent = Agent(ScriptedChatClient(["ok"]), tools=[named_tool("a")])
    with pytest.raises(AttributeError):
        agent.tools = (named_tool("b"),)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        agent.stack = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        agent.anything = 1  # type: ignore[attr-defined]
    assert [t.name for t in agent.tools] == ["a"]


def test_a_provider_class_instead_of_an_instance_is_refused() -> None:
    class Notes(ContextProvider):
        pass

    with pytest.raises(TypeError, match=r"stack\[0\] is the class Notes.*Notes\(\.\.\.\)"):
        Agent(ScriptedChatClient(), stack=[Notes])


def test_a_plain_def_stage_is_refused() -> None:
    class Sync(ContextProvider):
        def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:  # type: ignore[override]
            return ContextResult()

    class SyncPost(ContextProvider):
        def on_invoked(self, *args: Any) -> None:  # type: ignore[override]
            pass

    with pytest.raises(TypeError, match=r"on_invoking must be a coroutine function.*async def"):
        Agent(ScriptedChatClient(), stack=[Sync()])
    with pytest.raises(TypeError, match=r"on_invoked must be a coroutine function"):
        Agent(ScriptedChatClient(), stack=[SyncPost()])


def test_a_plain_function_in_tools_hints_at_the_decorator() -> None:
    def search(query: str) -> str:
        return query

    with pytest.raises(TypeError, match=r"tools\[0\] is not a Tool.*@raf\.tool"):
        Agent(ScriptedChatClient(), tools=[search])  # type: ignore[list-item]


async def test_a_session_that_is_not_a_session_is_refused() -> None:
    agent = Agent(ScriptedChatClient(["never"]))
    with pytest.raises(TypeError, match=r"session must be a Session.*got str 'abc'"):
        await agent.run("hi", session="abc")  # type: ignore[arg-type]


async def test_the_run_carries_the_request_hash_and_whether_it_was_seen() -> None:
    seen: list[tuple[str | None, bool]] = []

    async def watch(invocation: Invocation, call_next: Any) -> AgentResponse:
        seen.append((invocation.request_hash, invocation.repeated))
        response: AgentResponse = await call_next(invocation)
        return response

    agent = Agent(ScriptedChatClient(["one", "two", "three"]), stack=[watch])
    session = InMemorySession()
    await agent.run("hi", session=session)
    await agent.run("hi", session=session)  # the client retried the same turn
    await agent.run("other", session=session)
    digest = request_hash([ChatMessage.user("hi")])
    assert seen == [
        (digest, False),
        (digest, True),
        (request_hash([ChatMessage.user("other")]), False),
    ]


def test_run_sync_runs_one_turn_from_synchronous_code() -> None:
    assert Agent(ScriptedChatClient(["ok"])).run_sync("hi").text == "ok"


async def test_run_sync_inside_an_event_loop_says_to_await() -> None:
    with pytest.raises(RuntimeError, match=r"await agent\.run"):
        Agent(ScriptedChatClient(["ok"])).run_sync("hi")


async def test_async_with_closes_the_client_and_the_stack_items() -> None:
    closed: list[str] = []

    class Client(ScriptedChatClient):
        async def aclose(self) -> None:
            closed.append("client")

    class Closable(ContextProvider):
        async def aclose(self) -> None:
            closed.append("provider")

    async with Agent(Client(["ok"]), stack=[Closable()]) as agent:
        assert (await agent.run("hi")).text == "ok"
    assert closed == ["provider", "client"]


async def test_history_true_makes_a_session_remember_the_conversation() -> None:
    from raf import HistoryProvider

    client = ScriptedChatClient(["first", "second"])
    agent = Agent(client, history=True)
    session = InMemorySession()
    await agent.run("one", session=session)
    await agent.run("two", session=session)
    assert [m.content for m in await session.get_messages()] == ["one", "first", "two", "second"]
    assert [m.content for m in client.requests[1].messages] == ["one", "first", "two"]
    assert type(agent.stack[0]) is HistoryProvider
    with pytest.raises(TypeError, match=r"stack\[0\] is one already"):
        Agent(client, history=True, stack=[HistoryProvider()])


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_reply_with_a_lone_surrogate_does_not_break_the_conversation(
    store: str, tmp_path: Path
) -> None:
    """One rule for text entering raf: lone surrogates become U+FFFD, so every later
    turn can be hashed, stored and sent."""
    from raf import HistoryProvider, SqliteSessionStore

    client = ScriptedChatClient(["bad \ud800 reply", "fine"])
    agent = Agent(client, stack=[HistoryProvider()])
    async with SqliteSessionStore(tmp_path / "s.db") as sqlite:
        session = InMemorySession() if store == "memory" else await sqlite.get("s")
        first = await agent.run("hello \udcff", session=session)
        second = await agent.run("again", session=session)
        stored = [m.content for m in await session.get_messages()]
    assert first.text == "bad \ufffd reply"
    assert second.text == "fine"
    assert stored == ["hello \ufffd", "bad \ufffd reply", "again", "fine"]
    for text in stored:
        assert text is not None
        text.encode("utf-8")  # never raises


# Agent.replace: a changed copy ------------------------------------------------------------


async def _pass(request: Any, call_next: Any) -> Any:
    return await call_next(request)


class _Watch:
    """An observer with one hook."""

    async def run(self, invocation: Any, call_next: Any) -> Any:
        return await call_next(invocation)


@tool
def _add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _every_argument() -> dict[str, Any]:
    """A value other than the default for every argument of Agent's constructor."""
    return {
        "chat_client": ScriptedChatClient(["one", "two"]),
        "name": "helper",
        "instructions": "Be brief.",
        "tools": (_add,),
        "stack": (Adds("notes", ContextResult(instructions=("Notes.",))),),
        "chat_stack": (_pass,),
        "tool_stack": (_pass,),
        "post_timeout": 3.0,
        "history": True,
        "observers": (_Watch(),),
    }


def test_replace_carries_every_argument_of_the_constructor() -> None:
    given = _every_argument()
    # A new argument of Agent fails here until this test gives it a value: then the loop
    # below checks that replace() carries it.
    assert list(given) == list(inspect.signature(Agent).parameters)
    client = given.pop("chat_client")
    agent = Agent(client, **given)
    copy = agent.replace()
    assert copy is not agent
    for name, value in given.items():
        if name == "history":  # the provider history=True added: the same one, outermost
            assert copy.stack[0] is agent.stack[0]
            assert type(copy.stack[0]).__name__ == "HistoryProvider"
            continue
        kept = copy.stack[1:] if name == "stack" else getattr(copy, name)
        assert kept == value, name
    assert copy.chat_client is client
    assert copy.stack == agent.stack


def test_replace_changes_what_it_is_given_and_nothing_else() -> None:
    agent = Agent(ScriptedChatClient(), name="a", instructions="Be kind.", post_timeout=2.0)
    copy = agent.replace(name="b", tools=[_add])
    assert (copy.name, copy.tools, copy.instructions, copy.post_timeout) == (
        "b",
        (_add,),
        "Be kind.",
        2.0,
    )
    assert (agent.name, agent.tools) == ("a", ())  # an agent is read-only


def test_replace_keeps_one_history_provider() -> None:
    notes = Adds("notes", ContextResult())
    agent = Agent(ScriptedChatClient(), history=True)
    history = agent.stack[0]
    # A new stack goes behind the history provider, as in the constructor: not a second one.
    assert agent.replace(stack=[notes]).stack == (history, notes)
    assert agent.replace(history=True).stack == (history,)
    assert agent.replace(history=False).stack == ()
    assert agent.replace(post_timeout=1.0).replace(stack=[notes]).stack == (history, notes)
    # An agent without it gets a new one when asked.
    added = Agent(ScriptedChatClient(), stack=[notes]).replace(history=True).stack
    assert type(added[0]).__name__ == "HistoryProvider"
    assert added[1:] == (notes,)


def test_replace_refuses_an_argument_the_constructor_does_not_take() -> None:
    agent = Agent(ScriptedChatClient())
    with pytest.raises(TypeError, match="'nmae'"):
        agent.replace(nmae="typo")
    with pytest.raises(ValueError, match="post_timeout"):
        agent.replace(post_timeout=0)  # checked as the constructor checks it


async def test_a_replaced_agent_runs_its_own_pipeline() -> None:
    agent = Agent(ScriptedChatClient(["hi", "bye"]), instructions="One.", history=True)
    session = InMemorySession()
    copy = agent.replace(instructions="Two.")
    assert (await agent.run("a", session=session)).text == "hi"
    assert (await copy.run("b", session=session)).text == "bye"  # the same client, its script
    assert [m.content for m in await session.get_messages()] == ["a", "hi", "b", "bye"]
