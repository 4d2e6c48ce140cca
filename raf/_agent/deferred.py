"""Deferred calls: the tool calls a run does not run itself, and what waits in the session.

A call is *deferred* when its tool needs a person's approval (``approval``)
or is the client's to run (``runs_on_client``, a served client tool):
:func:`deferral` says which, in one place. The tool loop runs a model
turn's other calls, then ends the run with the deferred ones waiting; the
history keeps them in the session (the approvals as pending calls). The
next run of the session resumes them through :class:`RunDeferred`, one per
run: it applies the run's decisions (or the client's results, which come in
its request), or refuses what waits when a new message comes instead, and
puts the waiting turn and its answers in the model's view, read from the
store itself, so the window, the compression and the store do not matter.
When the run ends abnormally, :meth:`RunDeferred.settle` stores the answers
of the calls it claimed, so the history never keeps a call without a result.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Literal

import anyio
import attrs

from raf._log import log as _log
from raf._sessions.base import missing_pending, require_pending
from raf._sessions.waiting import (
    still_owed,
    stored_waiting_turn,
    unanswered_tail,
    waiting_turn,
)
from raf._values.context import Invocation
from raf._values.decision import Decision
from raf._values.messages import ChatMessage, PendingCall, ToolCall
from raf._values.options import ChatOptions
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


def deferral(tool: object, call: ToolCall) -> Literal["approval", "client"] | None:
    """Why the tool loop does not run ``call`` of ``tool`` itself; ``None`` when it does.

    ``"approval"``: it waits for a person (see :func:`needs_approval`; a call
    whose arguments are not a JSON object is run, to be told so, instead).
    ``"client"``: the caller runs it (``runs_on_client``); its next request
    brings the result.
    """
    if tool is None:
        return None
    if wants_approval(tool) and _object_arguments(call) and needs_approval(tool, call):
        return "approval"
    if getattr(tool, "runs_on_client", False) is True:
        return "client"
    return None


def _object_arguments(call: ToolCall) -> bool:
    try:
        return isinstance(call.parsed_arguments, dict)
    except (ValueError, RecursionError):
        return False  # the model is told its arguments are not JSON; nothing to approve


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


#: Runs approved calls concurrently; calls ``done(call_index, message)`` as each ends.
RunCalls = Callable[
    [Sequence[ToolCall], Callable[[int, ChatMessage], None]], Awaitable[tuple[ChatMessage, ...]]
]


@attrs.frozen
class Opening:
    """What :meth:`RunDeferred.open` found: the answers it owes, the model's view and its
    options, and whether the loop goes on (``waiting``: the calls still pending;
    ``stalled``: some call of the turn has no answer here, so the model is not called)."""

    answers: tuple[ChatMessage, ...]
    messages: Sequence[ChatMessage]
    options: ChatOptions
    waiting: tuple[PendingCall, ...] = ()
    stalled: bool = False

    @property
    def goes_on(self) -> bool:
        return not self.waiting and not self.stalled


@attrs.frozen
class Waiting:
    """The deferred calls of one model turn; ``pending``: those that wait for a decision."""

    calls: tuple[ToolCall, ...] = ()
    pending: tuple[PendingCall, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.calls)


_NOTHING_WAITS: Final = Waiting()


class RunDeferred:
    """The deferred calls of one run: its decisions, the calls it claimed and what it owes them.

    Made once per run; ``keeps`` says whether the agent keeps a history (a
    :class:`raf._values.protocols.HistoryKeeper` in its stack), without which
    nothing can wait and a call that needs approval is an error.
    """

    __slots__ = ("_answers", "_claimed", "_opened", "decisions", "keeps", "post_timeout", "session")

    def __init__(
        self, session: Session, decisions: Sequence[Any], post_timeout: float, *, keeps: bool
    ) -> None:
        self.session = session
        self.decisions: tuple[Decision, ...] = tuple(decisions)
        if self.decisions:
            require_pending(session, "a run with decisions claims them")
        self.post_timeout = post_timeout
        self.keeps = keeps
        self._claimed: list[ToolCall] = []  # claimed by this run: each one is owed an answer
        self._answers: dict[str, ChatMessage] = {}  # call id -> its answer, once known
        self._opened = False  # a run's tool loop may start again (a structured-output retry)

    def pending(self, calls: Sequence[ToolCall]) -> tuple[PendingCall, ...]:
        """The :class:`PendingCall` of each call that is to wait."""
        session_id = self.session.id
        return tuple(PendingCall(call, approval_token(session_id, call)) for call in calls)

    def split(
        self, calls: Sequence[ToolCall], tools: Mapping[str, Any]
    ) -> tuple[tuple[ToolCall, ...], Waiting]:
        """A model turn's calls: those the loop runs, and those deferred (see :func:`deferral`)."""
        ready: list[ToolCall] = []
        deferred: list[ToolCall] = []
        held: list[ToolCall] = []
        for call in calls:
            tool = tools.get(call.name)
            if not self.keeps and wants_approval(tool):
                raise ApprovalError(
                    f"tool {call.name!r} needs approval, but the agent keeps no history: add a "
                    "raf.HistoryProvider to its stack (Agent(history=True)), where a paused "
                    "call waits"
                )
            reason = deferral(tool, call)
            if reason is None:
                ready.append(call)
                continue
            deferred.append(call)
            if reason == "approval":
                held.append(call)
        if not deferred:
            return tuple(ready), _NOTHING_WAITS
        return tuple(ready), Waiting(tuple(deferred), self.pending(held))

    async def open(
        self,
        messages: Sequence[ChatMessage],
        options: ChatOptions,
        invocation: Invocation,
        run: RunCalls,
    ) -> Opening | None:
        """Before the first model call: apply the decisions, or refuse what waits
        (``None``: nothing waits, nothing to do).

        What waits is the stored history's last turn while a call of it has
        no result: found in what the providers injected (the windows keep it
        in view); a run with decisions, or with a client's results in its
        request, reads it from the store when the view lacks it. The turn
        (when the view lacks it) and its answers join the model's view at the
        end of the history, the options' ``history_end`` with them.
        """
        if self._opened or not self.keeps:  # again in the same run: settled then
            return None
        self._opened = True
        given = {m.tool_call_id for m in invocation.request_messages if m.role == "tool"}
        waiting = waiting_turn(invocation.messages)  # the windows keep it in view
        if not waiting and (self.decisions or given):
            # Out of the providers' view (a window smaller than the turn, a provider that
            # replaces the history): the store has it. (A durable run reads the view's, the
            # history of its step, so a replay sees what the first pass saw.)
            waiting = await stored_waiting_turn(self.session)
        _, gap = unanswered_tail(waiting)
        # The request answers the turn's client calls (their results): no new message, so
        # the turn's calls that wait for a person still wait for their decisions.
        answered = [call for call in gap if call.id in given]
        pending: Sequence[PendingCall] = ()
        if answered and not missing_pending(self.session):
            pending = await self.session.list_pending()
            _refuse_made_up_results(self.session.id, answered, pending)
        if given:  # a call the request answers (a client tool's result) waits no more
            gap = tuple(call for call in gap if call.id not in given)
        remaining: tuple[PendingCall, ...] = ()
        stalled = False
        if self.decisions:
            answers, remaining, stalled = await self._resume(gap, run)
        elif gap and answered:
            answers, remaining = self._still_waiting(gap, pending)
        elif gap:
            answers = await self._supersede(gap)
        elif not waiting:
            return None  # nothing waits: the run goes on as it is
        else:
            answers = ()
        if not waiting:
            return Opening(answers, messages, options, remaining, stalled)
        view, options = in_view(messages, options, waiting, _visible(answers, gap))
        return Opening(answers, view, options, remaining, stalled)

    def _still_waiting(
        self, gap: Sequence[ToolCall], pending: Sequence[PendingCall]
    ) -> tuple[tuple[ChatMessage, ...], tuple[PendingCall, ...]]:
        """A client's results and no decisions: the calls pending approval wait on (the
        run ends listing them); a call neither pending nor answered was lost (a crash)."""
        ids = {call.id for call in gap}
        remaining = tuple(p for p in pending if p.call.id in ids)
        return self._owe_lost(gap, {p.call.id for p in remaining}), remaining

    async def _supersede(self, gap: Sequence[ToolCall]) -> tuple[ChatMessage, ...]:
        """A new message instead of decisions: what waits is refused, what was lost told."""
        # A store without approvals has nothing pending: its gap is a lost result.
        keeps = not missing_pending(self.session)
        claimed = await self.session.claim_all_pending() if keeps else ()
        owed = [refusal(p.call, SUPERSEDED) for p in claimed]
        self._claimed.extend(p.call for p in claimed)
        for answer in owed:
            self._answers[answer.tool_call_id or ""] = answer
        return (*owed, *self._owe_lost(gap, {p.call.id for p in claimed}))

    def _owe_lost(self, gap: Sequence[ToolCall], kept: set[str]) -> tuple[ChatMessage, ...]:
        """The calls of ``gap`` not in ``kept`` have no result and wait for nobody: their
        claimer stopped (a crash). Each is answered as interrupted, owed by this run."""
        owed: list[ChatMessage] = []
        for call in gap:
            if call.id not in kept:
                owed.append(refusal(call, INTERRUPTED))
                self._claimed.append(call)
                self._answers[call.id] = owed[-1]
        return tuple(owed)

    async def _resume(
        self, gap: Sequence[ToolCall], run: RunCalls
    ) -> tuple[tuple[ChatMessage, ...], tuple[PendingCall, ...], bool]:
        """The decisions applied: their answers, the calls still pending, and whether the
        turn is stalled (a call of it neither answered here nor pending)."""
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
        in_gap = {c.id for c in gap}
        stalled = not in_gap <= answered | waiting_ids or not answered <= in_gap
        return answers, tuple(remaining), stalled

    async def settle(self, error: BaseException) -> None:
        """The run ends abnormally: store an answer for every call this run claimed.

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


def in_view(
    messages: Sequence[ChatMessage],
    options: ChatOptions,
    waiting: Sequence[ChatMessage],
    answers: Sequence[ChatMessage],
) -> tuple[Sequence[ChatMessage], ChatOptions]:
    """``messages`` with the ``waiting`` turn in view and ``answers`` after its results.

    The turn is found by its calls' ids; where a window or a compression
    left it out, it joins the end of the history with the results it has.
    What joins the history moves ``options.history_end`` (the stable
    prefix) past it.
    """
    turn = waiting[0]
    ids = [call.id for call in turn.tool_calls]
    at = len(messages) - 1
    while at >= 0 and not (
        messages[at] is turn or [call.id for call in messages[at].tool_calls] == ids
    ):
        at -= 1
    if at < 0:  # out of view: the turn, its results, then the answers end the history
        end = options.history_end
        at = end if end is not None else int(bool(messages) and messages[0].role == "system")
        joined = (*waiting, *answers)
    else:
        at += 1
        while at < len(messages) and messages[at].role == "tool":
            at += 1
        joined = tuple(answers)
    if not joined:
        return messages, options
    end = options.history_end
    if end is None or at <= end:
        options = attrs.evolve(options, history_end=(at if end is None else end) + len(joined))
    return (*messages[:at], *joined, *messages[at:]), options


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


def _refuse_made_up_results(
    session_id: str, answered: Sequence[ToolCall], pending: Sequence[PendingCall]
) -> None:
    """An :class:`ApprovalError` when the request's tool messages answer a call that waits
    for a person (``answered``, of ``pending``): only a decision answers it (else the model
    would read a result the caller made up, and the call, still pending, could run after it)."""
    held = {p.call.id for p in pending}
    for call in answered:
        if call.id in held:
            raise ApprovalError(
                f"session {session_id!r}: a tool message answers the call {call.id!r} "
                f"of {call.name!r}, which waits for a person's approval: only a decision "
                "answers it (agent.run(raf.Decision(token, approve=...), session=...))"
            )
