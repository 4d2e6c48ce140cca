"""Decision: a person's answer to a tool call that waits for approval."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Decision"]


def _check_token(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not str or not value:
        raise TypeError(f"Decision.token must be a non-empty str, got {value!r:.80}")


def _check_approve(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not True and value is not False:
        raise TypeError(f"Decision.approve must be True or False, got {value!r:.80}")


def _check_reason(instance: Decision, attribute: attrs.Attribute[Any], value: object) -> None:
    # Validators run once every field is set: approve is there, and checked.
    if value is not None and type(value) is not str:
        raise TypeError(f"Decision.reason must be a str or None, got {value!r:.80}")
    if instance.approve and value is not None:
        raise ValueError("Decision.reason is a refusal's reason: give it with approve=False")


@attrs.frozen(slots=True)
class Decision:
    """A person's answer to a :class:`raf.PendingCall`: run it, or refuse it (and why).

    Resume a paused run with it, from any process that opens the session:
    ``await agent.run(raf.Decision(pending.token, approve=True), session=s)``,
    or a sequence of decisions (all or nothing). A refused call becomes a
    tool message that tells the model so, with ``reason`` when given.

    >>> Decision("4f2a", approve=False, reason="not that folder")
    Decision(token='4f2a', approve=False, reason='not that folder')
    """

    token: str = attrs.field(validator=_check_token)
    approve: bool = attrs.field(kw_only=True, validator=_check_approve)
    reason: str | None = attrs.field(default=None, kw_only=True, validator=_check_reason)
