"""OpenAIResponsesClient: a chat model behind the OpenAI Responses API (``POST /responses``)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

from raf._clients._responses_reply import (
    StreamState,
    call_name,
    response_from_reply,
)
from raf._clients._responses_wire import Turn, request_body
from raf._clients._sdk import SdkClient
from raf._clients._sse import stream_updates
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions

__all__ = ["OpenAIResponsesClient"]

# How many tool-call turns a client remembers the reasoning items of.
_TURNS_KEPT: Final = 1024


class OpenAIResponsesClient(SdkClient):
    """A :class:`raf.StreamingChatClient` on the OpenAI Responses API (``POST /responses``).

    The keywords are those of :class:`raf.OpenAIChatClient` (``base_url``,
    ``api_key``, ``max_retries``, ``timeout``, ``max_response_bytes``,
    ``client``), with the same errors and ``retryable``, plus ``store``.

    ``store=False`` (the default) keeps nothing on the server: every request
    sends the whole conversation and asks for the reasoning items in
    encrypted form (``include=["reasoning.encrypted_content"]``). The client
    remembers the reasoning items of each reply that calls tools, by the
    calls' ids, and sends them back before those calls on the next request of
    the tool loop, so a reasoning model keeps its chain of thought across tool
    calls without server-side state.

    ``timeout`` bounds a whole plain call (the request, the SDK's retries,
    the reading of the reply), and a stream until it starts; ``idle_timeout``
    each wait on a stream's next event after that (``None``: no bound), so a
    long answer that keeps coming is never cut; time a stream's consumer
    spends between updates does not count. ``max_response_bytes`` bounds the reply,
    or the whole stream, once decompressed.

        async with OpenAIResponsesClient("gpt-5-mini") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    def __init__(self, model: str, *, store: bool = False, **keywords: Any) -> None:
        if type(store) is not bool:
            raise ValueError(f"OpenAIResponsesClient: store must be True or False, got {store!r}")
        super().__init__(model, **keywords)
        self.store = store
        # Reasoning to replay, by the first call id of the turn it came with (oldest first).
        self._turns: collections.OrderedDict[str, Turn] = collections.OrderedDict()

    # --- complete -----------------------------------------------------------------------

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one Responses API request and return the model's turn."""
        model, body, request_options = self.request_body(messages, options)
        data, content_type = await self._call("/responses", body, request_options, call_name(model))
        answer, turn = response_from_reply(
            data, content_type, model, refuse=options.output_schema is not None
        )
        self._remember(turn)
        return answer

    # --- stream -------------------------------------------------------------------------

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The model's turn as it comes (``"stream": true``), update by update.

        Text deltas (``response.output_text.delta``), each function call once
        its arguments are done, and the usage of ``response.completed``. A
        ``response.failed``, ``response.incomplete`` or ``error`` event is a
        :class:`raf.ChatClientError` (not retryable); a stream that ends
        before one of them or ``response.completed`` is a
        :class:`raf.ChatConnectionError`.
        """
        model, body, request_options = self.request_body(messages, options, stream=True)
        state = StreamState(model, self._remember, refuse=options.output_schema is not None)
        where = call_name(model)
        # Closed here, not left to the garbage collector, when the consumer stops early.
        updates = stream_updates(self, "/responses", body, request_options, state, where)
        async with contextlib.aclosing(updates):
            async for update in updates:
                yield update

    # --- the request --------------------------------------------------------------------

    def request_body(
        self, messages: Sequence[ChatMessage], options: ChatOptions, *, stream: bool = False
    ) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """The model, the body (plain dicts and lists) and the SDK request options of one
        call, built and sent as :meth:`raf.OpenAIChatClient.request_body` says, with the
        reasoning this client remembers replayed into its turns. ``stream`` adds
        ``"stream": true``.

        ``options.extra`` is applied last, as with :class:`raf.OpenAIChatClient`:
        ``timeout``, ``extra_headers``, ``extra_query`` and ``extra_body`` as the
        SDK understands them, any other key into the body; an ``include`` list
        is added to raf's own.
        """
        return request_body(self.model, self.store, messages, options, self._turns, stream=stream)

    def _remember(self, turn: Turn | None) -> None:
        if turn is None or not turn.call_ids:
            return
        key = turn.call_ids[0]
        self._turns[key] = turn
        self._turns.move_to_end(key)
        while len(self._turns) > _TURNS_KEPT:
            self._turns.popitem(last=False)

    def __repr__(self) -> str:
        return (
            f"OpenAIResponsesClient(model={self.model!r}, "
            f"base_url={str(self.client.base_url)!r}, store={self.store})"
        )
