"""What raf.otel reads off a model call (its server; the response's id, model and finish
reasons, from a reply or from a stream's chunks) and the GenAI client metrics it records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter

    from raf._observers.ledger import LedgerEntry
    from raf._values.messages import AgentResponse, Update

__all__: list[str] = []

#: The GenAI conventions' advisory bucket boundaries (seconds, tokens).
_DURATION_BUCKETS: Final = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
_TOKEN_BUCKETS: Final = tuple(4**n for n in range(14))


def server_of(client: object) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of a client with an SDK ``base_url``."""
    base_url = getattr(getattr(client, "client", None), "base_url", None)
    host = getattr(base_url, "host", None)
    if not isinstance(host, str) or not host:
        return {}
    port = getattr(base_url, "port", None)
    if not isinstance(port, int):
        port = {"https": 443, "http": 80}.get(str(getattr(base_url, "scheme", "")))
    return {"server.address": host, "server.port": port} if port else {"server.address": host}


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else getattr(value, key, None)


class Details:
    """The response's ``id``, ``model`` and finish reasons, as a call shows them."""

    __slots__ = ("finish_reasons", "id", "model")

    def __init__(self) -> None:
        self.id: str | None = None
        self.model: str | None = None
        self.finish_reasons: list[str] = []

    def see(self, update: Update) -> None:
        """What one streamed update's raw chunk (chat) or event (Responses) says."""
        raw = update.raw
        if not isinstance(raw, Mapping):
            return
        response = raw.get("response")
        if isinstance(response, Mapping):  # a Responses event that carries the response
            self._read(response, responses=True)
            return
        self._read(raw, responses=False)

    def read(self, response: AgentResponse) -> None:
        """What a whole response's ``raw`` says (a ChatCompletion or a Response); for a
        streamed one, whose chunk with the finish reason carries no update, the reason
        of an answer returned as complete (an unfinished one is an error): ``tool_calls``
        or ``stop``."""
        raw = response.raw
        if raw is not None:
            self._read(raw, responses=_get(raw, "object") == "response" or _get(raw, "output"))
        if response.model:  # the model that answered, when a FallbackMiddleware says
            self.model = response.model
        if not self.finish_reasons:
            last = response.messages[-1] if response.messages else None
            self.finish_reasons = ["tool_calls" if last is not None and last.tool_calls else "stop"]

    def _read(self, raw: Any, *, responses: Any) -> None:
        for key in ("id", "model"):
            value = _get(raw, key)
            if isinstance(value, str) and value:
                setattr(self, key, value)
        if responses:
            status = _get(raw, "status")
            if status == "completed":
                calls = any(
                    _get(item, "type") == "function_call" for item in _get(raw, "output") or ()
                )
                self.finish_reasons = ["tool_calls" if calls else "stop"]
            elif status == "incomplete":
                reason = _get(_get(raw, "incomplete_details"), "reason")
                self.finish_reasons = [str(reason or "incomplete")]
            return
        reasons = [_get(choice, "finish_reason") for choice in _get(raw, "choices") or ()]
        found = [reason for reason in reasons if isinstance(reason, str)]
        if found:
            self.finish_reasons = found


class Metrics:
    """The ``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage`` histograms."""

    __slots__ = ("duration", "tokens")

    def __init__(self, meter: Meter) -> None:
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS),
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Measures number of input and output tokens used",
            explicit_bucket_boundaries_advisory=list(_TOKEN_BUCKETS),
        )

    def record(
        self, seconds: float, attributes: dict[str, Any], response: AgentResponse | None
    ) -> None:
        """One model call: its duration, and its tokens when it reported usage."""
        self.duration.record(seconds, attributes)
        usage = response.usage if response is not None else None
        if usage is None:
            return
        self.tokens.record(usage.input_tokens, {**attributes, "gen_ai.token.type": "input"})
        self.tokens.record(usage.output_tokens, {**attributes, "gen_ai.token.type": "output"})


def ledger_attributes(entry: LedgerEntry) -> dict[str, Any]:
    """A ledger's figures of one model call, as ``chat`` span attributes (``raf.context.*``)."""
    attributes: dict[str, Any] = {
        "raf.context.input_tokens": entry.input_tokens,
        "raf.context.counted_by": entry.counted_by,
        "raf.context.shared_prefix_tokens": entry.shared_prefix_tokens,
        "raf.context.parts": [f"{p.layer}/{p.region}={p.tokens}" for p in entry.parts],
    }
    if entry.reported_cached_tokens is not None:
        attributes["raf.context.reported_cached_tokens"] = entry.reported_cached_tokens
    if entry.broken_by is not None:
        attributes["raf.context.broken_by"] = entry.broken_by.layer
        attributes["raf.context.broken_region"] = entry.broken_by.region
    return attributes
