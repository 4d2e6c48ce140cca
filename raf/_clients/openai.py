"""OpenAIChatClient: a chat model behind the OpenAI chat completions API."""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Self

from raf._clients._chat_reply import StreamedTurn, call_name, response_from_reply
from raf._clients._reply import stream_updates
from raf._clients._sdk import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_TIMEOUT,
    RequestOptions,
    call,
    checked,
    new_body,
    plain,
    prompt_cache_key,
    sdk_client,
    tool_choice,
)
from raf._clients._tokens import count_prompt, counted_with
from raf._values.compacted import for_wire
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions
from raf._values.protocols import Tool
from raf._values.schema import response_format
from raf.errors import BadRequestError

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIChatClient"]

# Options that would make the server answer with a stream, which complete() cannot read.
_REFUSED_EXTRA: Final = frozenset({"stream", "stream_options"})


class OpenAIChatClient:
    """A :class:`raf.StreamingChatClient` on ``openai.AsyncOpenAI`` (chat completions, tools).

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
    raises :class:`raf.errors.ChatTimeoutError`. A stream is held to ``timeout``
    until it starts, then to ``idle_timeout`` for each wait on the server
    (the time a consumer holds an update does not count): a healthy answer
    may stream for as long as it takes. ``max_response_bytes`` bounds the
    reply's size, or the whole stream's, once decompressed; past it the call
    raises :class:`raf.errors.ChatProtocolError` without reading further. The HTTP
    response is closed whatever ends a call or a stream, ``aclose()`` included.

    Failures raise :class:`raf.ChatClientError` subclasses whose ``retryable``
    says whether trying again can help; the SDK's exception is ``__cause__``.
    A reply that is not a well-formed chat completion is a
    :class:`raf.errors.ChatProtocolError` naming the field. Close the client with
    ``await client.aclose()`` or ``async with``::

        async with OpenAIChatClient("gpt-4o-mini") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    #: The provider, as OpenTelemetry's ``gen_ai.provider.name`` names it.
    provider_name: Final = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        idle_timeout: float | None = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        import openai

        self.model, self.timeout, self.idle_timeout = model, timeout, idle_timeout
        self.max_response_bytes = max_response_bytes
        self._owns_client = client is None
        self.client = sdk_client(
            self, openai, "AsyncOpenAI", base_url, api_key, max_retries, client
        )

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one chat completion request and return the model's turn."""
        import openai

        model, body, request_options = self.request_body(messages, options)
        path = self._path(model)
        data, content_type = await call(self, openai, path, body, request_options, call_name(model))
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
        connection breaks, is a :class:`raf.errors.ChatConnectionError` (a truncated
        answer is never passed off as complete); a chunk that is not a chat
        completion chunk is a :class:`raf.errors.ChatProtocolError`; HTTP errors map
        as for :meth:`complete`; the bounds are the class docstring's.
        """
        import openai

        model, body, request_options = self.request_body(messages, options, stream=True)
        turn = StreamedTurn(model, refuse=options.output_schema is not None)
        path, where = self._path(model), call_name(model)
        updates = stream_updates(self, openai, path, body, request_options, turn, where)
        # Closed here, not left to the garbage collector, when the consumer stops early.
        async with contextlib.aclosing(updates):
            async for update in updates:
                yield update

    def request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions, *, stream: bool = False
    ) -> tuple[str, dict[str, Any], RequestOptions]:
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
        where = "OpenAIChatClient"
        schema = options.output_schema
        # No compaction of its own: another wire's summary stands in for what it replaced.
        sent = for_wire(messages, "openai.chat", None)[0]
        fields = {
            "messages": [message_to_wire(m, i) for i, m in enumerate(sent)],
            "tools": [tool_to_wire(t) for t in options.tools] or None,
            "temperature": options.temperature,
            "max_tokens": options.max_tokens,
            "tool_choice": tool_choice(options.tool_choice, nested=True),
            "response_format": None if schema is None else response_format(schema),
            "prompt_cache_key": prompt_cache_key(options),  # extra may name another
        }
        model = options.model or self.model
        body, request_options, extra = new_body(where, model, fields, options.extra)
        for key, value in extra.items():
            if key in _REFUSED_EXTRA:
                if value:
                    raise BadRequestError(
                        f"{where}: extra option {key!r} is not supported; "
                        "stream a run instead (agent.stream(...) or on_update=)"
                    )
            elif key == "messages":
                raise BadRequestError(
                    f"{where}: extra option 'messages' is not allowed; the messages are the run's"
                )
            else:
                body[key] = value
        if stream:  # the usage comes in a last chunk of its own
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return body["model"], body, request_options

    def _path(self, model: str) -> str:
        """The request path: Azure's client finds the deployment in the body only when
        the SDK's ``create`` sends it, so raf names it as the SDK would."""
        import openai

        if isinstance(self.client, openai.AsyncAzureOpenAI) and "/deployments" not in str(
            self.client.base_url.path
        ):
            return f"/deployments/{urllib.parse.quote(model, safe='')}/chat/completions"
        return "/chat/completions"

    def count_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Tool] = ()) -> int:
        """The tokens of a prompt (``messages`` and the declarations of ``tools``) with the
        model's own encoding (``o200k_base``, ``cl100k_base``), read from the files the
        ``bpe-openai`` package ships (extra ``raf-agents[tokens]``): no network. An unknown
        model, or no ``bpe-openai``, counts with :func:`raf.compression.approximate_tokens`."""
        return count_prompt(self.model, messages, tools)

    @property
    def token_encoding(self) -> str:
        """What :meth:`count_tokens` counts with: ``"o200k_base"``, ``"cl100k_base"`` or
        ``"approximate"``."""
        return counted_with(self.model)

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIChatClient(model={self.model!r}, base_url={str(self.client.base_url)!r})"


def message_to_wire(message: ChatMessage, index: int = 0) -> dict[str, Any]:
    """One message in the OpenAI wire format (``messages[index]`` of a call, for errors).

    >>> message_to_wire(ChatMessage.tool("call_1", "42"))
    {'role': 'tool', 'tool_call_id': 'call_1', 'content': '42'}
    """
    role = checked(message, index).role
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": message.content or "",
        }
    wire: dict[str, Any] = {"role": role}
    if role == "assistant" and message.tool_calls:
        wire["content"] = message.content
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    else:
        wire["content"] = message.content or ""
    if message.name is not None:
        wire["name"] = message.name
    return wire


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """A raf :class:`raf.Tool` as an OpenAI function tool with its JSON Schema."""
    function: dict[str, Any] = {"name": tool.name, "parameters": plain(tool.parameters)}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}
