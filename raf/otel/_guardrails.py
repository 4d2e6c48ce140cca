"""The span of one guardrail check: ``guardrail {name}``, with its verdict."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, Tracer

from raf._onion.observe import RunCheck
from raf._values.verdict import GuardrailCheck, Verdict
from raf.otel._spans import attach, failed

__all__: list[str] = []


async def guardrail_span(
    tracer: Tracer, check: GuardrailCheck, call_next: RunCheck, *, capture: bool
) -> Verdict:
    """``call_next()``, the check, inside its span.

    Attributes: ``raf.guardrail.name``, ``raf.guardrail.where``,
    ``raf.guardrail.text.length`` (the text judged: a streamed answer's
    window), ``raf.guardrail.verdict`` (``allow``, ``block``, ``rewrite``),
    ``raf.guardrail.reason`` on a block; with ``capture``, the text itself
    (``raf.guardrail.text``) and a rewrite's (``raf.guardrail.rewrite``). A
    block is the check doing its job: the span keeps an unset status (the
    run's span carries the :class:`raf.GuardrailError`); a check that
    raises gets status ERROR.
    """
    context = check.context
    attributes: dict[str, str | int] = {
        "raf.guardrail.name": context.guardrail,
        "raf.guardrail.where": context.where,
        "raf.guardrail.text.length": len(check.text),
    }
    if capture:
        attributes["raf.guardrail.text"] = check.text
    span = tracer.start_span(
        f"guardrail {context.guardrail}", kind=SpanKind.INTERNAL, attributes=attributes
    )
    token = attach(span)
    try:
        verdict = await call_next()
        span.set_attribute("raf.guardrail.verdict", verdict.action)
        if verdict.reason is not None:
            span.set_attribute("raf.guardrail.reason", verdict.reason)
        if capture and verdict.text is not None:
            span.set_attribute("raf.guardrail.rewrite", verdict.text)
        return verdict
    except BaseException as error:
        failed(span, error)
        raise
    finally:
        if token is not None:
            otel_context.detach(token)
        span.end()
