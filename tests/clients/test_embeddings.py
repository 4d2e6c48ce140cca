"""OpenAIEmbedder against a real HTTP server on loopback, through the real SDK."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from raf import OpenAIEmbedder
from raf.errors import AuthenticationError, EmbeddingError, RateLimitError
from tests._harness.openai_server import OpenAIServer, embeddings

pytestmark = pytest.mark.anyio


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    running = OpenAIServer()
    yield running
    running.close()


def embedder(server: OpenAIServer, **kwargs: object) -> OpenAIEmbedder:
    return OpenAIEmbedder(
        "text-embedding-3-small", base_url=server.base_url, api_key="sk-test", **kwargs
    )


def test_the_loopback_body_is_what_the_sdk_itself_parses() -> None:
    # The harness's reply is checked against the SDK's own type first, strictly: a field
    # the SDK does not know, or one of the wrong type, fails here, not in the tests below.
    body = embeddings([0.1, 0.2], [0.3, 0.4], order=[1, 0])
    parsed = openai.types.CreateEmbeddingResponse.model_validate(body, strict=True)
    assert [item.index for item in parsed.data] == [1, 0]
    assert parsed.data[1].embedding == [0.1, 0.2]
    assert set(body) == set(openai.types.CreateEmbeddingResponse.model_fields)


async def test_texts_go_to_v1_embeddings_and_vectors_come_back_in_order(
    server: OpenAIServer,
) -> None:
    server.embed([1.0, 0.0], [0.0, 1.0], [0.5, 0.5], order=[2, 0, 1])
    async with embedder(server, dimensions=2) as model:
        vectors = await model.embed(["tea", "coffee", "water"])
    assert vectors == [(1.0, 0.0), (0.0, 1.0), (0.5, 0.5)]
    [request] = server.requests
    assert request.path == "/v1/embeddings"
    assert request.body == {
        "model": "text-embedding-3-small",
        "input": ["tea", "coffee", "water"],
        "encoding_format": "float",
        "dimensions": 2,
    }
    assert request.headers["authorization"] == "Bearer sk-test"


async def test_a_dimension_that_changes_between_calls_is_a_clear_error(
    server: OpenAIServer,
) -> None:
    server.embed([1.0, 0.0, 0.0])
    server.embed([1.0, 0.0])
    async with embedder(server) as model:
        assert await model.embed(["a"]) == [(1.0, 0.0, 0.0)]
        with pytest.raises(EmbeddingError, match="has 2 dimensions, the model's earlier vectors 3"):
            await model.embed(["b"])


async def test_vectors_of_two_dimensions_in_one_answer_are_refused(server: OpenAIServer) -> None:
    server.embed([1.0, 0.0], [1.0])
    async with embedder(server) as model:
        with pytest.raises(EmbeddingError, match="dimensions"):
            await model.embed(["a", "b"])


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (embeddings([1.0]), "1 vectors"),  # one vector for two texts
        (embeddings([1.0], [2.0], order=[0, 0]), "indexes"),
        (embeddings([1.0], ["x"]), "non-number"),  # type: ignore[list-item]
        (embeddings([1.0], []), "not a list of numbers"),
    ],
)
async def test_an_answer_that_is_not_one_vector_per_text_is_refused(
    server: OpenAIServer, body: dict[str, object], problem: str
) -> None:
    server.answer(body)
    async with embedder(server) as model:
        with pytest.raises(EmbeddingError, match=problem):
            await model.embed(["a", "b"])


async def test_http_errors_are_rafs_client_errors(server: OpenAIServer) -> None:
    server.fail(401, "bad key")
    server.fail(429, "slow down")
    async with embedder(server, max_retries=0) as model:
        with pytest.raises(AuthenticationError, match=r"OpenAI embeddings .* HTTP 401"):
            await model.embed(["a"])
        with pytest.raises(RateLimitError):
            await model.embed(["a"])


async def test_many_texts_go_in_batches(server: OpenAIServer) -> None:
    texts = [f"text {n}" for n in range(300)]
    server.embed(*([float(n)] for n in range(256)))
    server.embed(*([float(n)] for n in range(256, 300)))
    async with embedder(server) as model:
        vectors = await model.embed(texts)
    assert [v[0] for v in vectors] == [float(n) for n in range(300)]
    assert [len(r.body["input"]) for r in server.requests] == [256, 44]


def test_bad_arguments_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="dimensions"):
        OpenAIEmbedder("m", api_key="k", dimensions=0)
    with pytest.raises(ValueError, match="model"):
        OpenAIEmbedder("", api_key="k")
