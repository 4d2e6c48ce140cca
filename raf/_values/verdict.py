"""Verdict: what a guardrail's check says of a text; the context and the check it judges in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs

from raf.errors import GuardrailWhere

__all__ = ["GuardrailCheck", "GuardrailContext", "Verdict"]


def _check_text(instance: Verdict, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and type(value) is not str:
        raise TypeError(f"Verdict.{attribute.name} must be a str, got {value!r:.80}")


def _check_action(instance: Verdict, attribute: attrs.Attribute[Any], value: object) -> None:
    # Not attrs.validators.in_: its error's str() is a tuple with the Attribute's repr.
    if value not in ("allow", "block", "rewrite"):
        raise ValueError(f"Verdict.action must be allow, block or rewrite: {value!r}")


@attrs.frozen(slots=True)
class Verdict:
    """What a check says of a text: let it pass, block it (and why), or put another text
    in its place.

    >>> Verdict.allow()
    Verdict(action='allow', reason=None, text=None)
    >>> Verdict.block("a card number").reason
    'a card number'
    >>> Verdict.rewrite("[email]").text
    '[email]'
    """

    action: Literal["allow", "block", "rewrite"] = attrs.field(validator=_check_action)
    reason: str | None = attrs.field(default=None, validator=_check_text)
    text: str | None = attrs.field(default=None, validator=_check_text)

    def __attrs_post_init__(self) -> None:
        if (self.action == "rewrite") != (self.text is not None):
            raise ValueError("Verdict.text is the text of a rewrite, and only of a rewrite")

    @classmethod
    def allow(cls) -> Verdict:
        """The text passes as it is."""
        return _ALLOW

    @classmethod
    def block(cls, reason: str) -> Verdict:
        """The text must not go on: the run ends (input, output) or the call is refused
        (tool), with ``reason``."""
        return cls("block", reason=reason)

    @classmethod
    def rewrite(cls, text: str) -> Verdict:
        """``text`` goes on in place of the text checked."""
        return cls("rewrite", text=text)


_ALLOW = Verdict("allow")


@attrs.frozen(slots=True)
class GuardrailContext:
    """What a check knows besides the text it judges.

    ``guardrail`` is the guardrail's name; ``where`` what it checks
    (``"input"``, ``"output"``, ``"tool_arguments"``, ``"tool_result"``).
    For a streamed answer, the text checked is the window held back, and
    ``before`` is everything released before it, as the consumer saw it
    (rewrites included): ``context.before + text`` is the answer so far,
    for a check that judges in context. ``final`` is false while more of
    the answer may follow. ``request`` is the run's :class:`raf.Invocation`,
    the model call's :class:`raf.ChatRequest` or the tool call's
    :class:`raf.ToolRequest`.
    """

    guardrail: str
    where: GuardrailWhere
    before: str = ""
    final: bool = True
    request: Any = attrs.field(default=None, repr=False, eq=False)


@attrs.frozen(slots=True)
class GuardrailCheck:
    """One check about to run, as an observer's ``guardrail`` hook sees it: the ``text``
    judged (a streamed answer's held window) and its :class:`GuardrailContext`."""

    text: str
    context: GuardrailContext


#: A check: ``async (text, context) -> Verdict``.
Check = Callable[[str, GuardrailContext], Awaitable[Verdict]]
