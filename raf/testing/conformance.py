"""The Session conformance suite: what every Session implementation must do.

Each check is a plain async function of a :class:`Harness` that raises
``AssertionError`` naming the broken rule; nothing here needs pytest or
hypothesis, so the suite runs anywhere an event loop runs.
:func:`check_session_store` runs it for a factory of fresh sessions, on both
anyio backends; :func:`run_checks` runs it against a harness inside a
running event loop (a harness can also reopen a session through a second
store object, which a durable store should be tested with).

raf's own stores run it in ``tests/sessions/test_base.py``; a store joins by
adding one entry to ``STORES`` there.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import anyio
import attrs

from raf._agent.agent import Agent
from raf._agent.deferred import approval_token
from raf._clients.scripted import ScriptedChatClient
from raf._sessions import REQUEST_HASH_LIMIT, request_hash
from raf._sessions.base import RequestHash, Session
from raf._sessions.history import HistoryProvider
from raf._values.carried import Compaction, Reasoning
from raf._values.messages import ChatMessage, PendingCall, ToolCall
from raf.testing.conformance_cold import check_last_model_call_is_kept

__all__ = [
    "CHECKS",
    "FactoryHarness",
    "Harness",
    "Check",
    "check_round_trip_of_arbitrary_messages",
    "check_session_store",
    "conversation",
    "run_checks",
]


class Harness(Protocol):
    """How the suite gets sessions from the store under test."""

    async def new(self) -> Session:
        """A fresh, empty session (each call a different one)."""
        ...

    async def reopen(self, session: Session) -> Session:
        """The same session through a new store object (a durable store's file or server
        opened again); a store that keeps nothing beyond the object returns ``session``."""
        ...


@attrs.frozen
class FactoryHarness:
    """A harness from a factory of fresh sessions (sync or async); ``reopen`` is the identity."""

    factory: Callable[[], Session | Awaitable[Session]]

    async def new(self) -> Session:
        made = self.factory()
        session: Session = await made if inspect.isawaitable(made) else made
        return session

    async def reopen(self, session: Session) -> Session:
        return session


def conversation() -> list[ChatMessage]:
    """Every role and field: names, tool calls, tool results, None and empty content, unicode,
    a turn's reasoning and a server's compaction."""
    call_a = ToolCall("call_a", "lookup", '{"q": "caf\u00e9", "n": 2}')
    call_b = ToolCall("call_b", "now", "{}")
    thought = Reasoning("anthropic", '[{"type":"thinking","thinking":"hm","signature":"s"}]')
    compacted = Compaction(
        "anthropic", '{"type":"compaction","content":"was: caf\u00e9"}', "caf\u00e9"
    )
    return [
        ChatMessage.system("You are terse."),
        ChatMessage.user("Bonjour \u2014 \u00e7a va? \U0001f600", name="ann"),
        ChatMessage.assistant(None, tool_calls=[call_a, call_b], reasoning=thought),
        ChatMessage.tool("call_a", '{"hits": ["x"]}', name="lookup"),
        ChatMessage.tool("call_b", ""),
        ChatMessage.assistant('line one\nline two\t"quoted" \\ back', compaction=compacted),
        ChatMessage.user(""),
    ]


def _texts(messages: Sequence[ChatMessage]) -> list[str | None]:
    return [m.content for m in messages]


@contextmanager
def _raises(kind: type[BaseException], fragment: str, rule: str) -> Iterator[None]:
    try:
        yield
    except kind as exc:
        if fragment not in str(exc):
            raise AssertionError(
                f"{rule}: the {kind.__name__} does not say {fragment!r}: {exc}"
            ) from exc
    else:
        raise AssertionError(f"{rule}: no {kind.__name__} was raised")


def _check(condition: bool, rule: str, detail: object = "") -> None:
    if not condition:
        raise AssertionError(f"{rule}" + (f" (got {detail!r})" if detail != "" else ""))


async def _history(session: Session, rule: str) -> tuple[ChatMessage, ...]:
    history = await session.get_messages()
    _check(type(history) is tuple, f"{rule}: get_messages() returns a tuple", type(history))
    _check(
        all(type(m) is ChatMessage for m in history),
        f"{rule}: every item of the history is a ChatMessage",
    )
    return history


# -- history ---------------------------------------------------------------------------------


async def check_new_session_is_empty(harness: Harness) -> None:
    session = await harness.new()
    _check(isinstance(session, Session), "a session implements the Session protocol")
    _check(
        type(session.id) is str and bool(session.id),
        "a session's id is a non-empty str",
        session.id,
    )
    other = await harness.new()
    _check(other.id != session.id, "two new sessions have different ids", other.id)
    _check(await _history(session, "new session") == (), "a new session's history is empty")


async def check_round_trip_survives_reopening(harness: Harness) -> None:
    rule = "messages come back exactly, also through a reopened store"
    session = await harness.new()
    await session.add_messages(conversation())
    _check(list(await _history(session, rule)) == conversation(), rule)
    again = await harness.reopen(session)
    _check(again.id == session.id, "a reopened session keeps its id", again.id)
    _check(list(await _history(again, rule)) == conversation(), rule)


async def check_history_keeps_order_across_appends(harness: Harness) -> None:
    rule = "the history keeps the order of the appends"
    session = await harness.new()
    expected: list[ChatMessage] = []
    for turn in range(5):
        batch = [ChatMessage.user(f"q{turn}"), ChatMessage.assistant(f"a{turn}")]
        await session.add_messages(batch)
        expected += batch
        _check(list(await session.get_messages()) == expected, rule)
    _check(list(await (await harness.reopen(session)).get_messages()) == expected, rule)


async def check_add_messages_accepts_any_iterable(harness: Harness) -> None:
    session = await harness.new()
    await session.add_messages(m for m in [ChatMessage.user("a")])
    await session.add_messages([ChatMessage.user("b")])
    await session.add_messages((ChatMessage.user("c"),))
    got = _texts(await session.get_messages())
    _check(got == ["a", "b", "c"], "add_messages takes a generator, a list or a tuple", got)


async def check_add_messages_is_all_or_nothing(harness: Harness) -> None:
    rule = "add_messages with a non-ChatMessage item stores none of the batch"
    session = await harness.new()
    await session.add_messages([ChatMessage.user("kept")])
    bad: list[Any] = [ChatMessage.user("lost"), "not a message"]
    with _raises(TypeError, "[1]", "add_messages raises a TypeError naming the bad index"):
        await session.add_messages(bad)
    _check(_texts(await session.get_messages()) == ["kept"], rule)
    _check(_texts(await (await harness.reopen(session)).get_messages()) == ["kept"], rule)


async def check_empty_add_changes_nothing(harness: Harness) -> None:
    session = await harness.new()
    await session.add_messages([ChatMessage.user("x")])
    before = await session.get_messages()
    await session.add_messages([])
    _check(await session.get_messages() == before, "adding no messages changes nothing")


async def check_returned_history_is_a_snapshot(harness: Harness) -> None:
    session = await harness.new()
    await session.add_messages([ChatMessage.user("first")])
    snapshot = await session.get_messages()
    await session.add_messages([ChatMessage.user("second")])
    _check(_texts(snapshot) == ["first"], "a returned history does not change afterwards")
    _check(_texts(await session.get_messages()) == ["first", "second"], "the history grows")


async def check_last_messages_are_the_newest(harness: Harness) -> None:
    """``get_last_messages(count)``, where a session has it (raf's stores do; the history
    provider's window uses it and falls back to reading everything without it)."""
    rule = "get_last_messages(count) is the newest count messages, oldest first"
    session = await harness.new()
    last = getattr(session, "get_last_messages", None)
    if last is None:
        return
    _check(await last(3) == (), f"{rule}: () on a new session")
    messages = [ChatMessage.user(f"m{index}") for index in range(7)]
    await session.add_messages(messages[:5])
    for count in (0, 1, 4, 5, 9):
        got = await last(count)
        _check(type(got) is tuple, f"{rule}: a tuple", type(got))
        _check(list(got) == messages[:5][len(messages[:5]) - min(count, 5) :], rule, (count, got))
    # Another store object's appends show, whether this one read the tail or everything.
    other = await harness.reopen(session)
    await other.add_messages(messages[5:])
    _check(list(await last(3)) == messages[4:], f"{rule}, also after another writer", await last(3))
    _check(list(await session.get_messages()) == messages, "get_messages sees another writer")
    fresh = await harness.reopen(session)
    _check(list(await fresh.get_last_messages(2)) == messages[5:], rule)  # type: ignore[attr-defined]
    _check(list(await fresh.get_messages()) == messages, "a tail read first, then everything")
    with _raises(ValueError, "count", "get_last_messages(-1) is a ValueError"):
        await last(-1)


async def check_reads_see_other_writers(harness: Harness) -> None:
    rule = "a session that has read its history sees what another store object appended since"
    session = await harness.new()
    await session.add_messages([ChatMessage.user("one")])
    _check(_texts(await session.get_messages()) == ["one"], rule)
    other = await harness.reopen(session)
    await other.add_messages([ChatMessage.user("two")])
    await session.add_messages([ChatMessage.user("three")])
    await other.add_messages([ChatMessage.user("four")])
    _check(_texts(await session.get_messages()) == ["one", "two", "three", "four"], rule)
    _check(_texts(await other.get_messages()) == ["one", "two", "three", "four"], rule)


async def check_sessions_are_independent(harness: Harness) -> None:
    one = await harness.new()
    two = await harness.new()
    await one.add_messages([ChatMessage.user("for one")])
    await two.add_messages([ChatMessage.user("for two")])
    await one.touch_request_hash([ChatMessage.user("only one")])
    _check(_texts(await one.get_messages()) == ["for one"], "sessions do not share history")
    _check(_texts(await two.get_messages()) == ["for two"], "sessions do not share history")
    _check(await two.request_hashes() == {}, "sessions do not share request hashes")


async def check_concurrent_appends_lose_nothing_and_stay_together(harness: Harness) -> None:
    rule = "concurrent appends lose nothing and each batch stays contiguous"
    session = await harness.new()
    writers, batch = 40, 5

    async def write(writer: int) -> None:
        await session.add_messages(
            [ChatMessage.user(f"{writer}:{index}") for index in range(batch)]
        )

    async with anyio.create_task_group() as group:
        for writer in range(writers):
            group.start_soon(write, writer)
    for view in (session, await harness.reopen(session)):
        texts = [m.content or "" for m in await view.get_messages()]
        _check(len(texts) == writers * batch, rule, len(texts))
        chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
        for chunk in chunks:
            owner = chunk[0].split(":")[0]
            _check(chunk == [f"{owner}:{index}" for index in range(batch)], rule, chunk)
        firsts = sorted(int(chunk[0].split(":")[0]) for chunk in chunks)
        _check(firsts == list(range(writers)), rule, firsts)


async def check_agent_runs_persist_through_the_history_provider(harness: Harness) -> None:
    rule = "runs with HistoryProvider read and append the stored history"
    model = ScriptedChatClient(["one", "two"])
    agent = Agent(model, stack=[HistoryProvider()])
    session = await harness.new()
    await agent.run("first", session=session)
    await agent.run("second", session=session)
    seen = _texts(model.requests[1].messages)
    _check(seen == ["first", "one", "second"], rule, seen)
    stored = _texts(await (await harness.reopen(session)).get_messages())
    _check(stored == ["first", "one", "second", "two"], rule, stored)


# -- request hashes --------------------------------------------------------------------------


def _independent_digest(messages: Sequence[ChatMessage]) -> str:
    """The contract spelled out: SHA-256 of sorted-key, compact, UTF-8 JSON of the messages."""
    rows = []
    for m in messages:
        row: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name is not None:
            row["name"] = m.name
        if m.tool_calls:
            row["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            row["tool_call_id"] = m.tool_call_id
        if m.reasoning is not None:
            row["reasoning"] = {"source": m.reasoning.source, "data": m.reasoning.data}
        if m.compaction is not None:
            row["compaction"] = {"source": m.compaction.source, "data": m.compaction.data}
            if m.compaction.summary is not None:
                row["compaction"]["summary"] = m.compaction.summary
        rows.append(row)
    canonical = json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


async def check_request_hash_digest_is_the_canonical_sha256(harness: Harness) -> None:
    rule = "touch_request_hash returns RequestHash(digest=SHA-256 of the canonical JSON)"
    session = await harness.new()
    request = conversation()
    touched = await session.touch_request_hash(request)
    _check(type(touched) is RequestHash, rule, touched)
    _check(touched.digest == request_hash(request) == _independent_digest(request), rule, touched)
    _check(len(touched.digest) == 64 and int(touched.digest, 16) >= 0, rule, touched.digest)
    again = await session.touch_request_hash(tuple(request))
    _check(again.digest == touched.digest, "the digest does not depend on the sequence type")
    other = await session.touch_request_hash(request[:1])
    _check(other.digest != touched.digest, "different requests have different digests")
    _check(await session.get_messages() == (), "touching a request hash adds no history")


async def check_request_hash_says_whether_it_was_seen(harness: Harness) -> None:
    session = await harness.new()
    request = [ChatMessage.user("hello")]
    first = await session.touch_request_hash(request)
    _check(first.repeated is False, "a digest the session never recorded is not repeated", first)
    second = await session.touch_request_hash(list(request))
    _check(second.repeated is True, "the same request again is repeated", second)
    other = await session.touch_request_hash([ChatMessage.user("bye")])
    _check(other.repeated is False, "another request is not repeated", other)
    again = await (await harness.reopen(session)).touch_request_hash(request)
    _check(again.repeated is True, "a reopened session remembers its digests", again)
    fresh = await (await harness.new()).touch_request_hash(request)
    _check(fresh.repeated is False, "a digest seen by another session is not repeated", fresh)


async def check_request_hashes_have_one_shape(harness: Harness) -> None:
    rule = "request_hashes() is a dict of digest -> unix time last seen, oldest first"
    session = await harness.new()
    _check(await session.request_hashes() == {}, "a new session has no request hashes")
    requests = [[ChatMessage.user(f"r{i}")] for i in range(3)]
    before = time.time()
    digests = [(await session.touch_request_hash(r)).digest for r in requests]
    recorded = await session.request_hashes()
    _check(type(recorded) is dict, rule, type(recorded))
    _check(list(recorded) == digests, rule, list(recorded))
    for seen in recorded.values():
        _check(type(seen) is float, rule, seen)
        _check(abs(seen - before) < 300, f"{rule}: the times are unix seconds", seen)
    _check(
        list(recorded.values()) == sorted(recorded.values()), f"{rule}: times do not fall", recorded
    )
    await session.touch_request_hash(requests[0])
    moved = list(await session.request_hashes())
    _check(moved == [*digests[1:], digests[0]], f"{rule}: a touch makes it the newest", moved)
    recorded = await session.request_hashes()
    recorded.clear()
    _check(len(await session.request_hashes()) == 3, "request_hashes() returns a copy")
    reopened = await (await harness.reopen(session)).request_hashes()
    _check(list(reopened) == moved, f"{rule}: a reopened session has the same record", reopened)


async def check_request_hashes_are_bounded(harness: Harness) -> None:
    rule = f"a session keeps the last REQUEST_HASH_LIMIT={REQUEST_HASH_LIMIT} digests"
    session = await harness.new()
    requests = [[ChatMessage.user(f"turn {i}")] for i in range(REQUEST_HASH_LIMIT + 5)]
    digests = [(await session.touch_request_hash(r)).digest for r in requests]
    recorded = list(await session.request_hashes())
    _check(recorded == digests[-REQUEST_HASH_LIMIT:], rule, len(recorded))
    reopened = list(await (await harness.reopen(session)).request_hashes())
    _check(reopened == digests[-REQUEST_HASH_LIMIT:], rule, len(reopened))
    evicted = await session.touch_request_hash(requests[0])
    _check(evicted.repeated is False, f"{rule}: an evicted digest is forgotten", evicted)
    kept = await session.touch_request_hash(requests[-1])
    _check(kept.repeated is True, f"{rule}: a recent digest is kept", kept)
    _check(len(await session.request_hashes()) == REQUEST_HASH_LIMIT, rule)


async def check_concurrent_touches_record_once(harness: Harness) -> None:
    rule = "touch_request_hash checks and records in one step: of concurrent touches, one is new"
    session = await harness.new()
    request = [ChatMessage.user("double click")]
    results: list[RequestHash] = []

    async def touch() -> None:
        results.append(await session.touch_request_hash(request))

    async with anyio.create_task_group() as group:
        for _ in range(10):
            group.start_soon(touch)
    fresh = [r for r in results if not r.repeated]
    _check(len(fresh) == 1, rule, results)
    _check(list(await session.request_hashes()) == [request_hash(request)], rule)


# -- pending tool calls (approvals) -----------------------------------------------------------


def _pending(session: Session, *names: str) -> list[PendingCall]:
    calls = [ToolCall(f"call_{name}", "delete", json.dumps({"path": name})) for name in names]
    return [PendingCall(call, approval_token(session.id, call)) for call in calls]


def _turn(pending: Sequence[PendingCall]) -> list[ChatMessage]:
    return [
        ChatMessage.user("clean up"),
        ChatMessage.assistant(None, tool_calls=[p.call for p in pending]),
    ]


async def check_record_pending_stores_the_turn_and_its_calls(harness: Harness) -> None:
    rule = "record_pending appends the messages and records the calls, in order, also reopened"
    session = await harness.new()
    _check(await session.list_pending() == (), "a new session has no pending call")
    pending = _pending(session, "a", "b")
    await session.record_pending(_turn(pending), pending)
    for view in (session, await harness.reopen(session)):
        _check(list(await view.get_messages()) == _turn(pending), rule)
        _check(await view.list_pending() == tuple(pending), rule, await view.list_pending())
    bad: list[Any] = [pending[0], "not a call"]
    with _raises(TypeError, "[1]", "record_pending raises a TypeError naming the bad index"):
        await session.record_pending([ChatMessage.user("lost")], bad)
    _check(
        list(await session.get_messages()) == _turn(pending), "a bad record_pending stores nothing"
    )
    _check(await session.list_pending() == tuple(pending), "a bad record_pending records nothing")


async def check_claim_pending_is_all_or_nothing_and_once(harness: Harness) -> None:
    session = await harness.new()
    a, b, c = pending = _pending(session, "a", "b", "c")
    await session.record_pending(_turn(pending), pending)
    rule = "claim_pending with one token that is not pending claims nothing and returns None"
    _check(await session.claim_pending([a.token, "no-such-token"]) is None, rule)
    _check(await session.claim_pending([a.token, a.token]) is None, f"{rule} (a token twice)")
    _check(await session.list_pending() == (a, b, c), rule)
    claimed = await session.claim_pending([c.token, a.token])
    _check(
        claimed == ((c, a), (b,)), "claim_pending returns (claimed in token order, left)", claimed
    )
    again = await (await harness.reopen(session)).claim_pending([a.token])
    _check(again is None, "a claimed call cannot be claimed again, also reopened", again)
    other = await harness.new()
    _check(await other.claim_pending([b.token]) is None, "another session cannot claim a call")
    _check(await session.claim_all_pending() == (b,), "claim_all_pending() claims every call")
    _check(await session.claim_all_pending() == (), "then nothing is pending")
    _check(await session.list_pending() == (), "then nothing is listed")
    with _raises(ValueError, "list_pending", "claim_pending(()) is refused: it claims nothing"):
        await session.claim_pending(())
    _check(len(await session.get_messages()) == 2, "claiming changes no message")


async def check_concurrent_claims_of_one_call_give_it_once(harness: Harness) -> None:
    rule = "of concurrent claims of one call (two store objects too), exactly one gets it"
    session = await harness.new()
    pending = _pending(session, "x")
    await session.record_pending(_turn(pending), pending)
    views = [session, await harness.reopen(session)]
    results: list[object] = []

    async def claim(index: int) -> None:
        results.append(await views[index % 2].claim_pending([pending[0].token]))

    async with anyio.create_task_group() as group:
        for index in range(10):
            group.start_soon(claim, index)
    won = [r for r in results if r is not None]
    _check(won == [((pending[0],), ())], rule, results)


async def check_add_once_writes_once_per_key(harness: Harness) -> None:
    rule = "add_once appends the messages and records the calls once per key, also reopened"
    session = await harness.new()
    pending = _pending(session, "a")
    turn = _turn(pending)
    _check(await session.add_once("run-1", turn, pending) is True, rule)
    _check(await (await harness.reopen(session)).add_once("run-1", turn, pending) is False, rule)
    _check(list(await session.get_messages()) == turn, rule)
    _check(await session.list_pending() == tuple(pending), "add_once records the pending calls")
    await session.claim_all_pending()
    _check(await session.add_once("run-1", turn, pending) is False, "a decided call stays decided")
    _check(await session.list_pending() == (), "a decided call stays decided")
    _check(await session.add_once("run-2", turn[:1]) is True, "another key writes")
    other = await harness.new()
    _check(await other.add_once("run-1", turn[:1]) is True, "keys are per session")
    with _raises(ValueError, "key", "an empty key is a ValueError"):
        await session.add_once("", turn)
    with _raises(TypeError, "[0]", "add_once checks the calls before it writes"):
        await session.add_once("run-3", turn, ["not a call"])  # type: ignore[list-item]
    _check(len(await session.get_messages()) == 3, "a refused add_once writes nothing")


async def check_concurrent_add_once_writes_once(harness: Harness) -> None:
    rule = "of concurrent add_once calls with one key (two store objects too), one writes"
    session = await harness.new()
    views = [session, await harness.reopen(session)]
    results: list[bool] = []

    async def add(index: int) -> None:
        results.append(await views[index % 2].add_once("k", [ChatMessage.user(str(index))]))

    async with anyio.create_task_group() as group:
        for index in range(10):
            group.start_soon(add, index)
    _check(results.count(True) == 1, rule, results)
    _check(len(await session.get_messages()) == 1, rule)


Check = Callable[[Harness], Awaitable[None]]

#: Every check, in a sensible order (cheap first).
CHECKS: tuple[Check, ...] = (
    check_new_session_is_empty,
    check_round_trip_survives_reopening,
    check_history_keeps_order_across_appends,
    check_add_messages_accepts_any_iterable,
    check_add_messages_is_all_or_nothing,
    check_empty_add_changes_nothing,
    check_returned_history_is_a_snapshot,
    check_sessions_are_independent,
    check_last_messages_are_the_newest,
    check_reads_see_other_writers,
    check_concurrent_appends_lose_nothing_and_stay_together,
    check_agent_runs_persist_through_the_history_provider,
    check_request_hash_digest_is_the_canonical_sha256,
    check_request_hash_says_whether_it_was_seen,
    check_request_hashes_have_one_shape,
    check_request_hashes_are_bounded,
    check_concurrent_touches_record_once,
    check_record_pending_stores_the_turn_and_its_calls,
    check_claim_pending_is_all_or_nothing_and_once,
    check_concurrent_claims_of_one_call_give_it_once,
    check_add_once_writes_once_per_key,
    check_concurrent_add_once_writes_once,
    check_last_model_call_is_kept,
)


async def check_round_trip_of_arbitrary_messages(
    harness: Harness, batches: Sequence[Sequence[ChatMessage]]
) -> None:
    """The property behind every round trip: whatever is added comes back, also reopened."""
    rule = "arbitrary messages come back exactly"
    session = await harness.new()
    for batch in batches:
        await session.add_messages(batch)
    expected = [m for batch in batches for m in batch]
    _check(list(await session.get_messages()) == expected, rule)
    _check(list(await (await harness.reopen(session)).get_messages()) == expected, rule)


async def run_checks(harness: Harness) -> None:
    """Run every check of :data:`CHECKS` against one harness, in order."""
    for check in CHECKS:
        try:
            await check(harness)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {exc}") from exc
    await check_round_trip_of_arbitrary_messages(harness, [conversation(), conversation()[::-1]])


def check_session_store(
    factory: Callable[[], Session | Awaitable[Session]],
    *,
    backends: Sequence[str] = ("asyncio", "trio"),
) -> None:
    """Run the session conformance suite against the sessions ``factory`` makes.

    ``factory()`` (awaited if it returns a coroutine) returns a fresh,
    empty :class:`raf.Session`, a different one on each call. A plain
    function: it runs every check of :data:`CHECKS` on each of ``backends``
    with :func:`anyio.run`, and raises ``AssertionError`` naming the check
    and the rule the store broke. Call it from a plain (not async) test.

    >>> from raf import InMemorySession
    >>> check_session_store(InMemorySession)
    """
    if not callable(factory):
        raise TypeError(f"check_session_store(factory): factory must be callable, got {factory!r}")
    harness = FactoryHarness(factory)
    for backend in backends:
        try:
            anyio.run(run_checks, harness, backend=backend)
        except AssertionError as exc:
            raise AssertionError(f"check_session_store ({backend}): {exc}") from exc
