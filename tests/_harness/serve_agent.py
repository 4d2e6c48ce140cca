"""The agent the serving tests serve: a model that streams word by word, slowly if asked.

``uvicorn tests._harness.serve_agent:create --factory`` builds it from the environment
(``RAF_TEST_SERVE``: a JSON object with ``delay`` between words, ``db``,
``keys`` and ``guardrails``), so a test can run the real app in a real server process.

With ``guardrails``, an input guardrail ``no_jailbreak`` blocks a request that
says ``jailbreak``, and an output guardrail ``no_secret`` blocks an answer that
says ``secret`` (the model says back what it is told: ``Hi. the secret`` streams
``seen 1: Hi. `` before the blocked window).

What the model answers depends on the last message:
- a user message ``fail:timeout`` / ``fail:rate`` / ``fail:model``: that model error;
- a user message containing ``delete``: a call of ``delete`` (a tool that waits
  for approval) on ``notes.txt``; after its result, ``the tool said <result>``;
- a user message containing ``tool``: a call of the tool ``shout``; after its
  result, ``the tool said <result>``;
- a user message containing ``client``: a call of each client tool offered
  (``runs_on_client``), arguments ``{"city": "Paris"}``; with ``both``, a call of
  ``shout`` too, in the same model call;
- with ``tool_choice`` a tool's name (or ``required``: the first client tool, else
  ``shout``), a user message: a call of that tool; after a tool's result with any
  ``tool_choice``, `` (choice <tool_choice>)`` ends the answer;
- with an output schema, a user message: ``{"answer": <the user text>}`` (one that begins
  ``json:``: the rest of it, as it is);
- a user message containing ``check``: ``Let me check.`` before what it says;
- a user message ``long``: 200 words (a stream to leave in the middle);
- a user message ``flood``: words of 1 kB, without end (a stream a client must leave);
- anything else: ``seen N: <the user text>``, N the count of messages it got
  (so a test sees the history reach the model).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel

import raf
import raf.serve
from raf import AgentResponse, ChatMessage, ChatOptions, HistoryProvider, ToolCall, Update
from raf.errors import ChatTimeoutError, RateLimitError, ServerError


@raf.tool
def shout(text: str) -> str:
    """Say ``text`` loudly."""
    return text.upper()


class WordModel:
    """A streaming chat client that answers by the rules of this module."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        return AgentResponse.from_updates([u async for u in self.stream(messages, options)])

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        last = messages[-1]
        text = last.content or ""
        if last.role == "user" and text.startswith("fail:"):
            kind = text[5:]
            if kind == "timeout":
                raise ChatTimeoutError("the model took too long", status_code=408)
            if kind == "rate":
                raise RateLimitError("slow down", status_code=429, retry_after=7)
            raise ServerError("the model broke", status_code=500)
        if last.role == "user":
            async for update in self._client_rules(text, options):
                yield update
                if update.kind == "usage":
                    return
        if last.role == "user" and text == "cached":  # a prompt the provider had cached
            yield Update.of_text("from the cache")
            yield Update.of_usage(raf.Usage(12, 5, cached_input_tokens=8, reasoning_tokens=2))
            return
        if last.role == "user" and "delete" in text:
            yield Update.of_tool_call(ToolCall("call-del", "delete", '{"path": "notes.txt"}'))
            yield Update.of_usage(raf.Usage(3, 1))
            return
        if last.role == "user" and "tool" in text:
            yield Update.of_tool_call(ToolCall("call-1", "shout", json.dumps({"text": "hi"})))
            yield Update.of_usage(raf.Usage(3, 1))
            return
        if last.role == "tool":
            words = ["the ", "tool ", "said ", last.content or ""]
            if options.tool_choice is not None:
                words.append(f" (choice {options.tool_choice})")
        elif last.role == "user" and options.output_schema is not None:
            words = [text[5:] if text.startswith("json:") else json.dumps({"answer": text})]
        elif text == "long":
            words = [f"w{i} " for i in range(200)]
        elif text == "flood":  # until the client leaves
            for i in range(10**9):
                yield Update.of_text(f"w{i} " + "x" * 1000 + " ")
                await anyio.lowlevel.checkpoint()
        else:
            words = [f"seen {len(messages)}: "] + [f"{w} " for w in text.split()]
        for word in words:
            if self.delay:
                await anyio.sleep(self.delay)
            yield Update.of_text(word)
        yield Update.of_usage(raf.Usage(len(messages), len(words)))

    async def _client_rules(self, text: str, options: ChatOptions) -> AsyncIterator[Update]:
        """The rules of client tools, tool choice and ``check``; a usage update ends the call."""
        if "check" in text:
            yield Update.of_text("Let me check.")
        client = [t.name for t in options.tools if getattr(t, "runs_on_client", False)]
        choice = options.tool_choice
        if choice == "required":
            choice = client[0] if client else "shout"
        calls: list[ToolCall] = []
        if isinstance(choice, str) and choice not in ("auto", "none"):
            calls.append(ToolCall("call-choice", choice, json.dumps({"text": "hi"})))
        elif "client" in text:
            where = json.dumps({"city": "Paris"})
            calls = [ToolCall(f"call-{name}", name, where) for name in client]
            if "both" in text:
                calls.append(ToolCall("call-1", "shout", json.dumps({"text": "hi"})))
        for call in calls:
            yield Update.of_tool_call(call)
        if calls:
            yield Update.of_usage(raf.Usage(3, 1))


@raf.tool
def lookup(query: str) -> str:
    """Look ``query`` up (a provider's tool)."""
    return f"found {query}"


class OffersLookup:
    """A provider that offers the tool ``lookup`` to every run."""

    name = "lookup-provider"

    async def on_invoking(self, *args: Any) -> raf.ContextResult:
        return raf.ContextResult(tools=(lookup,))


def make_agent(
    delay: float = 0.0,
    *,
    post_timeout: float = 10.0,
    on_delete: Callable[[str], None] | None = None,
    guardrails: bool = False,
    provider_tool: bool = False,
) -> raf.Agent:
    """The served agent: a history that keeps partial answers, ``shout``, and ``delete``
    (which waits for approval; ``on_delete(path)`` is called each time it runs);
    with ``guardrails``, ``no_jailbreak`` on the request and ``no_secret`` on the answer;
    with ``provider_tool``, a provider that offers ``lookup``."""

    @raf.tool(approval=True)
    def delete(path: str) -> str:
        """Delete the file ``path`` (pretend): it waits for a person's approval."""
        if on_delete is not None:
            on_delete(path)
        return f"deleted {path}"

    guarded_input = [raf.InputGuardrail(_no_word("jailbreak"), name="no_jailbreak")]
    guarded_output = [raf.OutputGuardrail(_no_word("secret"), name="no_secret")]
    if not guardrails:
        guarded_input, guarded_output = [], []
    return raf.Agent(
        WordModel(delay),
        name="word-agent",
        tools=[shout, delete],
        stack=[
            HistoryProvider(persist_partial=True),
            *guarded_input,
            *([OffersLookup()] if provider_tool else []),
        ],
        chat_stack=guarded_output,
        post_timeout=post_timeout,
    )


def _no_word(word: str) -> Callable[[str, raf.GuardrailContext], Awaitable[raf.Verdict]]:
    async def check(text: str, context: raf.GuardrailContext) -> raf.Verdict:
        # The reason names the rule's internals: a client must never read it.
        blocked = raf.Verdict.block(f"internal rule 7 matched {word!r}")
        return blocked if word in text else raf.Verdict.allow()

    return check


def create() -> Any:
    """The ASGI app, configured by ``RAF_TEST_SERVE`` (for uvicorn's ``--factory``)."""
    config = json.loads(os.environ.get("RAF_TEST_SERVE", "{}"))
    deleted = config.get("deleted")  # a file where each run of ``delete`` adds a line

    def on_delete(path: str) -> None:
        if deleted is not None:
            with open(deleted, "a") as log:
                log.write(path + "\n")

    agent = make_agent(
        config.get("delay", 0.0),
        on_delete=on_delete,
        guardrails=config.get("guardrails", False),
        provider_tool=config.get("provider_tool", False),
    )
    if config.get("openai_url"):  # the model: a loopback OpenAI server (what raf sends it)
        model = raf.OpenAIChatClient(
            "test-model", base_url=config["openai_url"], api_key="sk-test", max_retries=0
        )
        agent = raf.Agent(model, name="word-agent")
    return raf.serve.app(
        agent,
        store=config.get("db"),
        api_keys=config.get("keys"),
        max_body=config.get("max_body", 4 * 1024 * 1024),
        mcp=config.get("mcp", False),
        a2a=config.get("a2a", False),
        **{k: config[k] for k in ("body_timeout", "write_timeout", "public_url") if k in config},
    )
