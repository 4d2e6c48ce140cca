"""FallbackMiddleware: when the model call fails with a retryable error, make the same call
to the next chat client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from raf._agent.repair import repaired
from raf._agent.streamed import Onward, stream_model
from raf._log import log as _log
from raf._values.client import ChatClient
from raf._values.context import ChatRequest
from raf._values.messages import AgentResponse
from raf.errors import ChatClientError

__all__ = ["FallbackMiddleware"]


class FallbackMiddleware:
    """Chat middleware: a call that fails with a retryable error goes to the next client.

    ``Agent(primary, chat_stack=[FallbackMiddleware(backup, other)])``: each
    model call goes to ``primary`` (through the rest of the chat stack) as
    usual; when it fails with a :class:`raf.ChatClientError` whose
    ``retryable`` is true (rate limit, timeout, connection or server
    error), the same messages and options go to ``backup``, then ``other``,
    each asked for its own model (its ``model`` attribute: the primary's is
    not theirs). An error that is not retryable (a bad request, a refusal,
    an output that does not validate) is raised at once: another model
    would be asked the same wrong thing. ``fallback_on``, a tuple of
    exception types, replaces that rule. When every client failed, the
    last error is raised, the earlier ones attached as notes.

    A streamed call falls back only while nothing has been sent onward (as
    :class:`raf.RetryMiddleware` retries): once the consumer has seen an
    update, another model's answer would contradict it, and the error goes
    through. Each fallback is logged (``"model.fallback"``, with the models
    it goes from and to and the error), and the response's ``model`` names
    the model that answered, which :class:`raf.LoggingMiddleware` and
    :mod:`raf.otel` report (``model``, ``gen_ai.response.model``).

    Put a :class:`raf.RetryMiddleware` *inside* it (after it in
    ``chat_stack``) to retry the primary before falling back, and the
    clients' own retries off. The fallback clients are called directly:
    the chat middleware after this one and the ``model_attempt`` hooks of
    observers see only the primary's calls; each gets the transcript
    repaired as the agent's own client does (see ``docs/long-running.md``,
    "Repair"). ``await agent.aclose()`` closes the fallback clients too.

    >>> from raf import Agent, EchoChatClient, ScriptedChatClient
    >>> agent = Agent(ScriptedChatClient(), chat_stack=[FallbackMiddleware(EchoChatClient())])
    """

    __slots__ = ("chat_clients", "fallback_on")

    def __init__(
        self,
        *chat_clients: ChatClient,
        fallback_on: tuple[type[BaseException], ...] | None = None,
    ) -> None:
        if not chat_clients:
            raise TypeError("FallbackMiddleware needs at least one chat client to fall back to")
        for index, client in enumerate(chat_clients):
            if not callable(getattr(client, "complete", None)):
                raise TypeError(
                    f"FallbackMiddleware: chat_clients[{index}] must be a chat client "
                    f"(an async complete() method), got {client!r}"
                )
        if fallback_on is not None and (
            not isinstance(fallback_on, tuple)
            or not all(isinstance(t, type) and issubclass(t, Exception) for t in fallback_on)
        ):
            raise TypeError(
                "FallbackMiddleware: fallback_on must be a tuple of exception types or None, "
                f"got {fallback_on!r}"
            )
        self.chat_clients: tuple[ChatClient, ...] = chat_clients
        self.fallback_on = fallback_on

    def should_fall_back(self, error: BaseException) -> bool:
        """Whether ``error`` sends the call to the next client."""
        if not isinstance(error, Exception):
            return False  # cancellation and the like are never a model's failure
        if self.fallback_on is None:
            return isinstance(error, ChatClientError) and error.retryable
        return isinstance(error, self.fallback_on)

    async def __call__(
        self, request: Any, call_next: Callable[[Any], Awaitable[AgentResponse]]
    ) -> AgentResponse:
        """``call_next(request)``, then each fallback client in turn while the call fails."""
        if not isinstance(request, ChatRequest):
            raise TypeError(
                "FallbackMiddleware belongs in Agent(chat_stack=[...]): it re-sends one model "
                f"call, and got a {type(request).__name__}"
            )
        onward = None if request.on_update is None else Onward(request.on_update)
        if onward is not None:
            request = attrs.evolve(request, on_update=onward)

        def sent() -> bool:  # an update went onward: the consumer saw this call's answer
            return onward is not None and onward.sent

        failed_model = request.options.model
        try:
            return await call_next(request)
        except Exception as exc:
            if sent() or not self.should_fall_back(exc):
                raise
            error: Exception = exc
        failures: list[str] = []
        for client in self.chat_clients:
            model = _model_of(client)
            _log.warning(
                "model.fallback",
                from_model=failed_model,
                to_model=model,
                to_client=type(client).__name__,
                error_type=type(error).__name__,
                error=str(error),
            )
            failures.append(f"model {failed_model!r} failed: {type(error).__name__}: {error}")
            options = attrs.evolve(request.options, model=model)
            messages = repaired(request.messages)  # as the agent's core sends its own client's
            try:
                if request.on_update is None:
                    response = await client.complete(messages, options)
                else:
                    response = await stream_model(client, messages, options, request.on_update)
            except Exception as exc:
                if sent() or not self.should_fall_back(exc):
                    _notes(exc, failures)
                    raise
                error, failed_model = exc, model
                continue
            return attrs.evolve(response, model=_answered_by(response, model))
        _notes(error, failures)
        raise error

    async def aclose(self) -> None:
        """Close the fallback clients that can be closed (``aclose()``), last first."""
        errors: list[BaseException] = []
        for client in reversed(self.chat_clients):
            close = getattr(client, "aclose", None)
            if callable(close):
                try:
                    await close()
                except Exception as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]

    def __repr__(self) -> str:
        clients = ", ".join(type(client).__name__ for client in self.chat_clients)
        return f"FallbackMiddleware({clients})"


def _model_of(client: Any) -> str | None:
    model = getattr(client, "model", None)
    return model if isinstance(model, str) and model else None


def _answered_by(response: AgentResponse, model: str | None) -> str | None:
    """The model a fallback's response names (its own say, its raw reply's), else ``model``."""
    if response.model:
        return response.model
    raw = response.raw
    named = raw.get("model") if isinstance(raw, Mapping) else getattr(raw, "model", None)
    return named if isinstance(named, str) and named else model


def _notes(error: BaseException, failures: list[str]) -> None:
    for failure in failures:
        error.add_note(f"raf: fallback: before it, {failure}")
