"""OpenAIEmbedder: vectors of texts from the OpenAI embeddings API, on the openai SDK."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Self

import anyio

from raf._clients._sdk import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_TIMEOUT,
    error_from_sdk,
    sdk_client,
)
from raf.errors import ChatTimeoutError, EmbeddingError

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIEmbedder"]

#: The most texts one request carries (the API takes up to 2048 inputs).
MAX_BATCH: Final = 256


class OpenAIEmbedder:
    """An embedder on ``openai.AsyncOpenAI``: ``client.embeddings.create``.

    ``model`` is the embedding model (``"text-embedding-3-small"``);
    ``dimensions`` asks a model that can shorten its vectors for that many.
    ``base_url`` and ``api_key`` default to ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY``, as with the SDK, so any OpenAI-compatible server
    works; ``client`` is an ``AsyncOpenAI`` you built yourself (closing it is
    then yours). ``timeout`` bounds each call in seconds, the SDK's retries
    included. Texts go in batches of at most :data:`MAX_BATCH`.

    Every vector must have the dimension of the first ones this embedder
    got: an answer with another (the model changed behind its name), with a
    vector that is not finite numbers, or with not one vector per text is a
    :class:`raf.errors.EmbeddingError`; failures of the call are
    :class:`raf.ChatClientError` subclasses, as for the chat clients.
    """

    #: The provider, as OpenTelemetry's ``gen_ai.provider.name`` names it.
    provider_name: Final = "openai"

    def __init__(
        self,
        model: str,
        *,
        dimensions: int | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        import openai

        if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
            raise ValueError(f"OpenAIEmbedder: dimensions must be an int >= 1, got {dimensions!r}")
        self.model, self.dimensions, self.timeout = model, dimensions, timeout
        # What raf's SDK plumbing checks of a client: replies are parsed by the SDK here.
        self.idle_timeout: float | None = None
        self.max_response_bytes = DEFAULT_MAX_RESPONSE_BYTES
        self._owns_client = client is None
        self.client = sdk_client(
            self, openai, "AsyncOpenAI", base_url, api_key, max_retries, client
        )
        #: The dimension of the vectors seen so far (``None`` before the first).
        self.dimension: int | None = dimensions

    async def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        """One vector per text, in order."""
        if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
            raise TypeError("OpenAIEmbedder.embed(texts) takes a sequence of str")
        vectors: list[tuple[float, ...]] = []
        for start in range(0, len(texts), MAX_BATCH):
            vectors += await self._batch(list(texts[start : start + MAX_BATCH]))
        return vectors

    async def _batch(self, texts: list[str]) -> list[tuple[float, ...]]:
        import openai

        where = f"OpenAI embeddings (model {self.model!r})"
        extra: dict[str, Any] = {} if self.dimensions is None else {"dimensions": self.dimensions}
        with anyio.move_on_after(self.timeout):
            try:
                reply = await self.client.embeddings.create(
                    model=self.model, input=texts, encoding_format="float", **extra
                )
            except openai.APIError as exc:
                raise error_from_sdk(exc, where, openai) from exc
            return self._vectors(reply.data, len(texts), where)
        raise ChatTimeoutError(
            f"{where} did not finish within {self.timeout} s "
            f"(OpenAIEmbedder(timeout={self.timeout}), the SDK's retries included)"
        )

    def _vectors(self, data: Sequence[Any], count: int, where: str) -> list[tuple[float, ...]]:
        """The reply's vectors in the order of the texts, each checked."""
        if len(data) != count or sorted(item.index for item in data) != list(range(count)):
            raise EmbeddingError(f"{where}: {len(data)} vectors (indexes) for {count} texts")
        vectors: list[tuple[float, ...]] = [()] * count
        for item in data:
            vector = item.embedding
            if not isinstance(vector, list) or not vector:
                raise EmbeddingError(f"{where}: vector {item.index} is not a list of numbers")
            try:
                floats = tuple(float(x) for x in vector)
            except (TypeError, ValueError):
                raise EmbeddingError(f"{where}: vector {item.index} holds a non-number") from None
            if not all(math.isfinite(x) for x in floats):
                raise EmbeddingError(f"{where}: vector {item.index} holds NaN or infinity")
            if self.dimension is None:
                self.dimension = len(floats)
            if len(floats) != self.dimension:
                raise EmbeddingError(
                    f"{where}: vector {item.index} has {len(floats)} dimensions, the model's "
                    f"earlier vectors {self.dimension}: vectors of two dimensions cannot be "
                    "compared (did the model behind the name change?)"
                )
            vectors[item.index] = floats
        return vectors

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.model!r})"
