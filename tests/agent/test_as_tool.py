"""agent.as_tool(): an agent as a tool another agent calls, isolated or forked, through real
runs on scripted models (the wire and the ledger's cache figures: test_as_tool_wire.py)."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    AgentResponse,
    AgentTool,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    HistoryProvider,
    InMemorySession,
    Run,
    ScriptedChatClient,
    ToolCall,
    ToolOutputLimit,
    Update,
    Usage,
    tool,
)
from raf.errors import StreamClosedError, ToolError
from raf.observe import ContextLedger
from tests._harness.spilling import dump

pytestmark = pytest.mark.anyio

turn = ScriptedChatClient.tool_turn


def ask(name: str, task: str, call_id: str = "c1") -> ChatMessage:
    """The parent's model turn that calls the agent tool ``name`` with ``task``."""
    return turn(ToolCall(call_id, name, json.dumps({"task": task})))


def answer(text: str, usage: Usage | None = None) -> AgentResponse:
    return AgentResponse((ChatMessage.assistant(text),), usage)


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: shipped"


class Note(ContextProvider):
    """Records how each run it is in ended, in its post stage."""

    def __init__(self, seen: list[tuple[str, Any]], label: str) -> None:
        self.seen = seen
        self.label = label

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        await anyio.lowlevel.checkpoint()  # an await that works in a post stage
        self.seen.append((self.label, error))


# Bad input: told at as_tool() --------------------------------------------------------------


def test_a_name_that_is_no_tool_name_is_refused_at_as_tool() -> None:
    agent = Agent(ScriptedChatClient(), name="researcher")
    for bad in ("", "two words", "x" * 65, "naïve", "a.b"):
        with pytest.raises(ValueError, match=r"as_tool\(name=\.\.\.\) must be a valid tool name"):
            agent.as_tool(name=bad)


def test_an_agent_with_no_usable_name_needs_one_given() -> None:
    with pytest.raises(ValueError, match=r"needs a name.*Agent\(name=\.\.\.\)"):
        Agent(ScriptedChatClient()).as_tool()
    with pytest.raises(ValueError, match=r"agent's name 'My Researcher' is not a valid tool name"):
        Agent(ScriptedChatClient(), name="My Researcher").as_tool()
    assert Agent(ScriptedChatClient(), name="My Researcher").as_tool(name="research").name == (
        "research"
    )


def test_an_unknown_context_is_refused_at_as_tool() -> None:
    agent = Agent(ScriptedChatClient(), name="researcher")
    with pytest.raises(ValueError, match=r"must be 'isolated' or 'forked', got 'shared'"):
        agent.as_tool(context="shared")
    with pytest.raises(TypeError, match=r"description=\.\.\.\) must be a str"):
        agent.as_tool(description=42)  # type: ignore[arg-type]


def test_the_tool_asks_for_a_task_and_says_what_the_child_sees() -> None:
    agent = Agent(ScriptedChatClient(), name="researcher")
    isolated, forked = agent.as_tool(), agent.as_tool(name="fork", context="forked")
    assert isinstance(isolated, AgentTool)
    assert (isolated.name, isolated.context, forked.context) == ("researcher", "isolated", "forked")
    assert isolated.parameters["required"] == ["task"]
    assert isolated.parameters["properties"]["task"]["type"] == "string"
    assert "none of this conversation" in isolated.description
    assert "reads this conversation" in forked.description
    assert agent.as_tool(description="Researches.").description == "Researches."


# Isolated ----------------------------------------------------------------------------------


async def test_an_isolated_child_sees_only_the_task_and_answers_the_call() -> None:
    child_model = ScriptedChatClient(["Paris is the capital."])
    child = Agent(child_model, name="researcher", instructions="You research.")
    parent_model = ScriptedChatClient([ask("researcher", "capital of France?"), "It is Paris."])
    parent = Agent(
        parent_model, instructions="You lead.", tools=[search, child.as_tool()], history=True
    )
    response = await parent.run("Where is the Louvre's city hall?")
    assert response.text == "It is Paris."
    (request,) = child_model.requests
    assert request.messages == (
        ChatMessage.system("You research."),
        ChatMessage.user("capital of France?"),
    )
    assert request.options.tools == ()  # the child's own tools only: none
    result = response.messages[1]
    assert (result.role, result.tool_call_id, result.content) == (
        "tool",
        "c1",
        "Paris is the capital.",
    )


async def test_the_childs_usage_is_part_of_the_callers() -> None:
    child = Agent(
        ScriptedChatClient([answer("child", Usage(7, 3, cached_input_tokens=2))]), name="r"
    )
    parent = Agent(
        ScriptedChatClient(
            [AgentResponse((ask("r", "go"),), Usage(10, 2)), answer("ok", Usage(20, 1))]
        ),
        tools=[child.as_tool()],
    )
    response = await parent.run("hi")
    assert response.usage == Usage(37, 6, cached_input_tokens=2)


async def test_a_grandchilds_usage_is_counted_once_at_every_level() -> None:
    grandchild = Agent(ScriptedChatClient([answer("gc", Usage(100, 10))]), name="searcher")
    child_model = ScriptedChatClient(
        [AgentResponse((ask("searcher", "dig"),), Usage(10, 1)), answer("child", Usage(20, 2))]
    )
    child = Agent(child_model, name="researcher", tools=[grandchild.as_tool()])
    ledger = ContextLedger()
    parent = Agent(
        ScriptedChatClient(
            [AgentResponse((ask("researcher", "go"),), Usage(1, 1)), answer("ok", Usage(2, 1))]
        ),
        tools=[child.as_tool()],
        observers=[ledger],
    )
    response = await parent.run("hi")
    assert response.usage == Usage(1 + 10 + 100 + 20 + 2, 1 + 1 + 10 + 2 + 1)
    assert [entry.agent_tool for entry in ledger.calls] == [
        None,
        "researcher",
        "researcher/searcher",
        "researcher",
        None,
    ]


async def test_the_childs_calls_are_in_the_callers_ledger_under_the_tools_name() -> None:
    child = Agent(ScriptedChatClient(["found it"]), name="researcher", instructions="Research.")
    ledger = ContextLedger()
    parent = Agent(
        ScriptedChatClient([ask("scout", "look"), "done"]),
        instructions="Lead.",
        tools=[child.as_tool(name="scout")],
        observers=[ledger],
    )
    await parent.run("hi")
    first, childs, last = ledger.calls
    assert (first.agent_tool, childs.agent_tool, last.agent_tool) == (None, "scout", None)
    assert [(part.layer, part.region) for part in childs.parts] == [
        ("agent", "system"),
        ("request", "request"),
    ]
    # The parent's next call is compared with its own previous one, not with the child's.
    assert last.broken_by is None
    assert last.shared_prefix_tokens == first.input_tokens
    assert "agent tool" in ledger.report()
    assert "scout" in ledger.report()


async def test_the_childs_failure_is_told_to_the_callers_model_and_the_run_goes_on() -> None:
    child = Agent(ScriptedChatClient([RuntimeError("model down")]), name="researcher")
    parent_model = ScriptedChatClient([ask("researcher", "go"), "I will answer myself."])
    parent = Agent(parent_model, tools=[child.as_tool()])
    response = await parent.run("hi")
    assert response.text == "I will answer myself."
    told = parent_model.requests[1].messages[-1]
    assert told.role == "tool"
    assert told.content == "Error: tool 'researcher' failed: RuntimeError: model down"


async def test_a_task_that_is_empty_is_told_to_the_callers_model() -> None:
    child_model = ScriptedChatClient()
    parent_model = ScriptedChatClient([ask("researcher", ""), "ok"])
    parent = Agent(parent_model, tools=[Agent(child_model, name="researcher").as_tool()])
    await parent.run("hi")
    told = parent_model.requests[1].messages[-1].content
    assert told is not None
    assert told.startswith("Error:")
    assert "task" in told
    assert child_model.requests == []  # the child never ran


async def test_an_agent_does_not_call_itself_down_a_chain() -> None:
    # top -> a -> b -> a: the second 'a' is refused, and b's model is told.
    a_model = ScriptedChatClient([ask("b", "go on"), "a done"])
    b_model = ScriptedChatClient([ask("a", "again"), "b done"])
    alone = Agent(a_model, name="a")
    b = Agent(b_model, name="b", tools=[alone.as_tool()])
    a = alone.replace(tools=[b.as_tool()])
    top = Agent(ScriptedChatClient([ask("a", "start"), "top done"]), tools=[a.as_tool()])
    assert (await top.run("hi")).text == "top done"
    refused = b_model.requests[1].messages[-1].content
    assert refused is not None
    assert "already running further up" in refused


async def test_invoked_outside_a_run_an_isolated_tool_runs_and_a_forked_one_refuses() -> None:
    agent = Agent(ScriptedChatClient(["alone"]), name="researcher")
    assert await agent.as_tool().invoke({"task": "go"}) == "alone"
    with pytest.raises(ToolError, match=r"runs only as the tool of an agent's run"):
        await agent.as_tool(context="forked").invoke({"task": "go"})


# Streamed ----------------------------------------------------------------------------------


async def test_streamed_the_childs_updates_reach_the_callers_consumer_tagged_with_the_call() -> (
    None
):
    child = Agent(ScriptedChatClient([["Par", "is"]]), name="researcher")
    call = ToolCall("c7", "researcher", '{"task": "capital?"}')
    parent = Agent(ScriptedChatClient([turn(call), ["It is ", "Paris."]]), tools=[child.as_tool()])
    async with parent.stream("hi") as stream:
        updates = [update async for update in stream]
    tagged = [update for update in updates if update.kind == "agent"]
    assert [update.update for update in tagged] == [Update.of_text("Par"), Update.of_text("is")]
    assert all(update.tool_call == call for update in tagged)
    assert stream.response is not None
    assert stream.response.text == "It is Paris."
    # The consumer's own assembly is the parent's answer: the child's text is not in it.
    assert AgentResponse.from_updates(updates).text == "It is Paris."
    assert [u.kind for u in updates if u.kind != "agent"] == [
        "tool_call",
        "tool_result",
        "text",
        "text",
    ]


async def test_an_agent_update_holds_an_update() -> None:
    call = ToolCall("c1", "researcher", "{}")
    assert Update.of_agent(call, Update.of_text("hi")).update == Update.of_text("hi")
    with pytest.raises(TypeError, match=r"'agent' Update needs update=Update"):
        Update("agent", tool_call=call)
    with pytest.raises(TypeError, match=r"'agent' Update needs tool_call=ToolCall"):
        Update("agent", update=Update.of_text("hi"))


# Cancelled or closed: the child closes, its post stages run ---------------------------------


async def test_a_cancelled_caller_cancels_the_child_whose_post_stages_run() -> None:
    started = anyio.Event()

    async def hang(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    seen: list[tuple[str, Any]] = []
    child = Agent(ScriptedChatClient([hang]), name="researcher", stack=[Note(seen, "child")])
    parent = Agent(
        ScriptedChatClient([ask("researcher", "go")]),
        tools=[child.as_tool()],
        stack=[Note(seen, "parent")],
    )
    async with anyio.create_task_group() as group:
        group.start_soon(parent.run, "hi")
        await started.wait()
        group.cancel_scope.cancel()
    cancelled = anyio.get_cancelled_exc_class()
    assert [label for label, _ in seen] == ["child", "parent"]
    assert all(isinstance(error, cancelled) for _, error in seen)


async def test_a_closed_caller_closes_the_child_whose_post_stages_run() -> None:
    seen: list[tuple[str, Any]] = []
    child_model = ScriptedChatClient([["first words", "then more"]])
    child = Agent(child_model, name="researcher", stack=[Note(seen, "child")])
    parent = Agent(
        ScriptedChatClient([ask("researcher", "go")]),
        tools=[child.as_tool()],
        stack=[Note(seen, "parent")],
    )
    async with parent.stream("hi") as stream:
        async for update in stream:
            if update.kind == "agent":
                break  # the consumer leaves while the child streams
    assert stream.response is None
    assert [label for label, _ in seen] == ["child", "parent"]
    child_error, parent_error = (error for _, error in seen)
    assert isinstance(parent_error, StreamClosedError)
    # The caller's close cancels its tool calls: the child is cancelled, as by a deadline.
    assert isinstance(child_error, anyio.get_cancelled_exc_class())


# Forked ------------------------------------------------------------------------------------


async def test_a_forked_childs_first_prompt_is_the_callers_last_then_its_own() -> None:
    child_model = ScriptedChatClient(["the refund is due"])
    child = Agent(child_model, name="clerk", instructions="You check one thing.", tools=[lookup])
    parent_model = ScriptedChatClient(
        [turn(ToolCall("l1", "lookup", '{"order": "7"}')), ask("clerk", "is a refund due?"), "Yes."]
    )
    parent = Agent(
        parent_model,
        name="lead",
        instructions="You lead.",
        tools=[lookup, child.as_tool(context="forked")],
        stack=[HistoryProvider()],
    )
    assert (await parent.run("My order 7 is late.")).text == "Yes."
    last = parent_model.requests[1]  # the call whose answer asked for the clerk
    (first,) = child_model.requests
    assert first.messages[: len(last.messages)] == last.messages
    assert first.messages[len(last.messages) :] == (
        ChatMessage.system("You check one thing."),
        ChatMessage.user("is a refund due?"),
    )
    assert first.options.tools == last.options.tools  # the same tools, the same order
    assert (first.options.session_id, first.options.agent_name) == (
        last.options.session_id,
        "lead",
    )  # so the OpenAI clients send the parent's prompt_cache_key
    assert first.options.history_end == len(last.messages)


async def test_a_forked_child_runs_only_its_own_tools() -> None:
    @tool
    def delete_account(user: str) -> str:
        """Delete a user's account."""
        raise AssertionError("a forked child ran a tool it was not given")

    child_model = ScriptedChatClient(
        [
            turn(
                ToolCall("d1", "delete_account", '{"user": "bob"}'),
                ToolCall("l1", "lookup", '{"order": "7"}'),
            ),
            "checked",
        ]
    )
    child = Agent(child_model, name="clerk", tools=[lookup])
    parent = Agent(
        ScriptedChatClient([ask("clerk", "check"), "ok"]),
        tools=[delete_account, lookup, child.as_tool(context="forked")],
    )
    await parent.run("hi")
    refused, looked_up = child_model.requests[1].messages[-2:]
    assert refused.content is not None
    assert "may not call it" in refused.content
    assert looked_up.content == "order 7: shipped"
    # Its own tools after the parent's: none here (lookup is the parent's too).
    assert [t.name for t in child_model.requests[0].options.tools] == [
        "delete_account",
        "lookup",
        "clerk",
    ]


async def test_a_forked_childs_own_tools_come_after_the_parents() -> None:
    child_model = ScriptedChatClient(["ok"])
    child = Agent(child_model, name="clerk", tools=[search])
    parent = Agent(
        ScriptedChatClient([ask("clerk", "check"), "ok"]),
        tools=[lookup, child.as_tool(context="forked")],
    )
    await parent.run("hi")
    assert [t.name for t in child_model.requests[0].options.tools] == ["lookup", "clerk", "search"]


async def test_a_forked_childs_tool_with_a_parents_name_and_another_schema_conflicts() -> None:
    @tool(name="lookup")
    def other_lookup(order: int, deep: bool) -> str:
        """Another lookup."""
        return "x"

    child = Agent(ScriptedChatClient(), name="clerk", tools=[other_lookup])
    parent_model = ScriptedChatClient([ask("clerk", "check"), "ok"])
    parent = Agent(parent_model, tools=[lookup, child.as_tool(context="forked")])
    await parent.run("hi")
    told = parent_model.requests[1].messages[-1].content
    assert told is not None
    assert "ToolConflictError" in told
    assert "'lookup'" in told


async def test_the_ledger_shows_the_forked_childs_first_call_served_from_the_parents_prefix() -> (
    None
):
    child = Agent(ScriptedChatClient(["a", "b"]), name="clerk", instructions="Check one thing.")
    ledger = ContextLedger()
    parent = Agent(
        ScriptedChatClient([ask("clerk", "check"), ask("clerk", "again", "c2"), "done"]),
        instructions="You lead.",
        tools=[lookup, child.as_tool(context="forked")],
        stack=[HistoryProvider()],
        observers=[ledger],
    )
    await parent.run("My order 7 is late.")
    first, child_one, second, child_two, last = ledger.calls
    assert [e.agent_tool for e in ledger.calls] == [None, "clerk", None, "clerk", None]
    for parent_call, child_call in ((first, child_one), (second, child_two)):
        # All of the parent's last prompt, as its own parts, then the child's.
        parent_parts = [p for p in child_call.parts if p.layer == "parent"]
        assert [(p.region, p.tokens) for p in parent_parts] == [
            (p.region, p.tokens) for p in parent_call.parts
        ]
        assert child_call.parts[: len(parent_parts)] == tuple(parent_parts)
        assert child_call.shared_prefix_tokens == parent_call.input_tokens
        assert child_call.broken_by is None
    # The parent goes on from its own previous call: not broken by its children.
    assert second.broken_by is None
    assert last.broken_by is None
    assert second.shared_prefix_tokens == first.input_tokens


async def test_an_instrumented_childs_spans_nest_in_the_callers_tool_call() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import raf.otel

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    child = raf.otel.instrument(
        Agent(ScriptedChatClient(["found"]), name="researcher"), tracer_provider=provider
    )
    parent = raf.otel.instrument(
        Agent(
            ScriptedChatClient([ask("researcher", "go"), "ok"]),
            name="lead",
            tools=[child.as_tool()],
        ),
        tracer_provider=provider,
    )
    await parent.run("hi")
    spans = {span.name: span for span in exporter.get_finished_spans()}
    tool_span, child_run = spans["execute_tool researcher"], spans["invoke_agent researcher"]
    assert child_run.parent is not None
    assert child_run.parent.span_id == tool_span.context.span_id
    # raf.otel's observer is the caller's own: it drew none of the child's work as the lead's.
    assert [name for name in spans if name.startswith("invoke_agent")] == [
        "invoke_agent researcher",
        "invoke_agent lead",
    ]


class Rules(ContextProvider):
    """Stable instructions, and a tool of its own."""

    async def on_invoking(  # type: ignore[no-untyped-def]
        self, agent, session, messages, options
    ) -> ContextResult:
        return ContextResult(instructions="Refunds within 30 days.", tools=[search])


class Clock(ContextProvider):
    """Volatile instructions: the tail."""

    async def on_invoking(  # type: ignore[no-untyped-def]
        self, agent, session, messages, options
    ) -> ContextResult:
        return ContextResult(instructions="It is noon.", volatile=True)


@settings(max_examples=40, deadline=None)
@given(
    history=st.integers(0, 4),
    lookups=st.integers(0, 2),
    rules=st.booleans(),
    clock=st.booleans(),
    child_instructions=st.sampled_from([None, "Check one thing."]),
    child_tools=st.booleans(),
)
async def test_law_a_forked_childs_prompt_extends_its_callers_last_and_the_ledger_says_so(
    history: int,
    lookups: int,
    rules: bool,
    clock: bool,
    child_instructions: str | None,
    child_tools: bool,
) -> None:
    child_model = ScriptedChatClient(["checked"])
    child = Agent(
        child_model,
        name="clerk",
        instructions=child_instructions,
        tools=[lookup] if child_tools else [],
    )
    steps: list[Any] = [
        turn(ToolCall(f"l{n}", "lookup", json.dumps({"order": str(n)}))) for n in range(lookups)
    ]
    parent_model = ScriptedChatClient([*steps, ask("clerk", "check"), "done"])
    ledger = ContextLedger()
    session = InMemorySession()
    await session.add_messages(
        [
            ChatMessage.user(f"q{n}") if n % 2 == 0 else ChatMessage.assistant(f"a{n}")
            for n in range(history)
        ]
    )
    stack: list[Any] = [HistoryProvider()]
    stack += [Rules()] if rules else []
    stack += [Clock()] if clock else []
    parent = Agent(
        parent_model,
        name="lead",
        instructions="You lead.",
        tools=[lookup, child.as_tool(context="forked")],
        stack=stack,
        observers=[ledger],
    )
    assert (await parent.run("My order is late.", session=session)).text == "done"
    last = parent_model.requests[-2]
    (first,) = child_model.requests
    n = len(last.messages)
    assert first.messages[:n] == last.messages
    assert first.options.tools == last.options.tools  # the child's tools are the caller's
    assert first.messages[n:][-1] == ChatMessage.user("check")
    entries = {entry.agent_tool: entry for entry in ledger.calls}
    parent_entry = ledger.calls[-3]
    child_entry = entries["clerk"]
    assert child_entry.shared_prefix_tokens == parent_entry.input_tokens
    assert child_entry.broken_by is None
    assert ledger.calls[-1].broken_by is None


async def test_a_run_lets_go_of_its_last_model_call_so_it_leaves_no_cycle() -> None:
    # What a forked child starts from (run.last_call) holds the invocation, which holds the
    # run: kept past the run, every run would be garbage only the cycle collector finds.
    agent = Agent(ScriptedChatClient([turn(ToolCall("l1", "lookup", '{"order": "7"}')), "ok"]))
    agent = agent.replace(tools=[lookup])
    gc.collect()
    gc.disable()
    try:
        run = Run(None)
        gone = weakref.ref(run)
        await agent.run("hi", on_update=run)
        assert run.last_call is None
        del run
        assert gone() is None
    finally:
        gc.enable()


async def test_a_forked_child_reads_back_a_result_its_caller_cut_and_kept() -> None:
    # The caller's prompt holds a result ToolOutputLimit cut (its marker names call_big);
    # the forked child, which sees that prompt, reads the full text back as the caller could.
    turn = ScriptedChatClient.tool_turn
    read = json.dumps({"call_id": "call_big", "pattern": "^row 2999$"})
    seen: list[str | None] = []

    async def capture(request: Any, call_next: Any) -> Any:
        result = await call_next(request)
        seen.append(result.content)
        return result

    child = Agent(
        ScriptedChatClient([turn(ToolCall("r1", "read_tool_result", read)), "row 2999 it is"]),
        name="helper",
        tool_stack=[capture, ToolOutputLimit(1000)],
    )
    helper = child.as_tool(context="forked")
    ask = ToolCall("h1", helper.name, json.dumps({"task": "find the last row"}))
    parent = Agent(
        ScriptedChatClient([turn(ToolCall("call_big", "dump", "{}")), turn(ask), "done"]),
        tools=[dump, helper],
        tool_stack=[ToolOutputLimit(1000)],
    )
    await parent.run("go", session=InMemorySession("p"))
    assert seen[0] is not None
    assert "line 3000: row 2999" in seen[0]
