"""LongTermMemory: facts an agent keeps across sessions, recalled into the tail of each
run and extracted from its turns, in a namespace of their own.

The provider's namespace is a run's own (a callable of the invocation may name
it: the user), so it is one layer of the run stack that resolves the namespace
and then runs the usual provider stages for it (:meth:`LongTermMemory.build_layer`,
the onion's own provider layer: its post-stage policy, its observers).
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, Self

import attrs

from raf._agent.tools import FunctionTool
from raf._log import log
from raf._onion.compose import CompleteInvocation, provider_layer
from raf._onion.errors import stage_error
from raf._providers import _memory_extraction as extraction
from raf._providers.knowledge import BM25Index, Passage, tokenize
from raf._sessions.base import Session
from raf._sessions.memories import (
    MemoryRecord,
    MemoryTable,
    MemoryWrite,
    checked_namespace,
)
from raf._sessions.memory_tables import memory_table
from raf._sessions.sqlite import SqliteSessionStore
from raf._sessions.stores import is_postgres_url, is_redis_url, server_store
from raf._values.context import ContextResult, Invocation
from raf._values.messages import AgentResponse, ChatMessage
from raf._values.options import AgentRunOptions, ChatOptions
from raf._values.protocols import Tool
from raf._values.run import KEY_SCOPE, key_scope
from raf.errors import ConfigError, EmbeddingError

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__ = ["LongTermMemory"]

#: A namespace, or how a run names its own.
Namespace = str | Callable[[Invocation], str | Awaitable[str]]
#: Indexes of records, best first.
Ranking = list[int]
#: The rank fusion's constant (Cormack et al., 2009): a lower rank counts less, never nothing.
_RRF_K: Final = 60
#: How many texts' vectors a LongTermMemory keeps (the least recently added go first).
_MAX_VECTORS: Final = 10_000
#: How many namespaces' BM25 indexes one LongTermMemory keeps.
_MAX_INDEXES: Final = 1000
#: How many sessions' turn counts (for ``extract_every``) one LongTermMemory keeps.
_MAX_COUNTED: Final = 10_000
#: How many messages of the session's history an extraction every N turns reads, per turn.
_MESSAGES_PER_TURN: Final = 40

_RECALL = (
    "Memories from earlier conversations with this user (long-term memory), most "
    "relevant first. Use them when they help; they may be out of date, and the user's "
    "own words in this conversation win."
)
_TOOLS = (
    " You can keep a new fact with the remember tool, and drop a wrong or unwanted one "
    "with the forget tool and its id."
)


def _stored_namespace(namespace: str, scope: str) -> str:
    """The namespace a store keeps: a served caller's key scope in front (``\\x1f`` apart:
    no namespace a person names holds it, so none can name another key's)."""
    return f"{scope}\x1f{namespace}" if scope else namespace


def _person_namespace(namespace: object) -> str:
    """``namespace`` as a person or a callable names one: non-empty, printable."""
    checked = checked_namespace(namespace)
    if not checked.isprintable():
        raise ValueError(f"a memory namespace must be printable text, got {checked!r:.80}")
    return checked


def _store_table(store: object) -> tuple[MemoryTable, Any]:
    """The memory table of ``store`` and the store raf opened for it (``None``: the
    caller's own): a URL or path opens a session store (closed with the memory)."""
    if isinstance(store, (str, os.PathLike)):
        if isinstance(store, str) and is_redis_url(store):
            opened: Any = server_store("redis", store)
        elif isinstance(store, str) and is_postgres_url(store):
            opened = server_store("postgres", store)
        else:
            opened = SqliteSessionStore(store)
        return memory_table(opened), opened  # type: ignore[return-value]
    table = memory_table(store)
    if table is not None:
        return table, None
    if isinstance(store, MemoryTable):
        return store, None
    raise TypeError(
        "LongTermMemory(store): a session store URL or path, a session store (in memory, "
        "SQLite, Redis, PostgreSQL) or a memory table such as raf.InMemoryMemories(), got "
        f"{store!r:.80}"
    )


class LongTermMemory:
    """Facts an agent keeps across sessions: recalled before each turn, extracted after.

    ``store`` is where the memories live: a session store's URL or path
    (``"memories.db"``, ``"redis://..."``, ``"postgresql://..."``, opened by
    ``async with memory:`` and closed with it), a session store (SQLite,
    Redis, PostgreSQL: their memories live beside the sessions), or
    :class:`raf.InMemoryMemories` (this process only).

    ``namespace`` scopes everything: a string, or a callable of the
    :class:`raf.Invocation` (sync or async) that names the run's own (the
    user: ``lambda invocation: invocation.session.id``). A run reads and
    writes its namespace only; served (:mod:`raf.serve`), the caller's API
    key scopes it too, so two keys never share a memory.

    - Read (the pre stage): the ``top_k`` memories most relevant to the last
      user message, in the tail (``volatile``: they change with the question,
      the cached prefix stays put). Search is BM25; with an ``embedder``
      (:class:`raf.OpenAIEmbedder`), hybrid: BM25 and vector similarity, fused
      by rank. An embedder that fails (or whose vectors change dimension) is
      logged and skipped: BM25 answers alone.
    - Write (the post stage of a successful turn), every ``extract_every``
      turns of a session (``0``: never): one structured-output request to
      ``extractor`` (a chat client; default the agent's) shows the stored
      memories with their ids and the turns since the last extraction, and
      asks for new facts, updates and deletions; consolidated (a fact is never
      kept twice) and written in one step. An answer that is not the JSON
      asked for is logged and skipped; nothing stored is lost. A failing call
      or store follows raf's post-stage policy (the run's ProviderError).
    - ``tools=True`` also offers the model ``remember(fact)`` and
      ``forget(memory_id)``.

    :meth:`list` and :meth:`delete` let a person see and remove what is kept
    about them (each memory with its session and time).
    """

    kind = "long_term_memory"

    def __init__(
        self,
        store: Any,
        *,
        namespace: Namespace,
        top_k: int = 5,
        extract_every: int = 1,
        extractor: Any = None,
        embedder: Any = None,
        tools: bool = False,
        name: str | None = None,
    ) -> None:
        if isinstance(namespace, str):
            _person_namespace(namespace)
        elif not callable(namespace):
            raise TypeError(
                "namespace must be a str or a callable of the invocation, got "
                f"{type(namespace).__name__}"
            )
        for what, value, least in (("top_k", top_k, 1), ("extract_every", extract_every, 0)):
            if type(value) is not int or value < least:
                raise ValueError(f"{what} must be an int >= {least}, got {value!r}")
        if extractor is not None and not callable(getattr(extractor, "complete", None)):
            raise TypeError(f"extractor must be a chat client (async complete()): {extractor!r}")
        if embedder is not None and not callable(getattr(embedder, "embed", None)):
            raise TypeError(f"embedder must have an async embed(texts): {embedder!r}")
        if not isinstance(tools, bool):
            raise TypeError(f"tools must be a bool, got {tools!r}")
        self.table, self._opened = _store_table(store)
        self.namespace = namespace
        self.top_k, self.extract_every = top_k, extract_every
        self.extractor, self.embedder, self.tools = extractor, embedder, tools
        self.name = name or type(self).__name__
        # Caches of this object (never per run): text -> vector; (namespace, session) ->
        # turns; namespace -> its memories and their index.
        self._vectors: dict[str, tuple[float, ...]] = {}
        self._indexes: dict[str, tuple[tuple[MemoryRecord, ...], BM25Index]] = {}
        self._turns: dict[tuple[str, str], int] = {}

    # -- the layer ---------------------------------------------------------------------

    def build_layer(
        self,
        call_next: CompleteInvocation,
        *,
        where: str,
        post_timeout: float,
        observers: Sequence[Any] = (),
    ) -> CompleteInvocation:
        """The memory as one layer of the run stack: the run's namespace first, then the
        provider stages for it (the onion's provider layer, built for the run)."""

        async def layer(invocation: Invocation) -> AgentResponse:
            try:
                namespace = await self._namespace_of(invocation)
            except Exception as exc:
                raise stage_error(self, "on_invoking", exc) from exc
            stages = _Stages(self, namespace)
            run = provider_layer(stages, call_next, post_timeout=post_timeout, observers=observers)
            return await run(invocation)

        return layer

    async def _namespace_of(self, invocation: Invocation) -> str:
        """The namespace the run's memories are kept in (with a served caller's key scope)."""
        namespace: Any = self.namespace
        if callable(namespace):
            namespace = namespace(invocation)
            if inspect.isawaitable(namespace):
                namespace = await namespace
        scope = invocation.run.state.get(KEY_SCOPE, "")
        return _stored_namespace(_person_namespace(namespace), scope)

    # -- what a person sees and removes ---------------------------------------------------

    async def list(self, namespace: str, *, api_key: str | None = None) -> tuple[MemoryRecord, ...]:
        """The memories kept in ``namespace`` (oldest first), each with its ``id``,
        ``text``, ``session_id`` and ``created_at``; ``api_key``: those a served caller
        with that key has there."""
        return await self.table.list(self._owned(namespace, api_key))

    async def delete(self, namespace: str, memory_id: str, *, api_key: str | None = None) -> bool:
        """Forget the memory ``memory_id`` of ``namespace``; whether it was there."""
        if type(memory_id) is not str or not memory_id:
            raise ValueError(f"memory_id must be a non-empty str, got {memory_id!r}")
        found = await self.table.write(
            self._owned(namespace, api_key), MemoryWrite(delete=(memory_id,))
        )
        return found > 0

    async def remember(
        self,
        namespace: str,
        fact: str,
        *,
        session_id: str | None = None,
        api_key: str | None = None,
    ) -> str:
        """Keep ``fact`` in ``namespace`` (as the ``remember`` tool does); its id, or the
        id of the memory that already says it. A ``ValueError`` for an empty fact or one
        over 1,000 characters."""
        id, _ = await self._keep(self._owned(namespace, api_key), fact, session_id)
        return id

    def _owned(self, namespace: str, api_key: str | None) -> str:
        scope = "" if api_key is None else key_scope(api_key)
        return _stored_namespace(_person_namespace(namespace), scope)

    # -- read -------------------------------------------------------------------------

    async def _recall(self, namespace: str, query: str) -> tuple[MemoryRecord, ...]:
        """The ``top_k`` memories of the stored ``namespace`` most relevant to ``query``."""
        records = await self.table.list(namespace)
        if not records or not query.strip():
            return ()
        # The scores, not search(): a ranking of every match, without a Passage each.
        scores = self._index(namespace, records).scores(query)
        matched = (n for n, score in scores.items() if score > 0)
        lexical = sorted(matched, key=lambda n: (-scores[n], n))
        semantic = await self._similar(query, records) if self.embedder is not None else None
        if semantic is None:
            return tuple(records[n] for n in lexical[: self.top_k])
        fused: dict[int, float] = {}
        for ranking in (lexical, semantic):
            for rank, n in enumerate(ranking):
                fused[n] = fused.get(n, 0.0) + 1.0 / (_RRF_K + rank + 1)
        best = sorted(fused, key=lambda n: (-fused[n], n))[: self.top_k]
        return tuple(records[n] for n in best)

    def _index(self, namespace: str, records: tuple[MemoryRecord, ...]) -> BM25Index:
        """The BM25 index of ``records``, built once while the namespace's memories stay
        the same (tokenizing is most of a read's cost)."""
        kept = self._indexes.pop(namespace, None)
        if kept is None or kept[0] != records:
            kept = (records, BM25Index(Passage(r.text, str(n)) for n, r in enumerate(records)))
        self._indexes[namespace] = kept  # the most recently used last: the oldest go first
        while len(self._indexes) > _MAX_INDEXES:
            del self._indexes[next(iter(self._indexes))]
        return kept[1]

    async def _similar(self, query: str, records: Sequence[MemoryRecord]) -> Ranking | None:
        """The records by the cosine of their vector and the query's, best first; ``None``
        (logged) when the embedder fails or its vectors do not fit together."""
        missing = list(dict.fromkeys(r.text for r in records if r.text not in self._vectors))
        try:
            vectors = await self.embedder.embed([query, *missing])
            if len(vectors) != len(missing) + 1:
                raise EmbeddingError(f"{len(vectors)} vectors for {len(missing) + 1} texts")
            for text, vector in zip(missing, vectors[1:], strict=True):
                self._keep_vector(text, tuple(vector))
            wanted = tuple(vectors[0])
            scores = [_cosine(wanted, self._vectors[r.text]) for r in records]
        except Exception as exc:
            # A changed dimension poisons what was kept: the next read embeds afresh.
            self._vectors.clear()
            log.warning(
                "memory.embedder_skipped",
                provider=self.name,
                error=f"{type(exc).__name__}: {exc}",
                detail="vector search skipped for this turn; BM25 alone answered",
            )
            return None
        return sorted(range(len(records)), key=lambda n: (-scores[n], n))

    def _keep_vector(self, text: str, vector: tuple[float, ...]) -> None:
        self._vectors[text] = vector
        while len(self._vectors) > _MAX_VECTORS:
            del self._vectors[next(iter(self._vectors))]

    # -- write ------------------------------------------------------------------------

    def _due(self, namespace: str, session: Session) -> int:
        """How many turns this extraction covers; 0 when it is not due yet."""
        if self.extract_every <= 1:
            return self.extract_every
        key = (namespace, session.id)
        turns = self._turns.pop(key, 0) + 1
        if turns < self.extract_every:
            self._turns[key] = turns  # the most recent last: the oldest go first
            while len(self._turns) > _MAX_COUNTED:
                del self._turns[next(iter(self._turns))]
            return 0
        return turns

    async def _extract(
        self,
        namespace: str,
        agent: AgentLike | None,
        session: Session,
        turn: Sequence[ChatMessage],
        turns: int = 1,
    ) -> MemoryWrite:
        """Ask the extractor what ``turn`` (and the ``turns - 1`` before it, from the
        session's history) changes in the stored ``namespace``, and write it. An answer
        that is not the JSON asked for is logged and skipped (an empty write)."""
        extractor = self.extractor or getattr(agent, "chat_client", None)
        if extractor is None:
            raise ConfigError(
                f"{self.name}: no extractor and no agent's chat client to extract memories "
                "with: pass extractor= (or extract_every=0)"
            )
        messages = list(turn)
        if turns > 1:
            messages = [*await _earlier_turns(session, turns - 1, turn), *messages]
        conversation = extraction.transcript(messages)
        if not tokenize(conversation):
            return MemoryWrite()
        stored = await self.table.list(namespace)
        shown = extraction.shown(stored, conversation)
        spec = extraction.changes_spec()
        reply = await extractor.complete(
            extraction.request(shown, conversation), ChatOptions(output_schema=spec.schema)
        )
        try:
            answer = spec.validate(reply.text or "")
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            log.warning(
                "memory.extraction_skipped",
                provider=self.name,
                error=f"{type(exc).__name__}: {str(exc)[:500]}",
                detail="the extractor's answer is not the JSON asked for; nothing was changed",
            )
            return MemoryWrite()
        write, skipped = extraction.consolidated(answer, stored, {r.id for r in shown}, session.id)
        if skipped:
            log.info("memory.extraction_partial", provider=self.name, skipped=skipped[:20])
        if write:
            await self.table.write(namespace, write)
        return write

    async def _keep(self, stored: str, fact: str, session_id: str | None) -> tuple[str, bool]:
        """Keep ``fact`` in the stored namespace: its id, and whether it is new (a fact
        already kept, in other words, is not kept twice)."""
        text = fact.strip() if isinstance(fact, str) else ""
        if not text or len(text) > extraction.MAX_FACT:
            raise ValueError(f"a memory is 1 to {extraction.MAX_FACT} characters of text")
        for record in await self.table.list(stored):
            if extraction.normal(record.text) == extraction.normal(text):
                return record.id, False
        record = MemoryRecord(extraction.new_id(), text, session_id, time.time())
        await self.table.write(stored, MemoryWrite(add=(record,)))
        return record.id, True

    async def _remember_tool(self, stored: str, fact: str, session_id: str) -> str:
        """The ``remember`` tool: what to tell the model."""
        try:
            id, new = await self._keep(stored, fact, session_id)
        except ValueError as exc:
            return f"Not kept: {exc}."
        return f"Remembered as [{id}]." if new else f"Already remembered as [{id}]."

    async def _forget_tool(self, stored: str, memory_id: str) -> str:
        """The ``forget`` tool: what to tell the model."""
        found = await self.table.write(stored, MemoryWrite(delete=(memory_id,)))
        return f"Forgot [{memory_id}]." if found else f"No memory [{memory_id}] is kept."

    # -- resources ----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Open the store raf opened from a URL (a Redis store must be opened and closed
        in one task: here, and in :meth:`aclose`)."""
        if self._opened is not None and callable(getattr(self._opened, "open", None)):
            await self._opened.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the store raf opened from a URL (a store you passed in stays open)."""
        if self._opened is not None:
            await self._opened.aclose()

    def __repr__(self) -> str:
        return f"<LongTermMemory name={self.name!r} kind={self.kind!r} table={self.table!r}>"


@attrs.frozen(slots=True)
class _Stages:
    """The provider stages of one run of a :class:`LongTermMemory`, in its namespace."""

    memory: LongTermMemory
    namespace: str

    @property
    def name(self) -> str:
        return self.memory.name

    @property
    def kind(self) -> str:
        return self.memory.kind

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """The memories most relevant to the last user message, in the tail."""
        memory = self.memory
        query = next((m.content for m in reversed(messages) if m.role == "user" and m.content), "")
        found = await memory._recall(self.namespace, query) if tokenize(query) else ()
        tools = _tools(memory, self.namespace, session.id) if memory.tools else ()
        if not found:
            # The tools' sentence in the tail too: the system message stays the same.
            return ContextResult(
                instructions=_TOOLS.strip() if tools else None, tools=tools, volatile=True
            )
        lines = "\n".join(f"- [{r.id}] {extraction.one_line(r.text)} ({_day(r)})" for r in found)
        text = f"{_RECALL}{_TOOLS if tools else ''}\n\n{lines}"
        return ContextResult(instructions=text, tools=tools, volatile=True)

    async def on_invoked(
        self,
        agent: AgentLike | None,
        session: Session,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        """Every ``extract_every`` successful turns: extract, consolidate, write."""
        if response is None or error is not None:
            return
        turns = self.memory._due(self.namespace, session)
        if turns:
            turn = (*request_messages, *response.messages)
            await self.memory._extract(self.namespace, agent, session, turn, turns)


def _tools(memory: LongTermMemory, namespace: str, session_id: str) -> tuple[Tool, ...]:
    """The ``remember`` and ``forget`` tools of one run (its namespace, its session)."""

    async def remember(fact: str) -> str:
        return await memory._remember_tool(namespace, fact, session_id)

    async def forget(memory_id: str) -> str:
        return await memory._forget_tool(namespace, memory_id)

    fact = _one_string("fact", "One short sentence that stands on its own.")
    memory_id = _one_string("memory_id", "The id of the memory, as shown in brackets.")
    return (
        FunctionTool(remember, "remember", "Keep a fact about the user for later.", fact),
        FunctionTool(forget, "forget", "Forget a memory that is wrong or unwanted.", memory_id),
    )


def _one_string(name: str, description: str) -> Mapping[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
        "additionalProperties": False,
    }


async def _earlier_turns(
    session: Session, count: int, turn: Sequence[ChatMessage]
) -> list[ChatMessage]:
    """The ``count`` turns before ``turn`` in the session's history (what a history
    provider kept; none without one)."""
    last = getattr(session, "get_last_messages", None)
    wanted = _MESSAGES_PER_TURN * (count + 1)
    if callable(last):
        history = list(await last(wanted))
    else:
        history = list((await session.get_messages())[-wanted:])
    if turn and history[-len(turn) :] == list(turn):
        history = history[: -len(turn)]  # a history provider inside this one stored it already
    starts = [n for n, m in enumerate(history) if m.role == "user"]
    if not starts:
        return []
    return history[starts[-min(count, len(starts))] :]


def _cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    if len(a) != len(b):
        raise EmbeddingError(
            f"vectors of {len(a)} and {len(b)} dimensions cannot be compared (the embedder's "
            "dimension changed)"
        )
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


def _day(record: MemoryRecord) -> str:
    return datetime.fromtimestamp(record.created_at, UTC).strftime("%Y-%m-%d")
