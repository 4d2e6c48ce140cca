"""Calls that wait for approval on the OpenAI routes: said in the text, listed, decided.

A turn that ends with calls waiting for a person's approval says so in its
text (each call by tool and arguments, so any client shows it) and lists
them as ``raf_pending``, each ``{"token", "name", "arguments"}``. The next
request decides them with ``raf_decisions``, each ``{"token", "approve",
"reason"?}`` (the OpenAI SDKs send it with ``extra_body``), and no new message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from raf._values.decision import Decision
from raf._values.messages import PendingCall
from raf.serve._http import HttpError

__all__: list[str] = []

#: The body field that decides the calls that wait.
DECISIONS: Final = "raf_decisions"
#: The field that lists the calls that wait (on a chat message or delta, on a response).
PENDING: Final = "raf_pending"


def pending_json(pending: Sequence[PendingCall]) -> list[dict[str, str]]:
    """The calls that wait as ``raf_pending``: what a client needs to show and decide each."""
    return [{"token": p.token, "name": p.call.name, "arguments": p.call.arguments} for p in pending]


def pending_text(pending: Sequence[PendingCall]) -> str:
    """The calls that wait in words, a line each: a client that knows nothing of
    ``raf_pending`` still shows the person what waits."""
    return "\n".join(f"Waiting for approval: {p.call.name} {p.call.arguments}" for p in pending)


def decisions_in(body: Any) -> tuple[Decision, ...]:
    """A body's ``raf_decisions`` as raf decisions (none when absent); a bad one is a 400."""
    if not isinstance(body, dict):
        return ()
    return parse_decisions(body.get(DECISIONS), DECISIONS)


def parse_decisions(given: Any, where: str) -> tuple[Decision, ...]:
    """A list of ``{"token", "approve", "reason"?}`` (``where`` names it in a 400) as raf
    decisions; ``None`` is none. Each token once: a second decision for one is a 400."""
    if given is None:
        return ()
    if not isinstance(given, list) or not given:
        raise HttpError(400, f"{where} must be a non-empty list")
    decisions: list[Decision] = []
    seen: set[Any] = set()  # a set: the duplicate check stays linear in the decisions
    for index, item in enumerate(given):
        at = f"{where}[{index}]"
        if not isinstance(item, dict) or set(item) - {"token", "approve", "reason"}:
            raise HttpError(400, f"{at} must be an object of token, approve and reason")
        fields: dict[str, Any] = item  # Decision checks each type
        try:
            decision = Decision(
                fields["token"], approve=fields["approve"], reason=fields.get("reason")
            )
        except KeyError as exc:
            raise HttpError(400, f"{at}: {exc.args[0]} is missing") from None
        except (TypeError, ValueError) as exc:
            raise HttpError(400, f"{at}: {exc!s:.200}") from None
        if decision.token in seen:
            raise HttpError(400, f"{at}: a second decision for the token {decision.token!r:.80}")
        seen.add(decision.token)
        decisions.append(decision)
    return tuple(decisions)


def no_session() -> HttpError:
    """The 400 of decisions sent with no session: the calls wait in a session's history."""
    return HttpError(
        400,
        f"'{DECISIONS}' decide calls that wait in a session: send the session's "
        "X-Session-Id header (or, on /v1/responses, previous_response_id)",
        code="session_required",
    )


def with_message() -> HttpError:
    """The 400 of decisions sent beside a new message."""
    return HttpError(
        400,
        f"'{DECISIONS}' resume the calls that wait: send them with no new message "
        "after the last assistant message",
    )
