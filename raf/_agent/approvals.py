"""Approvals: tool calls that wait for a person's decision, kept in the session.

The tool loop asks :class:`RunApprovals` three things: at the start of a run,
:meth:`~RunApprovals.open` (apply the run's decisions, or deny the calls that
wait when a new turn begins); for each model turn, :meth:`~RunApprovals.held`
(which calls must wait); and when the loop ends abnormally,
:meth:`~RunApprovals.settle` (store the answers of the calls this run
claimed, so the stored history never keeps a call without its result).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import anyio
import attrs

from raf._log import log as _log
from raf._sessions.base import missing_pending, require_pending
from raf._values.decision import Decision
from raf._values.messages import ChatMessage, PendingCall, ToolCall
from raf._values.protocols import Session
from raf.errors import ApprovalError

__all__ = ["Decision"]


#: What the model reads for a call the person refused, with or without a reason.
DENIED: Final = "The user did not approve this call; it was not run."
#: What the model reads for a call still waiting when the user sent a new message.
SUPERSEDED: Final = (
    "The user did not approve this call (they sent a new message instead); it was not run."
)
#: What the model reads for a call whose run was interrupted (a cancellation, a crash).
INTERRUPTED: Final = (
    "This call was interrupted before its result was stored; it may or may not have run."
)


def approval_token(session_id: str, call: ToolCall) -> str:
    """The token of a paused call: SHA-256 of the session id, call id, tool name and arguments.

    The arguments are canonical JSON (sorted keys, no spaces), so the same
    call gives the same token in every process; any other arguments, call,
    tool or session give another.

    >>> call = ToolCall("c1", "rm", '{"path": "a", "force": true}')
    >>> same = ToolCall("c1", "rm", '{"force":true,"path":"a"}')
    >>> approval_token("s", call) == approval_token("s", same)
    True
    """
    arguments = json.dumps(
        call.parsed_arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    canonical = json.dumps(
        ["raf.approval/1", session_id, call.id, call.name, arguments],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    import hashlib  # here, not at import: it loads OpenSSL, some 2 ms

    return hashlib.sha256(canonical.encode()).hexdigest()


def wants_approval(tool: object) -> bool:
    """Whether ``tool`` may ask for approval at all (a truthy ``approval``, or a callable)."""
    approval = getattr(tool, "approval", None)
    return callable(approval) or bool(approval)


def needs_approval(tool: object, call: ToolCall) -> bool:
    """Whether ``call`` of ``tool`` must wait for a person: ``tool.approval`` true, or true for it.

    A callable ``approval`` that raises counts as true: a person decides
    rather than a broken check letting the call through.
    """
    approval = getattr(tool, "approval", None)
    if not callable(approval):
        return bool(approval)
    try:
        return bool(approval(call))
    except Exception as exc:
        _log.warning("tool.approval_check_failed", tool=call.name, error=repr(exc))
        return True


def refusal(call: ToolCall, text: str, reason: str | None = None) -> ChatMessage:
    """The tool message that answers ``call`` without running it."""
    if reason:
        text = f"{text} The user's reason: {reason}"
    return ChatMessage.tool(call.id, text, name=call.name)


def unanswered_tail(
    messages: Sequence[ChatMessage],
) -> tuple[ChatMessage | None, tuple[ToolCall, ...]]:
    """The last message of ``messages`` that is not a tool result, if it is a calling assistant
    turn, and its calls that no tool message after it answers."""
    answered: set[str | None] = set()
    for message in reversed(messages):
        if message.role == "tool":
            answered.add(message.tool_call_id)
            continue
        if message.role == "assistant" and message.tool_calls:
            return message, tuple(c for c in message.tool_calls if c.id not in answered)
        return None, ()
    return None, ()


async def still_owed(session: Session, answers: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """The ``answers`` whose calls the stored history still waits for, read just before storing.

    Another run may have answered them meanwhile (a new message sent while
    an approved call ran elsewhere): a second answer, after that run's turn,
    would answer nothing, and a model refuses such a history.
    """
    if not answers:
        return ()
    _, gap = unanswered_tail(await session.get_messages())
    waiting = {call.id for call in gap}
    return tuple(answer for answer in answers if answer.tool_call_id in waiting)


def answer_in_place(
    messages: Sequence[ChatMessage], turn: ChatMessage | None, answers: Sequence[ChatMessage]
) -> tuple[ChatMessage, ...]:
    """``messages`` with ``answers`` right after ``turn``'s results (the model's view)."""
    if turn is None or not answers:
        return tuple(messages)
    at = next(i for i in range(len(messages) - 1, -1, -1) if messages[i] is turn) + 1
    while at < len(messages) and messages[at].role == "tool":
        at += 1
    return (*messages[:at], *answers, *messages[at:])


#: Runs approved calls concurrently; calls ``done(call_index, message)`` as each ends.
RunCalls = Callable[
    [Sequence[ToolCall], Callable[[int, ChatMessage], None]], Awaitable[tuple[ChatMessage, ...]]
]


@attrs.frozen
class Opening:
    """What :meth:`RunApprovals.open` found: the answers it owes, the model's view, and
    whether the loop goes on (``waiting``: the calls still pending; ``stalled``: some
    call of the turn has no answer here, so the model is not called)."""

    answers: tuple[ChatMessage, ...]
    messages: tuple[ChatMessage, ...]
    waiting: tuple[PendingCall, ...] = ()
    stalled: bool = False

    @property
    def goes_on(self) -> bool:
        return not self.waiting and not self.stalled


class RunApprovals:
    """The approvals of one run: its decisions, the calls it claimed and what it owes them."""

    def __init__(self, session: Session, decisions: Sequence[Any], post_timeout: float) -> None:
        self.session = session
        self.decisions: tuple[Decision, ...] = tuple(decisions)
        if self.decisions:
            require_pending(session, "a run with decisions claims them")
        self.post_timeout = post_timeout
        self._claimed: list[ToolCall] = []  # claimed by this run: each one is owed an answer
        self._answers: dict[str, ChatMessage] = {}  # call id -> its answer, once known
        self._opened = False  # a run's tool loop may start again (a structured-output retry)

    def pending(self, calls: Sequence[ToolCall]) -> tuple[PendingCall, ...]:
        """The :class:`PendingCall` of each call that is to wait."""
        session_id = self.session.id
        return tuple(PendingCall(call, approval_token(session_id, call)) for call in calls)

    async def open(
        self, messages: Sequence[ChatMessage], injected: Sequence[ChatMessage], run: RunCalls
    ) -> Opening:
        """Before the first model call: apply the decisions, or deny what waits.

        ``injected`` are the messages the providers injected (the history);
        the calls of its last turn that have no result are what may wait.
        """
        if self._opened:  # the loop again, in the same run: what waited was settled then
            return Opening((), tuple(messages))
        self._opened = True
        turn, gap = unanswered_tail(injected)
        if gap:  # a call the request answers (a client tool's result) waits no more
            given = {m.tool_call_id for m in messages[len(injected) :] if m.role == "tool"}
            gap = tuple(call for call in gap if call.id not in given)
        if self.decisions:
            return await self._resume(messages, turn, gap, run)
        if not gap:
            return Opening((), tuple(messages))  # nothing waits: no round trip to the store
        # A store without approvals has nothing pending: its gap is a lost result.
        keeps = not missing_pending(self.session)
        claimed = await self.session.claim_all_pending() if keeps else ()
        owed = [refusal(p.call, SUPERSEDED) for p in claimed]
        self._claimed.extend(p.call for p in claimed)
        for answer in owed:
            self._answers[answer.tool_call_id or ""] = answer
        taken = {p.call.id for p in claimed}
        # A call without a result that was not pending: its claimer stopped (a crash).
        for call in gap:
            if call.id not in taken:
                owed.append(refusal(call, INTERRUPTED))
                self._claimed.append(call)
                self._answers[call.id] = owed[-1]
        answers = tuple(owed)
        return Opening(answers, answer_in_place(messages, turn, _visible(answers, gap)))

    async def _resume(
        self,
        messages: Sequence[ChatMessage],
        turn: ChatMessage | None,
        gap: Sequence[ToolCall],
        run: RunCalls,
    ) -> Opening:
        claimed, remaining = await claim_decided(self.session, self.decisions)
        self._claimed.extend(p.call for p in claimed)
        by_token = {d.token: d for d in self.decisions}
        forged = [p for p in claimed if approval_token(self.session.id, p.call) != p.token]
        for p in forged:  # the stored call is not what its token was made from
            self._answers[p.call.id] = refusal(p.call, DENIED, "its stored call was altered")
        if forged:
            raise ApprovalError(
                f"session {self.session.id!r}: the pending call stored under token "
                f"{forged[0].token} does not match it (its arguments changed): nothing was run",
                tokens=tuple(p.token for p in forged),
            )
        approved = [p.call for p in claimed if by_token[p.token].approve]
        for p in claimed:
            decision = by_token[p.token]
            if not decision.approve:
                self._answers[p.call.id] = refusal(p.call, DENIED, decision.reason)

        def done(index: int, message: ChatMessage) -> None:
            self._answers[approved[index].id] = message

        if approved:
            await run(approved, done)
        answers = tuple(self._answers[p.call.id] for p in claimed)
        answered = {p.call.id for p in claimed}
        waiting_ids = {p.call.id for p in remaining}
        # A call of the turn that is neither decided here nor pending may still be running in
        # another process: the model is not called until every call of the turn has its result.
        in_view = {c.id for c in gap}
        stalled = not in_view <= answered | waiting_ids or not answered <= in_view
        view = answer_in_place(messages, turn, _visible(answers, gap))
        return Opening(answers, view, tuple(remaining), stalled)

    def held(self, calls: Sequence[ToolCall], tools: Mapping[str, Any]) -> list[ToolCall]:
        """The calls of one model turn that must wait for a person."""
        held: list[ToolCall] = []
        for call in calls:
            tool = tools.get(call.name)
            if tool is None or not wants_approval(tool):
                continue
            try:
                arguments = call.parsed_arguments
            except (ValueError, RecursionError):
                continue  # the model is told its arguments are not JSON; nothing to approve
            if isinstance(arguments, dict) and needs_approval(tool, call):
                held.append(call)
        return held

    async def settle(self, error: BaseException) -> None:
        """The loop ends abnormally: store an answer for every call this run claimed.

        Shielded and bounded by ``post_timeout``: a cancelled run still
        leaves its claimed calls answered (their result if it came,
        else "interrupted"), never waiting without a record.
        """
        owed = [self._answers.get(call.id) or refusal(call, INTERRUPTED) for call in self._claimed]
        if not owed:
            return
        self._claimed = []
        try:
            with anyio.CancelScope(shield=True), anyio.fail_after(self.post_timeout):
                owed = list(await still_owed(self.session, owed))
                if owed:
                    await self.session.add_messages(owed)
        except Exception as exc:
            error.add_note(
                f"raf: the answers of {len(owed)} claimed tool call(s) could not be stored: "
                f"{type(exc).__name__}: {exc}"
            )


async def claim_decided(
    session: Session, decisions: Sequence[Decision]
) -> tuple[tuple[PendingCall, ...], tuple[PendingCall, ...]]:
    """Claim the pending calls that ``decisions`` decide: ``(claimed, still pending)``.

    All or nothing, once: a token that is repeated, or that matches no
    pending call of ``session`` (unknown, decided already, another
    session's, other arguments), is an :class:`ApprovalError` and nothing
    is claimed. Of two callers that claim one call, one gets it.
    """
    tokens = tuple(decision.token for decision in decisions)
    if len(set(tokens)) != len(tokens):
        repeated = tuple(sorted(t for t, n in Counter(tokens).items() if n > 1))  # linear
        raise ApprovalError(
            f"two decisions for one call (tokens {_some(repeated)}): none was applied",
            tokens=repeated,
        )
    claim = await session.claim_pending(tokens)
    if claim is None:
        raise not_pending(session, tokens, await session.list_pending())
    claimed, remaining = claim
    return tuple(claimed), tuple(remaining)


async def deny_pending(
    session: Session, tokens: Sequence[str], reason: str
) -> tuple[PendingCall, ...]:
    """Deny the calls of ``tokens`` that still wait in ``session``: each is claimed and answered
    as refused (with ``reason``) in the stored history, so no later decision runs it.

    The tokens no longer pending (decided, superseded) are left alone; a call
    another caller claims meanwhile is that caller's. The calls denied here.
    """
    if missing_pending(session):
        return ()
    wanted = set(tokens)
    while True:  # each round that loses a claim has fewer calls to claim
        waiting = tuple(p.token for p in await session.list_pending() if p.token in wanted)
        if not waiting:
            return ()
        claim = await session.claim_pending(waiting)
        if claim is not None:
            break
    claimed = tuple(claim[0])
    answers = await still_owed(session, [refusal(p.call, DENIED, reason) for p in claimed])
    if answers:
        await session.add_messages(answers)
    return claimed


def not_pending(
    session: Session, tokens: Sequence[str], pending: Sequence[PendingCall]
) -> ApprovalError:
    """The error for decisions of which some token matches none of ``pending``."""
    waiting = {p.token for p in pending}
    unknown = tuple(t for t in tokens if t not in waiting)
    return ApprovalError(
        f"session {session.id!r}: no pending call has the token"
        f"{'s' if len(unknown) != 1 else ''} {_some(unknown)} (unknown, already "
        "decided, another session's, or for other arguments): none of the "
        f"{len(tokens)} decision{'s' if len(tokens) != 1 else ''} was applied",
        tokens=unknown,
    )


def _some(tokens: Sequence[str], first: int = 3) -> str:
    """The first few of ``tokens`` and how many more: a message stays short for 100k tokens."""
    more = f" and {len(tokens) - first} more" if len(tokens) > first else ""
    return ", ".join(f"{t:.80}" for t in tokens[:first]) + more


def _visible(answers: Sequence[ChatMessage], gap: Sequence[ToolCall]) -> tuple[ChatMessage, ...]:
    """The answers whose calls the model sees without a result (the others stay out of view)."""
    ids = {call.id for call in gap}
    return tuple(answer for answer in answers if answer.tool_call_id in ids)
