"""The OpenTelemetry spans of guardrail checks: an observer that ``raf.otel.instrument`` adds.

Kept apart from ``raf.otel`` so it moves as one piece. Imported by
``raf.otel`` only (it needs ``opentelemetry-api``).
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer

from raf._onion.observe import Observer, RunCheck
from raf._values.verdict import GuardrailCheck, Verdict

__all__: list[str] = []


class GuardrailSpans(Observer):
    """``guardrail {name}`` around each check of a guardrail, with its verdict.

    Opened only inside a recorded span (the run's, a model or tool call's),
    as raf.otel's other spans are. Attributes: ``raf.guardrail.name``,
    ``raf.guardrail.where``, ``raf.guardrail.text.length`` (the text judged:
    a streamed answer's window), ``raf.guardrail.verdict`` (``allow``,
    ``block``, ``rewrite``), ``raf.guardrail.reason`` on a block; with
    ``capture``, the text itself (``raf.guardrail.text``) and a rewrite's
    (``raf.guardrail.rewrite``). A block is the check doing its job: the
    span keeps an unset status (the run's span carries the
    :class:`raf.GuardrailError`); a check that raises gets status ERROR.
    """

    __slots__ = ("capture", "tracer")

    def __init__(self, tracer: Tracer, capture: bool) -> None:
        self.tracer = tracer
        self.capture = capture

    async def guardrail(self, check: GuardrailCheck, call_next: RunCheck) -> Verdict:
        """The check inside its span."""
        if not trace.get_current_span().is_recording():
            return await call_next()
        context = check.context
        attributes: dict[str, str | int] = {
            "raf.guardrail.name": context.guardrail,
            "raf.guardrail.where": context.where,
            "raf.guardrail.text.length": len(check.text),
        }
        if self.capture:
            attributes["raf.guardrail.text"] = check.text
        with self.tracer.start_as_current_span(
            f"guardrail {context.guardrail}", kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            verdict = await call_next()
            span.set_attribute("raf.guardrail.verdict", verdict.action)
            if verdict.reason is not None:
                span.set_attribute("raf.guardrail.reason", verdict.reason)
            if self.capture and verdict.text is not None:
                span.set_attribute("raf.guardrail.rewrite", verdict.text)
            return verdict
