"""Guardrails: a check on the request (run stack), the answer (chat stack) or a tool call
(tool stack) that lets the text pass, blocks it or rewrites it.

A streamed answer is judged window by window (:mod:`raf._middleware.holdback`):
the output guardrail wraps the call's ``on_update`` (ASGI's ``send``) and
sends on only what a check passed, so the consumer waits for one window,
never for the whole answer.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from raf._middleware.fallback import FallbackMiddleware
from raf._middleware.holdback import cut_point, forced
from raf._onion.observe import observed_check
from raf._values.context import ChatRequest, Invocation, ToolRequest
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate, Update
from raf._values.verdict import Check, GuardrailCheck, GuardrailContext, Verdict
from raf.errors import GuardrailError, GuardrailWhere

__all__ = ["InputGuardrail", "OutputGuardrail", "ToolGuardrail"]


def _checked(kind: str, check: Check, name: str | None) -> tuple[Check, str]:
    """A guardrail's check and name (given, else the check's function name), checked."""
    if not callable(check):
        raise TypeError(
            f"{kind}: check must be 'async (text, context) -> Verdict', got {check!r:.80}"
        )
    if name is not None and (type(name) is not str or not name):
        raise TypeError(f"{kind}: name must be a non-empty str, got {name!r:.80}")
    return check, name or getattr(check, "__name__", None) or type(check).__name__


async def judge(
    check: Check,
    name: str,
    text: str,
    where: GuardrailWhere,
    request: Any,
    before: str = "",
    *,
    final: bool = True,
) -> Verdict:
    """The check's verdict on ``text``, inside the observers' ``guardrail`` hooks."""
    context = GuardrailContext(name, where, before=before, final=final, request=request)

    async def run() -> Verdict:
        answer = check(text, context)
        if not inspect.isawaitable(answer):
            raise TypeError(
                f"guardrail {name!r} ({where}): its check returned {answer!r:.80} without "
                "awaiting: a check is 'async def check(text, context) -> Verdict'"
            )
        verdict = await answer
        if type(verdict) is not Verdict:
            raise TypeError(
                f"guardrail {name!r} ({where}): its check returned {verdict!r:.80}, "
                "not a raf.Verdict (Verdict.allow(), .block(reason) or .rewrite(text))"
            )
        return verdict

    observers = _observers(request)
    if not observers:
        return await run()
    return await observed_check(observers, GuardrailCheck(text, context), run)


def _observers(request: Any) -> tuple[Any, ...]:
    """The observers of the agent whose run ``request`` belongs to (none outside a run)."""
    invocation = request if isinstance(request, Invocation) else request.invocation
    agent = None if invocation is None else invocation.agent
    return tuple(getattr(agent, "observers", ()))


class InputGuardrail:
    """Run middleware (``Agent(stack=[...])``): checks each request message's text before
    anything inside it runs, so before any model call.

    A block ends the run with :class:`raf.GuardrailError`; the layers outside
    it (the providers before it in ``stack``) see it in their post stages.
    A rewrite replaces the message's text for everything inside it: put it
    first in ``stack`` for every provider (a history that stores the
    request) to see the rewritten text.

    >>> import anyio
    >>> from raf import Agent, EchoChatClient, pii_redactor
    >>> agent = Agent(EchoChatClient(), stack=[InputGuardrail(pii_redactor())])
    >>> anyio.run(agent.run, "mail bob@example.com").text
    'mail [email]'
    """

    __slots__ = ("check", "name")

    def __init__(self, check: Check, *, name: str | None = None) -> None:
        self.check, self.name = _checked("InputGuardrail", check, name)

    async def __call__(
        self, request: Invocation, call_next: Callable[[Invocation], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """Check the request messages, then run the rest with them (rewritten)."""
        if not isinstance(request, Invocation):
            raise TypeError(
                f"InputGuardrail belongs in Agent(stack=[...]), got a {type(request).__name__}"
            )
        messages = list(request.request_messages)
        changed = False
        for index, message in enumerate(messages):
            if not message.content:
                continue
            verdict = await judge(self.check, self.name, message.content, "input", request)
            if verdict.action == "block":
                raise GuardrailError(self.name, "input", verdict.reason or "")
            if verdict.action == "rewrite" and verdict.text != message.content:
                messages[index] = attrs.evolve(message, content=verdict.text)
                changed = True
        if changed:
            request = attrs.evolve(request, request_messages=tuple(messages))
        return await call_next(request)

    def __repr__(self) -> str:
        return f"InputGuardrail({self.name})"


class OutputGuardrail:
    """Chat middleware (``Agent(chat_stack=[...])``): checks the model's answer.

    Unstreamed, the whole text of each answer is checked once. Streamed,
    text reaches the consumer only once the check passed on it: it is
    judged in windows that end at a sentence end, or once ``hold_back``
    characters wait (see :func:`raf._middleware.holdback.cut_point`), so at
    most ``hold_back`` characters are ever held and the first visible text
    comes at most one window later. The check gets the window as ``text``
    and what was released before it as ``context.before``.

    A block stops the model's stream (closed, not read to its end), never
    releases what was held and ends the run with
    :class:`raf.GuardrailError`, whose ``partial`` is what the consumer got
    of this answer; a rewrite replaces the window (and the answer's text in
    the :class:`raf.AgentResponse`).

    >>> import anyio
    >>> from raf import Agent, ScriptedChatClient, Verdict
    >>> async def no_secrets(text, context):
    ...     return Verdict.block("a secret") if "secret" in text else Verdict.allow()
    >>> agent = Agent(ScriptedChatClient(["The secret is 42."]),
    ...               chat_stack=[OutputGuardrail(no_secrets)])
    >>> anyio.run(agent.run, "tell me")
    Traceback (most recent call last):
    raf.GuardrailError: guardrail 'no_secrets' blocked the answer: a secret
    """

    __slots__ = ("check", "hold_back", "name")

    def __init__(self, check: Check, *, hold_back: int = 200, name: str | None = None) -> None:
        self.check, self.name = _checked("OutputGuardrail", check, name)
        if type(hold_back) is not int or hold_back < 1:
            raise ValueError(f"OutputGuardrail: hold_back must be an int >= 1, got {hold_back!r}")
        self.hold_back = hold_back

    async def __call__(
        self, request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """The model call, its answer checked (window by window when streamed)."""
        if not isinstance(request, ChatRequest):
            raise TypeError(
                "OutputGuardrail belongs in Agent(chat_stack=[...]): it checks one model's "
                f"answer, and got a {type(request).__name__}"
            )
        self._not_inside_a_fallback(request)
        if request.on_update is None:
            response = await call_next(request)
            text = response.text
            if not text:
                return response
            verdict = await judge(self.check, self.name, text, "output", request)
            if verdict.action == "block":
                raise GuardrailError(self.name, "output", verdict.reason or "")
            if verdict.action == "rewrite" and verdict.text != text:
                return _with_text(response, verdict.text or "")
            return response
        held = _Held(self, request, request.on_update)
        response = await call_next(attrs.evolve(request, on_update=held.on_update))
        await held.flush()
        return _with_text(response, held.released) if held.rewritten else response

    def __repr__(self) -> str:
        return f"OutputGuardrail({self.name}, hold_back={self.hold_back})"

    def _not_inside_a_fallback(self, request: ChatRequest) -> None:
        """Refuse a place after a :class:`raf.FallbackMiddleware` in the agent's ``chat_stack``:
        it calls its fallback clients directly, so their answers would pass unchecked."""
        agent = None if request.invocation is None else request.invocation.agent
        stack = tuple(getattr(agent, "chat_stack", ()))
        if self in stack and any(
            isinstance(m, FallbackMiddleware) for m in stack[: stack.index(self)]
        ):
            raise ValueError(
                f"{self!r} comes after a FallbackMiddleware in chat_stack: the fallback "
                "models' answers would reach the consumer unchecked; put it before the "
                "FallbackMiddleware"
            )


class _Held:
    """The text of one streamed answer that the check has not passed yet."""

    __slots__ = ("guardrail", "held", "raw", "released", "request", "rewritten", "send")

    def __init__(self, guardrail: OutputGuardrail, request: ChatRequest, send: OnUpdate) -> None:
        self.guardrail = guardrail
        self.request = request
        self.send = send
        self.held = ""  # arrived, not judged
        # The first held update, when held whole: its raw chunk goes with a window that is
        # exactly its text (a chunk's raw holds its text, which must not outlive a rewrite
        # or go out with a window that ends before it).
        self.raw: tuple[str, Any] | None = None
        self.released = ""  # what the consumer got, rewrites included
        self.rewritten = False

    async def on_update(self, update: Update) -> None:
        """A text delta is held until its window is judged; anything else first releases
        what is held (its window ends there), then goes on."""
        if update.kind != "text":
            await self.flush()
            await self.send(update)
            return
        if not self.held:
            self.raw = (update.text, update.raw)
        held, start, hold_back = self.held + update.text, 0, self.guardrail.hold_back
        # Cut from an offset, not by slicing what is left each time: a huge chunk is
        # cut in linear time.
        try:
            while (
                cut := cut_point(region := held[start : start + hold_back], hold_back)
            ) is not None:
                # At a forced cut the window's second half is judged again at the head of the
                # next one: a span across the cut (up to half the window) is then judged
                # whole before any of it is released.
                keep = hold_back // 2 if forced(region, hold_back) else 0
                start += await self._release(held[start : start + cut], final=False, keep=keep)
        finally:
            self.held = held[start:]

    async def flush(self) -> None:
        """Judge and release all that is held (the answer, or its text, ended)."""
        if self.held:
            window, self.held = self.held, ""
            await self._release(window, final=True)

    async def _release(self, window: str, *, final: bool, keep: int = 0) -> int:
        """Judge ``window`` and release it, but its last ``keep`` characters when it is
        allowed as it is (they stay held); how many characters of it were taken."""
        guardrail = self.guardrail
        verdict = await judge(
            guardrail.check,
            guardrail.name,
            window,
            "output",
            self.request,
            self.released,
            final=final,
        )
        if verdict.action == "block":
            seen = AgentResponse((ChatMessage.assistant(self.released),) if self.released else ())
            raise GuardrailError(guardrail.name, "output", verdict.reason or "", partial=seen)
        text, taken = window[: len(window) - keep], len(window) - keep
        if verdict.action == "rewrite" and verdict.text != window:
            text, taken, self.rewritten = verdict.text or "", len(window), True
        raw = self.raw[1] if self.raw is not None and text == window == self.raw[0] else None
        self.raw = None  # what is left of the window's chunks is a piece of one
        if text:
            self.released += text
            await self.send(Update("text", text, raw=raw))
        return taken


def _with_text(response: AgentResponse, text: str) -> AgentResponse:
    """``response`` with ``text`` as its last assistant message's text."""
    messages = list(response.messages)
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "assistant":
            messages[index] = attrs.evolve(messages[index], content=text)
            return attrs.evolve(response, messages=tuple(messages))
    return response


class ToolGuardrail:
    """Tool middleware (``Agent(tool_stack=[...])``): checks a call's arguments before the
    tool runs, and its result before the model sees it.

    The arguments are checked as JSON text: a block answers the call with
    the refusal (the tool never runs; the model reads why, and the run goes
    on); a rewrite must be a JSON object, the arguments the tool gets. The
    result is checked as the text the model would read: a block withholds
    it (the model reads why), a rewrite replaces it.

    >>> import anyio
    >>> from raf import Agent, ScriptedChatClient, ToolCall, tool, Verdict
    >>> @tool
    ... def delete(path: str) -> str:
    ...     "Delete a file."
    ...     raise AssertionError("never runs")
    >>> async def no_deletes(text, context):
    ...     return Verdict.block("nothing is deleted here")
    >>> client = ScriptedChatClient([
    ...     ScriptedChatClient.tool_turn(ToolCall("1", "delete", '{"path": "/"}')), "ok"])
    >>> agent = Agent(client, tools=[delete], tool_stack=[ToolGuardrail(no_deletes)])
    >>> anyio.run(agent.run, "clean up").messages[1].content
    "Error: guardrail 'no_deletes' refused this call of 'delete': nothing is deleted here"
    """

    __slots__ = ("check", "name")

    def __init__(self, check: Check, *, name: str | None = None) -> None:
        self.check, self.name = _checked("ToolGuardrail", check, name)

    async def __call__(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """The tool call, its arguments and its result checked."""
        if not isinstance(request, ToolRequest):
            raise TypeError(
                f"ToolGuardrail belongs in Agent(tool_stack=[...]), got a {type(request).__name__}"
            )
        tool = request.call.name
        arguments = json.dumps(dict(request.arguments), ensure_ascii=False, default=str)
        verdict = await judge(self.check, self.name, arguments, "tool_arguments", request)
        if verdict.action == "block":
            return request.reply(
                f"Error: guardrail {self.name!r} refused this call of {tool!r}: {verdict.reason}"
            )
        if verdict.action == "rewrite" and verdict.text != arguments:
            request = attrs.evolve(request, arguments=self._arguments(verdict.text or ""))
        message = await call_next(request)
        result = message.content or ""
        verdict = await judge(self.check, self.name, result, "tool_result", request)
        if verdict.action == "block":
            return request.reply(
                f"Error: guardrail {self.name!r} withheld the result of {tool!r}: {verdict.reason}"
            )
        if verdict.action == "rewrite" and verdict.text != result:
            return attrs.evolve(message, content=verdict.text)
        return message

    def __repr__(self) -> str:
        return f"ToolGuardrail({self.name})"

    def _arguments(self, text: str) -> Mapping[str, Any]:
        """A rewrite of the arguments, parsed: it must be a JSON object."""
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise ValueError(
                f"guardrail {self.name!r} rewrote the arguments into {text!r:.80}, "
                "not a JSON object"
            )
        return parsed
