"""The ``raf`` command's calls that wait for approval: printed, asked for, decided.

``raf run`` prints each call a turn left waiting and the command that decides
it, and exits with its own status; ``raf run CONFIG --session ID --approve
TOKEN`` (or ``--deny TOKEN [--reason TEXT]``) decides it. ``raf chat`` asks
for each inline (y/n, then a reason) before the next message.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Sequence

from raf._values.decision import Decision
from raf._values.messages import PendingCall
from raf.errors import ConfigError

__all__: list[str] = []


def decisions_of(args: argparse.Namespace) -> tuple[Decision, ...]:
    """``raf run``'s ``--approve``/``--deny``/``--reason`` as decisions; misuse is a
    :class:`ConfigError` (a usage error), as is a run with neither message nor decision."""
    approved: list[str] = args.approve or []
    denied: list[str] = args.deny or []
    if args.reason is not None and not denied:
        raise ConfigError("--reason is the reason of a refusal: give it with --deny TOKEN")
    if not approved and not denied:
        if args.message is None:
            raise ConfigError(
                "raf run needs a message, or --approve/--deny TOKEN to decide calls that wait"
            )
        return ()
    if args.message is not None:
        raise ConfigError(
            "--approve/--deny resume the calls that wait: give them without a message"
        )
    if not args.session:  # None, or "" (an unset shell variable)
        raise ConfigError(
            "--approve/--deny decide calls that wait in a session: give its --session ID"
        )
    for flag, given in (("--approve", approved), ("--deny", denied)):
        if any(not token.strip() for token in given):  # "--approve $TOKEN", TOKEN unset
            raise ConfigError(f"{flag} needs a token (the one raf run printed), got an empty one")
    tokens = [*approved, *denied]
    if len(set(tokens)) != len(tokens):
        raise ConfigError("a token is decided twice: give each one once")
    reason = args.reason or None
    return (
        *(Decision(token, approve=True) for token in approved),
        *(Decision(token, approve=False, reason=reason) for token in denied),
    )


def waiting_lines(pending: Sequence[PendingCall], args: argparse.Namespace) -> list[str]:
    """What ``raf run`` prints of the calls that wait: each by tool and arguments, and the
    command that decides it (with this run's config, session and store)."""
    lines = [f"waiting for approval: {p.call.name} {p.call.arguments}" for p in pending]
    if args.session is None:
        return lines  # the caller says these cannot be decided
    command = ["raf", "run", str(args.config), "--session", args.session]
    if args.db is not None:
        command += ["--db", args.db]
    base = shlex.join(command)
    for p in pending:
        lines.append(f"  approve: {base} --approve {p.token}")
        lines.append(f"  deny:    {base} --deny {p.token} [--reason TEXT]")
    return lines


#: What ``raf run`` says of calls that wait in a session kept nowhere (no ``--session``).
UNDECIDABLE = (
    "raf: these calls cannot be decided later: the session is kept nowhere; "
    "run with --session ID to keep it"
)


def ask_decisions(
    pending: Sequence[PendingCall], ask: Callable[[str], str]
) -> tuple[Decision, ...]:
    """``raf chat``'s questions of the calls that wait: y/n each, then a refusal's reason
    (empty for none). ``ask(question)`` returns the person's line (EOFError ends it)."""
    decisions: list[Decision] = []
    for p in pending:
        question = f"approve {p.call.name} {p.call.arguments}? [y/n] "
        while (answer := ask(question).strip().lower()) not in ("y", "yes", "n", "no"):
            question = "please answer y or n: "
        if answer in ("y", "yes"):
            decisions.append(Decision(p.token, approve=True))
        else:
            reason = ask("reason (Enter for none): ").strip()
            decisions.append(Decision(p.token, approve=False, reason=reason or None))
    return tuple(decisions)
