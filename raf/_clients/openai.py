"""OpenAIChatClient: a chat model behind the OpenAI chat completions API."""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from typing import Any

from raf._clients._chat_reply import StreamedTurn, call_name, response_from_reply
from raf._clients._chat_wire import request_body
from raf._clients._sdk import SdkClient
from raf._clients._sse import stream_updates
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions

__all__ = ["OpenAIChatClient"]


class OpenAIChatClient(SdkClient):
    """A :class:`raf.ChatClient` on ``openai.AsyncOpenAI`` (chat completions, tools).

    ``model`` is used unless a run's ``AgentRunOptions.model`` names another.
    ``base_url`` and ``api_key`` default to the ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY`` environment variables, as with the SDK itself, so any
    OpenAI-compatible server works. ``max_retries`` is the SDK's own retry
    budget for rate limits, timeouts and server errors; set it to ``0`` when a
    :class:`raf.RetryMiddleware` does the retrying. ``client`` is an
    ``AsyncOpenAI`` you built yourself (proxies, headers); raf then leaves
    closing it to you.

    ``timeout`` bounds each whole call in seconds, the SDK's retries and the
    reading of the reply included (``None``: no bound); past it the call
    raises :class:`raf.ChatTimeoutError`. A stream is held to
    ``timeout`` until it starts, then to ``idle_timeout`` for each wait on its
    next piece: a healthy answer may stream for as long as it takes.
    ``max_response_bytes`` bounds
    the reply's size once decompressed; past it the call raises
    :class:`raf.ChatProtocolError` without reading further.

    :meth:`stream` sends the turn as it comes (a :class:`raf.StreamingChatClient`):
    a streamed run uses it.

    Failures raise :class:`raf.ChatClientError` subclasses whose ``retryable``
    says whether trying again can help; the SDK's exception is ``__cause__``.
    A reply that is not a well-formed chat completion is a
    :class:`raf.ChatProtocolError` naming the field. Close the client with
    ``await client.aclose()`` or ``async with``::

        async with OpenAIChatClient("gpt-4o-mini") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one chat completion request and return the model's turn."""
        model, body, request_options = self.request_body(messages, options)
        data, content_type = await self._call(
            self._path(model), body, request_options, call_name(model)
        )
        return response_from_reply(
            data, content_type, model, refuse=options.output_schema is not None
        )

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """Send one chat completion request with ``stream: true``; the turn, update by update.

        Text deltas are sent as they come; the tool calls, assembled from
        their deltas by ``index``, once the model finished (only then are
        their arguments known to be complete); the usage last (the request
        asks for it with ``stream_options.include_usage``). What the updates
        assemble to equals what :meth:`complete` returns for the same answer.

        A stream that ends before the model's ``finish_reason``, or whose
        connection breaks, is a :class:`raf.ChatConnectionError` (a truncated
        answer is never passed off as complete); a chunk that is not a chat
        completion chunk is a :class:`raf.ChatProtocolError`; HTTP errors map
        as for :meth:`complete`. ``timeout`` bounds the stream until it starts,
        ``idle_timeout`` each wait on the server after that (the time a consumer
        holds an update does not count), and
        ``max_response_bytes`` the size of the whole stream. The HTTP
        response is closed whatever ends the stream, ``aclose()`` included.
        """
        model, body, request_options = self.request_body(messages, options, stream=True)
        turn = StreamedTurn(model, refuse=options.output_schema is not None)
        path, where = self._path(model), call_name(model)
        # Closed here, not left to the garbage collector, when the consumer stops early.
        updates = stream_updates(self, path, body, request_options, turn, where)
        async with contextlib.aclosing(updates):
            async for update in updates:
                yield update

    def request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions, *, stream: bool = False
    ) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """The model, the body (plain dicts and lists) and the SDK request options of one
        call.

        The body is built here and sent as ``json.dumps`` writes it, not by the
        SDK's ``create``: its request transform walks every message (a quarter
        of a millisecond each, seconds over a long history).

        ``options.extra`` is applied last: ``timeout`` (the SDK's per-attempt
        timeout), ``extra_headers``, ``extra_query`` and ``extra_body`` as the
        SDK understands them, any other key into the body. ``stream`` adds
        ``"stream": true`` and asks for the usage.
        """
        return request_body(self.model, messages, options, stream=stream)

    def _path(self, model: str) -> str:
        """The request path: Azure's client finds the deployment in the body only when
        the SDK's ``create`` sends it, so raf names it as the SDK would."""
        import openai

        if isinstance(self.client, openai.AsyncAzureOpenAI) and "/deployments" not in str(
            self.client.base_url.path
        ):
            return f"/deployments/{urllib.parse.quote(model, safe='')}/chat/completions"
        return "/chat/completions"

    def __repr__(self) -> str:
        return f"OpenAIChatClient(model={self.model!r}, base_url={str(self.client.base_url)!r})"
