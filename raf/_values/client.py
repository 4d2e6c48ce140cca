"""The ChatClient protocol: messages and options in, the model's turn out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from raf._values.carried import Compaction
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions

__all__ = ["ChatClient", "StreamingChatClient"]


@runtime_checkable
class ChatClient(Protocol):
    """A chat model: messages and options in, the model's turn out.

    The response's ``messages`` hold the assistant turn (text, tool calls or
    both); failures are :class:`raf.ChatClientError` subclasses.
    A client may also have ``stream`` (see :class:`StreamingChatClient`); a
    streamed run of a client without it sends the answer of ``complete`` as
    updates once it has come.
    """

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse: ...


@runtime_checkable
class StreamingChatClient(ChatClient, Protocol):
    """A chat client that can also send its turn as it comes.

    ``stream`` returns an async iterator (an async generator, typically) of
    :class:`raf.Update`: text deltas, each tool call once its arguments are
    complete, and the call's usage. ``AgentResponse.from_updates`` of what it
    yields must equal what ``complete`` returns for the same answer. raf
    closes the iterator with ``aclose()`` when the run stops early, so a
    generator's ``finally`` is where the connection is released.
    """

    def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The model's turn, update by update."""
        ...


@runtime_checkable
class CompactingChatClient(ChatClient, Protocol):
    """A chat client whose server compacts a conversation itself, on demand.

    ``compaction_source`` is the :attr:`raf.Compaction.source` of its items; a
    client that has it asks its server to compact past
    ``ChatOptions.compact_threshold``. ``compact`` compacts ``messages`` now, as a
    call of them with ``options`` would send them (so it reads that call's cache),
    and returns the server's item (:class:`raf.OpenAIResponsesClient`:
    ``POST /responses/compact``).
    """

    compaction_source: str

    async def compact(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> Compaction: ...
class Embedder(Protocol):
    """A text embedding model: texts in, one vector each out, in the same order.

    Every vector of one embedder has the same dimension; one that does not
    fit (a count or a dimension that changed) is a :class:`raf.errors.EmbeddingError`.
    :class:`raf.OpenAIEmbedder` is one.
    """

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]: ...
