"""What LongTermMemory asks its extractor after a turn, and how the answer becomes a write.

One structured-output request shows the stored memories with their ids and the
turn's conversation; the model answers new facts, updates (by id) and deletions
(by id). The answer is consolidated before it is written: an id the model was not
shown is ignored, a fact already kept (the same words, case and spacing aside) is
not added again, and an update that makes a memory repeat another deletes it.
"""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Final

from raf._agent.output import OutputSpec, output_spec
from raf._providers.knowledge import BM25Index, Passage
from raf._sessions.memories import MemoryRecord, MemoryWrite
from raf._values.messages import ChatMessage

__all__: list[str] = []

#: The longest memory kept, in characters: a fact, not a document.
MAX_FACT: Final = 1000
#: The most stored memories one extraction request shows (the most relevant to the turn).
MAX_SHOWN: Final = 200
#: How much of each message, and of the whole conversation, the request quotes.
_MAX_MESSAGE: Final = 2000
_MAX_CONVERSATION: Final = 24_000

EXTRACTION_PROMPT: Final = (
    "You keep the long-term memory of an assistant: short facts about the user and their "
    "world that will still matter in later conversations (preferences, names, plans, "
    "decisions, standing instructions). Read the conversation and the stored memories, "
    "then answer with the changes to make:\n"
    "- add: new facts, each one short sentence that stands on its own; never a fact "
    "that a stored memory already says;\n"
    "- update: stored memories (by id) whose fact changed or can be said better, with "
    "their new text;\n"
    "- delete: ids of stored memories the conversation shows wrong or no longer wanted "
    "(the user asked to forget them).\n"
    "Leave out small talk, one-off requests, and anything said only by the assistant. "
    "When nothing is worth keeping, answer three empty lists."
)


@functools.cache
def changes_spec() -> OutputSpec:
    """The output spec of the extractor's answer (pydantic imported here, on first use)."""
    import pydantic

    class MemoryUpdate(pydantic.BaseModel):
        id: str
        text: str

    class MemoryChanges(pydantic.BaseModel):
        add: list[str]
        update: list[MemoryUpdate]
        delete: list[str]

    return output_spec(MemoryChanges)


def normal(text: str) -> str:
    """The form two memories that say the same thing share: case, spacing and a final
    full stop aside."""
    return " ".join(text.casefold().split()).rstrip(".!")


def shown(records: Sequence[MemoryRecord], conversation: str) -> list[MemoryRecord]:
    """The stored memories an extraction request shows: all, or the :data:`MAX_SHOWN`
    most relevant to ``conversation`` (then the newest), in stored order."""
    if len(records) <= MAX_SHOWN:
        return list(records)
    index = BM25Index(Passage(r.text, str(n)) for n, r in enumerate(records))
    best = [int(p.source) for p in index.search(conversation, MAX_SHOWN)]
    chosen = set(best)
    for n in range(len(records) - 1, -1, -1):
        if len(chosen) >= MAX_SHOWN:
            break
        chosen.add(n)
    return [records[n] for n in sorted(chosen)]


def transcript(messages: Iterable[ChatMessage]) -> str:
    """The conversation as the request quotes it: one ``role: text`` paragraph a message
    (each cut to its first characters; the newest kept when the whole is too long)."""
    lines: list[str] = []
    for message in messages:
        text = (message.content or "").strip()
        if message.tool_calls:
            text += "".join(f"\n(calls {call.name})" for call in message.tool_calls)
        if not text or message.role == "system":
            continue
        if len(text) > _MAX_MESSAGE:
            text = text[:_MAX_MESSAGE] + " [...]"
        lines.append(f"{message.role}: {text}")
    while len(lines) > 1 and sum(len(line) + 2 for line in lines) > _MAX_CONVERSATION:
        del lines[0]
    return "\n\n".join(lines)


def request(records: Sequence[MemoryRecord], conversation: str) -> list[ChatMessage]:
    """The extraction request: the prompt, then the stored memories and the conversation."""
    stored = "\n".join(f"[{r.id}] {r.text}" for r in records) or "(none yet)"
    return [
        ChatMessage.system(EXTRACTION_PROMPT),
        ChatMessage.user(
            f"Stored memories:\n{stored}\n\nConversation:\n{conversation}\n\n"
            "Answer the changes as JSON."
        ),
    ]


def new_id() -> str:
    """A memory id: short, for the model to quote, and unique in practice."""
    return uuid.uuid4().hex[:12]


def consolidated(
    answer: Any,
    stored: Sequence[MemoryRecord],
    shown_ids: set[str],
    session_id: str | None,
    *,
    now: float | None = None,
) -> tuple[MemoryWrite, list[str]]:
    """The write the extractor's ``answer`` (a validated ``MemoryChanges``) asks for,
    consolidated against ``stored``; and what was left out, and why (for the log)."""
    now = time.time() if now is None else now
    skipped: list[str] = []
    deleted = {id for id in answer.delete if id in shown_ids}
    skipped += [f"delete of unknown id {id!r}" for id in answer.delete if id not in shown_ids]
    # What each kept memory says, once the deletions are done: a new fact must not repeat it.
    says: dict[str, str] = {normal(r.text): r.id for r in stored if r.id not in deleted}
    updates: dict[str, MemoryRecord] = {}
    for change in answer.update:
        text = change.text.strip()
        if change.id not in shown_ids or change.id in deleted:
            skipped.append(f"update of unknown id {change.id!r}")
        elif not text or len(text) > MAX_FACT:
            skipped.append(f"update of {change.id!r} to an empty or too long text")
        else:
            # What it said is no longer said by it: updated, or deleted just below.
            says = {k: v for k, v in says.items() if v != change.id}
            updates.pop(change.id, None)
            if normal(text) in says:
                deleted.add(change.id)  # it would repeat another memory: that one is kept
            else:
                says[normal(text)] = change.id
                updates[change.id] = MemoryRecord(change.id, text, session_id, now)
    added: list[MemoryRecord] = []
    for fact in answer.add:
        text = fact.strip()
        if not text or len(text) > MAX_FACT:
            skipped.append("a new fact that is empty or too long")
        elif normal(text) not in says:
            record = MemoryRecord(new_id(), text, session_id, now)
            says[normal(text)] = record.id
            added.append(record)
    write = MemoryWrite(tuple(added), tuple(updates.values()), tuple(sorted(deleted)))
    return write, skipped


_SPACE = re.compile(r"\s+")


def one_line(text: str) -> str:
    """``text`` on one line (a memory shown in a list)."""
    return _SPACE.sub(" ", text).strip()
