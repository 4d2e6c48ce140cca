"""Guardrails: the streamed output law (hypothesis), and each guardrail's block and rewrite."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raf
from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    GuardrailContext,
    GuardrailError,
    InputGuardrail,
    OutputGuardrail,
    ScriptedChatClient,
    ToolCall,
    ToolGuardrail,
    Update,
    Verdict,
    pii_redactor,
    tool,
)
from raf.observe import StageEvent, TraceObserver

pytestmark = pytest.mark.anyio

SPAN = "FORBIDDEN"


class Paced:
    """A model whose stream is ``chunks``; before each chunk it records how far the
    consumer lags behind what it sent, and it notes whether it was closed early."""

    def __init__(self, chunks: Sequence[str], received: list[str]) -> None:
        self.chunks = list(chunks)
        self.received = received
        self.lags: list[int] = []
        self.yielded = 0
        self.closed_early = False

    async def complete(self, messages: Any, options: ChatOptions) -> AgentResponse:
        raise AssertionError("a streamed run calls stream()")

    async def stream(self, messages: Any, options: ChatOptions) -> AsyncIterator[Update]:
        sent = 0
        try:
            for chunk in self.chunks:
                self.lags.append(sent - len("".join(self.received)))
                yield Update("text", chunk)
                self.yielded += 1
                sent += len(chunk)
            self.lags.append(sent - len("".join(self.received)))
        except GeneratorExit:
            self.closed_early = True
            raise


async def no_span(text: str, context: GuardrailContext) -> Verdict:
    return Verdict.block("the forbidden word") if SPAN in text else Verdict.allow()


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


async def streamed(agent: Agent, received: list[str]) -> AgentResponse:
    async def on_update(update: Update) -> None:
        if update.kind == "text":
            received.append(update.text)

    return await agent.run("go", on_update=on_update)


words = st.text(alphabet="abcdefghij", min_size=1, max_size=8)
separators = st.sampled_from([" ", " ", " ", ". ", "\n"])


@st.composite
def answers_with_a_span(draw: st.DrawFn) -> tuple[str, int, bool]:
    """An answer of words with the forbidden word somewhere: (text, where it starts,
    whether a sentence ends right before it)."""
    before = draw(st.lists(st.tuples(words, separators), max_size=30))
    after = draw(st.lists(st.tuples(separators, words), max_size=10))
    head = "".join(word + separator for word, separator in before)
    text = head + SPAN + "".join(separator + word for separator, word in after)
    sentence = not head or head.endswith((". ", "\n"))
    return text, len(head), sentence


@settings(max_examples=150, deadline=None)
@given(answers_with_a_span(), st.lists(st.integers(0, 400), max_size=40), st.integers(20, 80))
async def test_a_blocked_span_never_reaches_the_consumer(
    answer: tuple[str, int, bool], cuts: list[int], hold_back: int
) -> None:
    text, start, after_sentence = answer
    received: list[str] = []
    model = Paced(chunked(text, cuts), received)
    agent = Agent(model, chat_stack=[OutputGuardrail(no_span, hold_back=hold_back)])
    with pytest.raises(GuardrailError) as caught:
        await streamed(agent, received)
    seen = "".join(received)
    # Never a character of it: what came is the text before the span's window.
    assert text.startswith(seen)
    assert len(seen) <= start
    # Everything before it but its own window, and all of it after a sentence end.
    assert start - len(seen) < hold_back
    if after_sentence:
        assert seen == text[:start]
    # Never more than the window waited while the model streamed.
    assert max(model.lags) <= hold_back
    # The post stages' partial answer is what the consumer saw.
    assert caught.value.partial.text == seen
    assert caught.value.guardrail == "no_span"
    assert caught.value.where == "output"


@settings(max_examples=150, deadline=None)
@given(
    st.text(alphabet="abc", max_size=300),
    st.text(alphabet="abc", max_size=100),
    st.lists(st.integers(0, 500), max_size=40),
    st.integers(2 * len(SPAN), 80),
)
async def test_a_span_across_a_forced_cut_never_reaches_the_consumer(
    head: str, tail: str, cuts: list[int], hold_back: int
) -> None:
    # No space and no sentence end: each window is cut at hold_back itself (issue 47).
    text = head + SPAN + tail
    received: list[str] = []
    model = Paced(chunked(text, cuts), received)
    agent = Agent(model, chat_stack=[OutputGuardrail(no_span, hold_back=hold_back)])
    with pytest.raises(GuardrailError):
        await streamed(agent, received)
    seen = "".join(received)
    assert text.startswith(seen)
    assert len(seen) <= len(head)
    assert max(model.lags) <= hold_back


@settings(max_examples=100, deadline=None)
@given(
    st.text(alphabet="ab1 2.\n-", max_size=300),
    st.lists(st.integers(0, 400), max_size=40),
    st.integers(1, 60),
)
async def test_an_allowed_answer_arrives_whole_never_more_than_the_window_behind(
    text: str, cuts: list[int], hold_back: int
) -> None:
    received: list[str] = []
    model = Paced(chunked(text, cuts), received)
    agent = Agent(model, chat_stack=[OutputGuardrail(no_span, hold_back=hold_back)])
    response = await streamed(agent, received)
    assert "".join(received) == text == response.text
    assert max(model.lags) <= hold_back


async def test_a_block_closes_the_models_stream_without_reading_on() -> None:
    received: list[str] = []
    chunks = ["Fine. ", f"{SPAN} ", "word. ", *(["more text. "] * 50)]
    model = Paced(chunks, received)
    agent = Agent(model, chat_stack=[OutputGuardrail(no_span)])
    with pytest.raises(GuardrailError, match="blocked the answer: the forbidden word"):
        await streamed(agent, received)
    assert received == ["Fine. "]
    assert model.closed_early
    assert model.yielded < 5


async def test_the_post_stages_see_the_block_and_what_the_consumer_saw() -> None:
    seen: list[BaseException | None] = []

    class Record(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            seen.append(args[4])

    client = ScriptedChatClient([["All good. ", "Then ", SPAN, " here."]])
    agent = Agent(client, stack=[Record()], chat_stack=[OutputGuardrail(no_span)])
    received: list[str] = []
    with pytest.raises(GuardrailError):
        await streamed(agent, received)
    [error] = seen
    assert isinstance(error, GuardrailError)
    assert error.partial.text == "All good. "
    assert "".join(received) == "All good. "


async def test_a_streamed_rewrite_replaces_the_held_text_and_the_response() -> None:
    client = ScriptedChatClient([["Mail me at ann@exa", "mple.org. Or ", "call 555-123-4567."]])
    agent = Agent(client, chat_stack=[OutputGuardrail(pii_redactor())])
    received: list[str] = []
    response = await streamed(agent, received)
    assert "".join(received) == "Mail me at [email]. Or call [phone]."
    assert response.text == "Mail me at [email]. Or call [phone]."


async def test_the_check_sees_the_window_and_what_was_released_before_it() -> None:
    calls: list[tuple[str, str]] = []

    async def look(text: str, context: GuardrailContext) -> Verdict:
        calls.append((context.before, text))
        return Verdict.rewrite(text.upper())

    client = ScriptedChatClient([["one. tw", "o. three"]])
    agent = Agent(client, chat_stack=[OutputGuardrail(look)])
    response = await streamed(agent, [])
    assert calls == [("", "one. "), ("ONE. ", "two. "), ("ONE. TWO. ", "three")]
    assert response.text == "ONE. TWO. THREE"


async def test_an_unstreamed_answer_is_checked_once_whole() -> None:
    calls: list[str] = []

    async def redact(text: str, context: GuardrailContext) -> Verdict:
        calls.append(text)
        return Verdict.rewrite(text.replace("42", "[n]"))

    client = ScriptedChatClient(["It is 42. Really 42."])
    response = await Agent(client, chat_stack=[OutputGuardrail(redact)]).run("?")
    assert calls == ["It is 42. Really 42."]
    assert response.text == "It is [n]. Really [n]."
    blocked = Agent(ScriptedChatClient([f"a {SPAN}"]), chat_stack=[OutputGuardrail(no_span)])
    with pytest.raises(GuardrailError) as caught:
        await blocked.run("?")
    assert caught.value.partial is None


async def test_a_tool_call_in_a_stream_first_releases_the_held_text() -> None:
    @tool
    def now() -> str:
        "The time."
        return "noon"

    client = ScriptedChatClient(
        [["Let me ", "look", Update.of_tool_call(ToolCall("1", "now"))], ["It is noon"]]
    )
    agent = Agent(client, tools=[now], chat_stack=[OutputGuardrail(no_span)])
    kinds: list[tuple[str, str]] = []

    async def on_update(update: Update) -> None:
        kinds.append((update.kind, update.text))

    response = await agent.run("time?", on_update=on_update)
    assert kinds[:2] == [("text", "Let me look"), ("tool_call", "")]
    assert response.text == "It is noon"


async def test_an_input_block_ends_the_run_before_the_model_is_called() -> None:
    seen: list[BaseException | None] = []

    class Record(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            seen.append(args[4])

    client = ScriptedChatClient(["never"])
    agent = Agent(client, stack=[Record(), InputGuardrail(no_span)])
    with pytest.raises(GuardrailError, match="guardrail 'no_span' blocked the request"):
        await agent.run(f"say {SPAN}")
    assert client.requests == []
    assert isinstance(seen[0], GuardrailError)
    assert seen[0].where == "input"


async def test_an_input_rewrite_is_what_the_model_and_the_providers_inside_see() -> None:
    inside: list[str] = []

    class Inside(ContextProvider):
        async def on_invoking(self, agent: Any, session: Any, messages: Any, options: Any) -> Any:
            inside.append(messages[-1].content)
            return raf.ContextResult()

    client = ScriptedChatClient(["ok"])
    agent = Agent(client, stack=[InputGuardrail(pii_redactor()), Inside()])
    await agent.run("my card is 4111 1111 1111 1111")
    assert inside == ["my card is [card]"]
    assert client.requests[0].messages[-1].content == "my card is [card]"


@tool
async def lookup(email: str) -> str:
    "Find a customer by e-mail."
    return f"customer {email}, phone +1 415 555 0100"


async def test_a_tool_block_is_told_to_the_model_and_the_tool_never_runs() -> None:
    ran: list[str] = []

    @tool
    def wipe(path: str) -> str:
        "Wipe a folder."
        ran.append(path)
        return "wiped"

    async def no_root(text: str, context: GuardrailContext) -> Verdict:
        if context.where == "tool_arguments" and '"/"' in text:
            return Verdict.block("not the root folder")
        return Verdict.allow()

    call = ToolCall("c1", "wipe", '{"path": "/"}')
    client = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "I may not."])
    agent = Agent(client, tools=[wipe], tool_stack=[ToolGuardrail(no_root)])
    response = await agent.run("wipe /")
    assert ran == []
    told = response.messages[1]
    assert told.role == "tool"
    assert told.tool_call_id == "c1"
    assert told.content == (
        "Error: guardrail 'no_root' refused this call of 'wipe': not the root folder"
    )
    assert client.requests[1].messages[-1] == told
    assert response.text == "I may not."


async def test_a_tool_guardrail_rewrites_the_arguments_and_the_result() -> None:
    call = ToolCall("c1", "lookup", '{"email": "ann@example.org"}')
    client = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "done"])
    agent = Agent(client, tools=[lookup], tool_stack=[ToolGuardrail(pii_redactor())])
    response = await agent.run("find ann")
    assert response.messages[1].content == "customer [email], phone [phone]"


async def test_a_withheld_tool_result_is_told_to_the_model() -> None:
    async def no_phones(text: str, context: GuardrailContext) -> Verdict:
        if context.where == "tool_result" and "phone" in text:
            return Verdict.block("phone numbers stay private")
        return Verdict.allow()

    call = ToolCall("c1", "lookup", '{"email": "a@b.org"}')
    client = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "done"])
    agent = Agent(client, tools=[lookup], tool_stack=[ToolGuardrail(no_phones)])
    response = await agent.run("find")
    assert response.messages[1].content == (
        "Error: guardrail 'no_phones' withheld the result of 'lookup': phone numbers stay private"
    )


async def test_a_check_that_returns_no_verdict_is_a_clear_error() -> None:
    async def sloppy(text: str, context: GuardrailContext) -> Any:
        return True

    agent = Agent(ScriptedChatClient(["hi"]), chat_stack=[OutputGuardrail(sloppy)])
    with pytest.raises(TypeError, match=r"guardrail 'sloppy' \(output\).*not a raf.Verdict"):
        await agent.run("x")


async def test_a_check_that_is_not_async_is_a_clear_error() -> None:
    def plain(text: str, context: GuardrailContext) -> Verdict:
        return Verdict.allow()

    agent = Agent(ScriptedChatClient(["hi"]), stack=[InputGuardrail(plain)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"'plain' \(input\).*'async def check"):
        await agent.run("x")


async def test_a_guardrail_in_the_wrong_stack_says_where_it_belongs() -> None:
    agent = Agent(ScriptedChatClient(["hi"]), stack=[OutputGuardrail(no_span)])
    with pytest.raises(TypeError, match=r"OutputGuardrail belongs in Agent\(chat_stack"):
        await agent.run("x")


def test_bad_arguments_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="hold_back must be an int >= 1"):
        OutputGuardrail(no_span, hold_back=0)
    with pytest.raises(TypeError, match="check must be"):
        InputGuardrail("pii")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only of a rewrite"):
        Verdict("allow", text="x")
    assert repr(OutputGuardrail(no_span, name="words")) == "OutputGuardrail(words, hold_back=200)"


async def test_the_trace_shows_what_was_held_and_what_became_of_it() -> None:
    events: list[StageEvent] = []
    client = ScriptedChatClient([["Hi ann@example.org. ", f"{SPAN}."]])

    async def both(text: str, context: GuardrailContext) -> Verdict:
        if SPAN in text:
            return Verdict.block("no")
        return await pii_redactor()(text, context)

    agent = Agent(
        client, chat_stack=[OutputGuardrail(both)], observers=[TraceObserver(events.append)]
    )
    with pytest.raises(GuardrailError):
        await streamed(agent, [])
    checks = [str(event).split(" ms ")[1] for event in events if event.kind == "guardrail"]
    assert checks == [
        "ok (held 'Hi ann@example.org. ' -> rewritten 'Hi [email]. ')",
        f"ok (held '{SPAN}.' -> blocked: no)",
    ]


async def test_each_check_is_seen_by_the_observers_guardrail_hook() -> None:
    seen: list[tuple[str, str, str]] = []

    class Watch(raf.observe.Observer):
        async def guardrail(self, check: raf.GuardrailCheck, call_next: Any) -> Verdict:
            verdict: Verdict = await call_next()
            seen.append((check.context.where, check.text, verdict.action))
            return verdict

    call = ToolCall("c1", "lookup", '{"email": "x"}')
    client = ScriptedChatClient([ScriptedChatClient.tool_turn(call), "fine"])
    agent = Agent(
        client,
        tools=[lookup],
        stack=[InputGuardrail(no_span)],
        chat_stack=[OutputGuardrail(no_span)],
        tool_stack=[ToolGuardrail(pii_redactor())],
        observers=[Watch()],
    )
    await agent.run("hello")
    assert seen == [
        ("input", "hello", "allow"),
        ("tool_arguments", '{"email": "x"}', "allow"),
        ("tool_result", "customer x, phone +1 415 555 0100", "rewrite"),
        ("output", "fine", "allow"),
    ]


async def test_only_messages_with_text_are_checked() -> None:
    checked: list[str] = []

    async def record(text: str, context: GuardrailContext) -> Verdict:
        checked.append(text)
        return Verdict.allow()

    agent = Agent(ScriptedChatClient(["ok"]), stack=[InputGuardrail(record)])
    await agent.run([ChatMessage.system("be brief"), ChatMessage.user("")])
    assert checked == ["be brief"]


async def test_the_iterator_form_raises_the_block_after_the_released_text() -> None:
    client = ScriptedChatClient([["Safe here. ", f"Then {SPAN}.", " More."]])
    agent = Agent(client, chat_stack=[OutputGuardrail(no_span)])
    texts: list[str] = []

    async def read() -> None:
        async with agent.stream("go") as stream:
            async for update in stream:
                texts.append(update.text)

    with pytest.raises(GuardrailError):
        await read()
    assert texts == ["Safe here. "]


async def test_the_context_carries_the_request_and_whether_more_may_follow() -> None:
    contexts: list[GuardrailContext] = []

    async def look(text: str, context: GuardrailContext) -> Verdict:
        contexts.append(context)
        return Verdict.allow()

    client = ScriptedChatClient([["one. tw", "o. three"]])
    agent = Agent(client, stack=[InputGuardrail(look)], chat_stack=[OutputGuardrail(look)])
    await streamed(agent, [])
    assert [(c.where, c.final) for c in contexts] == [
        ("input", True),
        ("output", False),
        ("output", False),
        ("output", True),
    ]
    assert isinstance(contexts[0].request, raf.Invocation)
    assert all(isinstance(c.request, raf.ChatRequest) for c in contexts[1:])


async def test_a_block_after_a_tool_call_keeps_the_earlier_turns_in_the_partial() -> None:
    @tool
    def lookup(q: str) -> str:
        """Look it up."""
        return f"about {q}"

    call = ToolCall("1", "lookup", '{"q": "x"}')
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(call, text="Looking. "), ["Found. ", SPAN, "."]]
    )
    agent = Agent(client, tools=[lookup], chat_stack=[OutputGuardrail(no_span)])
    received: list[str] = []
    with pytest.raises(GuardrailError) as caught:
        await streamed(agent, received)
    # What the consumer saw of the run: the first turn, its tool's result, the released text.
    partial = caught.value.partial.messages
    assert [(m.role, m.content) for m in partial] == [
        ("assistant", "Looking. "),
        ("tool", "about x"),
        ("assistant", "Found. "),
    ]
    assert partial[0].tool_calls == (call,)
    assert "".join(received) == "Looking. Found. "


class Down:
    """A model that is down: each call fails with a retryable server error."""

    async def complete(self, messages: Any, options: ChatOptions) -> AgentResponse:
        raise raf.errors.ServerError("down", status_code=503)

    async def stream(self, messages: Any, options: ChatOptions) -> AsyncIterator[Update]:
        raise raf.errors.ServerError("down", status_code=503)
        yield  # pragma: no cover


async def test_a_fallback_models_answer_is_checked_too() -> None:
    backup = ScriptedChatClient([["Fine. ", f"The {SPAN} thing."]])
    agent = Agent(Down(), chat_stack=[OutputGuardrail(no_span), raf.FallbackMiddleware(backup)])
    received: list[str] = []
    with pytest.raises(GuardrailError):
        await streamed(agent, received)
    assert received == ["Fine. "]


async def test_a_guardrail_after_a_fallback_is_refused_it_would_not_see_the_fallbacks() -> None:
    backup = ScriptedChatClient([f"The {SPAN} thing."])
    agent = Agent(Down(), chat_stack=[raf.FallbackMiddleware(backup), OutputGuardrail(no_span)])
    with pytest.raises(ValueError, match="put it before the FallbackMiddleware"):
        await agent.run("go")
    assert backup.requests == []


async def test_a_cjk_sentence_end_ends_a_window_so_a_span_is_not_cut_in_two() -> None:
    # No spaces in Chinese or Japanese: without its full stops as sentence ends, the
    # window would be cut at hold_back, here through the forbidden word.
    async def no_word(text: str, context: GuardrailContext) -> Verdict:
        return Verdict.block("a forbidden word") if "禁止" in text else Verdict.allow()

    text = "今天天气很好。我们去公园散步吧\uff01那里有禁止的东西。再见。"
    assert text.index("禁止") < 20 < text.index("禁止") + 2
    agent = Agent(Paced(list(text), []), chat_stack=[OutputGuardrail(no_word, hold_back=20)])
    received: list[str] = []
    with pytest.raises(GuardrailError):
        await streamed(agent, received)
    assert "".join(received) == "今天天气很好。我们去公园散步吧\uff01"


class RawChunks:
    """A model whose text updates carry their vendor chunk as ``raw``, as the real clients'
    do (the chunk holds the delta's text)."""

    def __init__(self, chunks: Sequence[str]) -> None:
        self.chunks = chunks

    async def complete(self, messages: Any, options: ChatOptions) -> AgentResponse:
        raise AssertionError("a streamed run calls stream()")

    async def stream(self, messages: Any, options: ChatOptions) -> AsyncIterator[Update]:
        for chunk in self.chunks:
            yield Update("text", chunk, raw={"delta": {"content": chunk}})


@pytest.mark.parametrize(
    ("chunks", "check", "hidden"),
    [
        (["Mail ann@example.org now. ", "ok"], pii_redactor(), "ann@"),
        (["Fine. The FORBIDDEN thing."], no_span, SPAN),
    ],
)
async def test_a_released_update_carries_no_raw_chunk_with_text_the_consumer_did_not_get(
    chunks: list[str], check: Any, hidden: str
) -> None:
    agent = Agent(RawChunks(chunks), chat_stack=[OutputGuardrail(check)])
    raws: list[Any] = []

    async def on_update(update: Update) -> None:
        raws.append(update.raw)

    with pytest.raises(GuardrailError) if hidden == SPAN else contextlib.nullcontext():
        await agent.run("go", on_update=on_update)
    assert raws
    assert hidden not in repr(raws)
