"""OpenAIResponsesClient: a chat model behind the OpenAI Responses API (``POST /responses``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Self

from raf._clients._reply import replayed, stream_updates
from raf._clients._responses_reply import (
    SOURCE,
    StreamState,
    call_name,
    compaction_from_reply,
    response_from_reply,
)
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
from raf._values.carried import Compaction
from raf._values.compacted import for_wire, own_compaction
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions
from raf._values.protocols import Tool
from raf._values.schema import text_format
from raf.errors import BadRequestError

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIResponsesClient"]

# Keys of the body that are the run's own, never an option's.
_OWN_KEYS: Final = frozenset({"input", "stream", "stream_options"})
_REASONING_INCLUDE: Final = "reasoning.encrypted_content"
#: The fields of a compaction input item (the SDK's ``ResponseCompactionItemParamParam``).
_COMPACTION_INPUT: Final = frozenset({"type", "encrypted_content", "id"})


class OpenAIResponsesClient:
    """A :class:`raf.StreamingChatClient` on the OpenAI Responses API (``POST /responses``).

    The keywords are those of :class:`raf.OpenAIChatClient` (``base_url``,
    ``api_key``, ``max_retries``, ``timeout``, ``idle_timeout``,
    ``max_response_bytes``, ``client``), with the same bounds, errors and
    ``retryable``, plus ``store``.

    ``store=False`` (the default) keeps nothing on the server: every request
    sends the whole conversation and asks for the reasoning items in
    encrypted form (``include=["reasoning.encrypted_content"]``). The reasoning
    items of a reply are kept on its assistant message (``ChatMessage.reasoning``,
    source ``"openai.responses"``, in their order among the text and the calls)
    and sent back unchanged with that turn in later requests, so a reasoning
    model keeps its chain of thought across tool calls without server-side
    state, also when the history comes back from a session store.

        async with OpenAIResponsesClient("gpt-5-mini") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    #: The provider, as OpenTelemetry's ``gen_ai.provider.name`` names it.
    provider_name: Final = "openai"
    #: The source of the compaction items its server makes (see :class:`raf.Compaction`).
    compaction_source: Final = SOURCE

    def __init__(
        self,
        model: str,
        *,
        store: bool = False,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        idle_timeout: float | None = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        import openai

        if type(store) is not bool:
            raise ValueError(f"OpenAIResponsesClient: store must be True or False, got {store!r}")
        self.model, self.timeout, self.idle_timeout = model, timeout, idle_timeout
        self.max_response_bytes, self.store = max_response_bytes, store
        self._owns_client = client is None
        self.client = sdk_client(
            self, openai, "AsyncOpenAI", base_url, api_key, max_retries, client
        )

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one Responses API request and return the model's turn."""
        import openai

        model, body, request_options = self.request_body(messages, options)
        where = call_name(model)
        data, content_type = await call(self, openai, "/responses", body, request_options, where)
        refuse = options.output_schema is not None
        return response_from_reply(data, content_type, model, refuse=refuse)

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The model's turn as it comes (``"stream": true``), update by update.

        Text deltas (``response.output_text.delta``), each function call once
        its arguments are done, and the usage of ``response.completed``. A
        ``response.failed``, ``response.incomplete`` or ``error`` event is a
        :class:`raf.ChatClientError` (not retryable); a stream that ends
        before one of them or ``response.completed`` is a
        :class:`raf.errors.ChatConnectionError`.
        """
        import openai

        model, body, request_options = self.request_body(messages, options, stream=True)
        state = StreamState(model, refuse=options.output_schema is not None)
        where = call_name(model)
        # Closed here, not left to the garbage collector, when the consumer stops early.
        updates = stream_updates(self, openai, "/responses", body, request_options, state, where)
        async with contextlib.aclosing(updates):
            async for update in updates:
                yield update

    async def compact(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Compaction:
        """Compact the conversation on the server (``POST /responses/compact``): the
        model, the input items and the ``prompt_cache_key`` a call of ``messages`` with
        ``options`` sends (so the compaction reads that call's cache; the endpoint takes
        no tools), and the compaction item of the reply (see :class:`raf.Compaction`).
        Only the transport options of ``options.extra`` go with it (``timeout``,
        ``extra_headers``, ``extra_query``); the errors are those of :meth:`complete`.
        """
        import openai

        model, sent, request_options = self.request_body(messages, options)
        keys = ("model", "input", "prompt_cache_key")
        body = {key: sent[key] for key in keys if key in sent}
        where = call_name(model)
        data, content_type = await call(
            self, openai, "/responses/compact", body, request_options, where
        )
        return compaction_from_reply(data, content_type, model)

    def request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions, *, stream: bool = False
    ) -> tuple[str, dict[str, Any], RequestOptions]:
        """The model, the body and the SDK request options of one call, as
        :meth:`raf.OpenAIChatClient.request_body` builds them (``options.extra``
        included; an ``include`` list there is added to raf's own), with the reasoning
        kept on the assistant messages replayed into their turns, the history sent from
        its last compaction on (see :func:`input_items`), and, with
        ``options.compact_threshold``, ``context_management`` asking the server to
        compact past it.
        """
        where = "OpenAIResponsesClient"
        schema = options.output_schema
        threshold = options.compact_threshold
        fields = {
            "input": input_items(for_wire(messages, SOURCE, None)[0]),
            "tools": [tool_to_wire(t) for t in options.tools] or None,
            "temperature": options.temperature,
            "max_output_tokens": options.max_tokens,
            "tool_choice": tool_choice(options.tool_choice, nested=False),
            "text": None if schema is None else {"format": text_format(schema)},
            "store": self.store,
            "prompt_cache_key": prompt_cache_key(options),  # extra may name another
            "context_management": None
            if threshold is None
            else [{"type": "compaction", "compact_threshold": threshold}],
        }
        model = options.model or self.model
        body, request_options, extra = new_body(where, model, fields, options.extra)
        include = [] if self.store else [_REASONING_INCLUDE]
        for key, value in extra.items():
            if key in _OWN_KEYS:
                raise BadRequestError(
                    f"{where}: extra option {key!r} is not allowed; "
                    "the input is the run's messages, and stream() is how to stream"
                )
            elif key == "include":
                if not isinstance(value, list | tuple) or not all(
                    isinstance(v, str) for v in value
                ):
                    raise BadRequestError(
                        f"{where}: extra option 'include' must be a list of str, got {value!r}"
                    )
                include += [v for v in value if v not in include]
            elif key == "text" and isinstance(value, Mapping) and "text" in body:
                body["text"] = {**body["text"], **value}  # verbosity and the like, with the format
            else:
                body[key] = value
        if include:
            body["include"] = include
        if stream:
            body["stream"] = True
        return body["model"], body, request_options

    def count_tokens(self, messages: Sequence[ChatMessage], tools: Sequence[Tool] = ()) -> int:
        """The tokens of a prompt, as :meth:`raf.OpenAIChatClient.count_tokens` counts them."""
        return count_prompt(self.model, messages, tools)

    @property
    def token_encoding(self) -> str:
        """What :meth:`count_tokens` counts with (see :class:`raf.OpenAIChatClient`)."""
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
        return (
            f"OpenAIResponsesClient(model={self.model!r}, "
            f"base_url={str(self.client.base_url)!r}, store={self.store})"
        )


# --- Messages to input items ------------------------------------------------------------


def input_items(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The Responses API ``input`` of a conversation.

    System, user and assistant text are messages (``{"role", "content"}``; the
    API has no message names, so ``name`` is not sent); an assistant's tool
    calls are ``function_call`` items and tool messages ``function_call_output``
    items, joined by ``call_id``. An assistant turn's reasoning items (its
    ``reasoning`` of source ``"openai.responses"``) go back in their place, and its
    compaction item (its ``compaction`` of that source) before them: the caller sends
    a history that holds one from that message on (:func:`for_wire`).

    >>> input_items([ChatMessage.user("hi"), ChatMessage.tool("c1", "42")])
    [{'role': 'user', 'content': 'hi'},
     {'type': 'function_call_output', 'call_id': 'c1', 'output': '42'}]
    """
    items: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        role = checked(message, index).role
        if role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": message.content or "",
                }
            )
        elif role == "assistant" and (
            message.tool_calls or message.reasoning is not None or message.compaction is not None
        ):
            items += compaction_item(message, index)
            # Its reasoning items (if they are this wire's) in the order the reply had,
            # today's text where the text was, and its calls.
            calls = {
                c.id: {
                    "type": "function_call",
                    "call_id": c.id,
                    "name": c.name,
                    "arguments": c.arguments,
                }
                for c in message.tool_calls
            }
            bare = not calls and message.reasoning is None
            content = message.content if calls or bare else message.content or ""
            text = [] if content is None else [{"role": "assistant", "content": content}]
            kinds = ("message", "function_call", "call_id")
            items += replayed(message, index, SOURCE, kinds, text, calls)
        else:
            items.append({"role": role, "content": message.content or ""})
    return items


def compaction_item(message: ChatMessage, index: int) -> list[dict[str, Any]]:
    """The compaction item an assistant turn carries for this wire, as the input item it
    is (``type``, ``encrypted_content``, ``id``: what came, less the output's own metadata
    such as ``created_by``, which an input item does not have); none for another wire's,
    or none at all."""
    item = own_compaction(message, index, SOURCE, "compaction item")
    if item is None:
        return []
    return [{key: value for key, value in item.items() if key in _COMPACTION_INPUT}]


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """A raf :class:`raf.Tool` as a Responses API function tool.

    ``strict`` is false, as with chat completions: raf checks the arguments
    itself, and a strict schema would refuse optional parameters.
    """
    wire: dict[str, Any] = {"type": "function", "name": tool.name}
    if tool.description:
        wire["description"] = tool.description
    wire["parameters"] = plain(tool.parameters)
    wire["strict"] = False
    return wire
