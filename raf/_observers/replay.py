"""replay(agent, messages): a recorded conversation run again through a stack, the model and the
tools answered from the recording, every call measured by a ContextLedger.

What a change of stack (a window, a knowledge provider, clearing, compaction)
would have sent and billed over a real conversation, before it ships: no
network, no tool runs, the same conversation through either stack.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Final

from raf._agent.agent import Agent
from raf._agent.offers import answered_tools, offering
from raf._observers.ledger import ContextLedger
from raf._observers.replay_report import ReplayCall, ReplayDivergence, ReplayReport
from raf._sessions.memory import InMemorySession
from raf._values.context import ToolRequest
from raf._values.decision import Decision
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions
from raf._values.prices import Prices
from raf.errors import AgentError

__all__ = ["replay"]

#: The id of the session a replay runs in (what the prompt cache key and the ledger see).
REPLAY_SESSION: Final = "replay"
#: How many times a turn is resumed for calls that wait (approval): each is approved.
_MAX_RESUMES: Final = 100
#: What a replayed client takes from the agent's own: its model and how it counts tokens.
_FORWARDED: Final = frozenset({"model", "count_tokens", "token_encoding"})


class _Recording:
    """The recorded conversation being replayed: the answers of the turn in play, every
    tool result by its call's id, and where the stack did not follow."""

    def __init__(self, messages: Sequence[ChatMessage]) -> None:
        self.messages = tuple(messages)
        # Call id -> where its result is: the turn in play's own first (an id may come again in
        # a later turn: some servers number the calls of each answer), else anywhere.
        self.results = _results(self.messages, 0, len(self.messages))
        self.turn_results: dict[str, int] = {}
        self.turn = 0
        self.asked: set[int] = set()  # where the results the stack took are
        self.answers: list[ChatMessage] = []
        self.recorded = 0  # the answers the turn in play holds
        self.made = 0  # the model calls the stack made in this turn
        self.divergences: list[ReplayDivergence] = []

    def start(self, turn: int, first: int, end: int) -> None:
        """Turn ``turn`` is in play: its messages after its user message are ``first`` to
        ``end`` of the recording."""
        answers = [m for m in self.messages[first:end] if m.role == "assistant"]
        self.turn, self.answers, self.recorded, self.made = turn, answers, len(answers), 0
        self.turn_results = _results(self.messages, first, end)

    def recorded_result(self, call_id: str) -> ChatMessage | None:
        """The recorded result of ``call_id`` (the turn in play's first), taken."""
        where = self.turn_results.get(call_id, self.results.get(call_id))
        if where is None:
            return None
        self.asked.add(where)
        return self.messages[where]

    def diverge(self, reason: str, call: int | None = None) -> None:
        self.divergences.append(ReplayDivergence(self.turn, call, reason))

    def answer(self) -> AgentResponse:
        self.made += 1
        if self.answers:
            return AgentResponse((self.answers.pop(0),))
        self.diverge(
            f"the stack asked for a model call the recording does not hold (it holds "
            f"{self.recorded} for this turn); answered with an empty message",
            self.made,
        )
        return AgentResponse((ChatMessage.assistant(""),))

    async def tool_result(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """The innermost tool middleware: the recorded result of the call; no tool runs."""
        found = self.recorded_result(request.call.id)
        if found is not None:
            return found
        self.diverge(f"no recorded result for call {request.call.id!r} ({request.call.name})")
        return request.reply("(the recording holds no result for this call)")

    def answered(
        self, names: frozenset[str]
    ) -> Callable[[ToolRequest, Callable[[ToolRequest], Awaitable[ChatMessage]]], Any]:
        """A tool middleware, just outside the stack's first that answers tools itself (the
        ``read_tool_result`` of :class:`raf.ToolOutputLimit`): a recorded call of one of
        ``names`` gets its recorded result (what it read is kept with the recorded session,
        not in the recording)."""

        async def from_recording(
            request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
        ) -> ChatMessage:
            found = self.recorded_result(request.call.id) if request.call.name in names else None
            return found if found is not None else await call_next(request)

        return from_recording


def _results(messages: Sequence[ChatMessage], first: int, end: int) -> dict[str, int]:
    """Where each tool result of ``messages[first:end]`` is, by its call's id (the first)."""
    found: dict[str, int] = {}
    for index in range(first, end):
        message = messages[index]
        if message.role == "tool" and message.tool_call_id:
            found.setdefault(message.tool_call_id, index)
    return found


class _RecordedClient:
    """A chat client that answers each call with the next recorded answer of the turn; its
    model and its token counting are the agent's own client's."""

    def __init__(self, recording: _Recording, original: object) -> None:
        self._recording = recording
        self._original = original

    def __getattr__(self, name: str) -> Any:
        # Only what the stack reads of a client: windows and the ledger count as the agent would.
        if name in _FORWARDED:
            return getattr(self._original, name)
        raise AttributeError(name)

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """The next recorded answer."""
        return self._recording.answer()

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The next recorded answer, as its updates."""
        for update in self._recording.answer().to_updates():
            yield update


def turns_of(
    messages: Sequence[ChatMessage],
) -> tuple[tuple[ChatMessage, ...], list[tuple[ChatMessage, tuple[ChatMessage, ...]]]]:
    """What comes before the first user message, and each turn: its user message and the
    messages after it up to the next one."""
    starts = [index for index, message in enumerate(messages) if message.role == "user"]
    prefix = tuple(messages[: starts[0]] if starts else messages)
    turns = []
    for number, start in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else len(messages)
        turns.append((messages[start], tuple(messages[start + 1 : end])))
    return prefix, turns


async def replay(
    agent: Agent, messages: Sequence[ChatMessage], *, prices: Prices | None = None
) -> ReplayReport:
    """Run the user turns of the recorded conversation ``messages`` again through
    ``agent``'s stacks, and report what each model call would have sent and billed.

    Each recorded turn (a user message and what followed it) is one run of
    ``agent``'s run stack, in a fresh in-memory session that starts with
    what came before the first user message. The model is answered from the
    recording: each call of a turn gets the turn's next recorded assistant
    message; a tool call gets its recorded result (innermost in the tool
    stack: the agent's tool middleware see it; no tool runs); a call that
    waits for approval is approved. Nothing reaches the network (but what a
    provider of the stack calls on its own, such as a summary strategy's
    client). The agent's observers are left out; a
    :class:`raf.observe.ContextLedger` measures every call, and each call's
    prompt is priced with ``prices`` (default :class:`raf.Prices`: genai-prices'
    data) for the model of the agent's client.

    Where the stack does not follow the recording (it asks for more model
    calls than a turn holds: answered with an empty message; fewer; a tool
    result the recording lacks; a raf error that ends a turn), the report
    says so in ``divergences`` and the replay goes on: never raised.

    >>> import anyio
    >>> from raf import Agent, ChatMessage, EchoChatClient
    >>> talk = [ChatMessage.user("hi"), ChatMessage.assistant("hello"),
    ...         ChatMessage.user("more"), ChatMessage.assistant("sure")]
    >>> report = anyio.run(replay, Agent(EchoChatClient(), history=True), talk)
    >>> [call.turn for call in report.calls], report.diverged
    ([1, 2], False)
    """
    if not isinstance(agent, Agent):
        raise TypeError(f"replay(agent, messages): agent must be a raf.Agent, got {agent!r:.80}")
    recorded = tuple(messages)
    for index, message in enumerate(recorded):
        if not isinstance(message, ChatMessage):
            raise TypeError(
                f"replay(agent, messages): messages[{index}] must be a ChatMessage, "
                f"got {type(message).__name__}"
            )
    if prices is not None and not isinstance(prices, Prices):
        raise TypeError(f"replay(prices=...): must be a raf.Prices, got {prices!r:.80}")
    priced = Prices() if prices is None else prices
    recording = _Recording(recorded)
    ledger = ContextLedger()
    replayed = agent.replace(
        chat_client=_RecordedClient(recording, agent.chat_client),
        tool_stack=(*_answered_from(recording, agent.tool_stack), recording.tool_result),
        observers=(ledger,),
    )
    prefix, turns = turns_of(recorded)
    starts = [index for index, message in enumerate(recorded) if message.role == "user"]
    session = InMemorySession(REPLAY_SESSION)
    if prefix:
        await session.add_messages(prefix)
    calls: list[ReplayCall] = []
    for number, (asked, after) in enumerate(turns, 1):
        first = starts[number - 1] + 1
        recording.start(number, first, first + len(after))
        seen = len(ledger.calls)
        await _run_turn(replayed, asked, session, recording)
        if recording.answers:
            recording.diverge(
                f"the stack ended the turn after {recording.made} model call(s); the "
                f"recording holds {recording.recorded}"
            )
        for index, message in enumerate(after, first):
            if message.role == "tool" and index not in recording.asked:
                recording.diverge(
                    f"the recorded result of call {message.tool_call_id!r} ({message.name}) "
                    "was not asked for: the stack has no such tool, or did not run it"
                )
        calls += [ReplayCall.of(number, entry, priced) for entry in ledger.calls[seen:]]
    counted = ledger.calls[0].counted_by if ledger.calls else "approximate"
    return ReplayReport(
        tuple(calls),
        len(turns),
        sum(m.role == "assistant" for m in recorded),
        tuple(recording.divergences),
        counted,
    )


def _answered_from(recording: _Recording, stack: Sequence[Any]) -> list[Any]:
    """``stack`` with the recording answering, in front of its first item that answers tools
    itself, the recorded calls of those tools."""
    names = frozenset(tool.name for tool in answered_tools(offering(stack)))
    found = [index for index, item in enumerate(stack) if getattr(item, "answers", ())]
    if not names or not found:
        return list(stack)
    return [*stack[: found[0]], recording.answered(names), *stack[found[0] :]]


async def _run_turn(
    agent: Agent, asked: ChatMessage, session: InMemorySession, recording: _Recording
) -> None:
    """One recorded turn through the stack; what waits for approval approved, each time."""
    try:
        response = await agent.run(asked, session=session)
        for _ in range(_MAX_RESUMES):
            if not response.pending:
                return
            decisions = [Decision(call.token, approve=True) for call in response.pending]
            response = await agent.run(decisions, session=session)
    except AgentError as exc:
        recording.diverge(f"the run raised {type(exc).__name__}: {exc}")
