"""The ``[[guardrails]]`` of a config file built into guardrails, each for its stack.

::

    [[guardrails]]
    kind = "output"          # "input", "output" or "tool": what it checks
    check = "pii_redactor"   # a built-in check, or "package.module:check"
    entities = ["email", "card"]   # pii_redactor's option
    hold_back = 200          # output only
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from raf._config.declarations import (
    ContextProviderDecl,
    ProviderOptions,
    _built,
    import_object,
)
from raf._config.models import GUARDRAIL_OPTIONS, option_error
from raf._middleware.guardrails import InputGuardrail, OutputGuardrail, ToolGuardrail
from raf._middleware.pii import pii_redactor
from raf._values.verdict import Check
from raf.errors import ConfigError

__all__: list[str] = []

#: The built-in checks by name: each a factory of the check from its options.
CHECKS: Final[dict[str, Callable[..., Check]]] = {"pii_redactor": pii_redactor}


def build_guardrail(decl: ContextProviderDecl) -> Any:
    """The guardrail ``decl`` declares; its ``kind`` says which stack it belongs in
    (``input``: ``stack``, ``output``: ``chat_stack``, ``tool``: ``tool_stack``)."""
    model = GUARDRAIL_OPTIONS.get(decl.kind)
    if model is None:
        raise ConfigError(
            f"unknown guardrail kind {decl.kind!r}; known kinds: {', '.join(GUARDRAIL_OPTIONS)} "
            "(what the guardrail checks: the request, the answer, the tool calls)"
        )
    return _built(_factory, ProviderOptions(decl, what="guardrail"), f"guardrail {decl.kind!r}")


def _factory(o: ProviderOptions) -> Any:
    options = o.parse(GUARDRAIL_OPTIONS[o.kind])
    check = _check(o, options.check, options.entities)
    name = o.name
    if o.kind == "input":
        return InputGuardrail(check, name=name)
    if o.kind == "output":
        return OutputGuardrail(check, hold_back=options.hold_back, name=name)
    return ToolGuardrail(check, name=name)


def _check(o: ProviderOptions, spec: str, entities: list[str] | None) -> Check:
    """The check ``spec`` names: a built-in (built with its options) or an import path."""
    factory = CHECKS.get(spec)
    if factory is not None:
        return factory() if entities is None else factory(entities=entities)
    if ":" not in spec:
        known = ", ".join(sorted(CHECKS))
        raise option_error(o.where, "check", f"a built-in check ({known}) or an import path", spec)
    if entities is not None:
        raise ConfigError(f"{o.where}: option 'entities' is pii_redactor's, not {spec!r}'s")
    check = import_object(spec, base_dir=o.decl.base_dir, what="check")
    if not callable(check):
        raise option_error(o.where, "check", "an async function (text, context) -> Verdict", spec)
    return check  # type: ignore[no-any-return]
