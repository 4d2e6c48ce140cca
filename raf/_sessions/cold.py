"""Cuts the cache pays for anyway: the session's last model call, and the cuts it fixed.

A provider's prompt cache lives a few minutes after its last use. When the
session's last model call is older than that, the next call is billed in
full whatever it sends, so a bounding view (a window, a strategy, tool
results cleared) makes now the cut it would make next, to its low mark: the
size it has right after a step. A view moved early must stay there on the
warm calls that follow (moving back would break the prefix it just paid
for), so each view's start is kept with the session next to the time of the
last call: a *floor*, by its key, an index in the stored history.

A session keeps them when it has ``last_model_call()`` and
``record_model_call(at, cuts)`` (every raf store does); with another
session, ``cold_after`` has no effect.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import attrs

__all__: list[str] = []

#: The default ``cold_after``: seconds, a provider prompt cache's usual lifetime.
COLD_AFTER = 300.0


@attrs.frozen(slots=True)
class LastModelCall:
    """When the session's last model call ended (``at``, seconds since the epoch), and the
    start of each bounding view it sent (``cuts``: key -> index in the stored history)."""

    at: float
    cuts: Mapping[str, int] = attrs.field(factory=dict)

    def to_json(self) -> str:
        """The record as the stores keep it."""
        return json.dumps({"at": self.at, "cuts": dict(self.cuts)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> LastModelCall:
        """The inverse of :meth:`to_json`."""
        data: dict[str, Any] = json.loads(text)
        return cls(float(data["at"]), {str(k): int(v) for k, v in data.get("cuts", {}).items()})

    def merged(self, at: float, cuts: Mapping[str, int]) -> LastModelCall:
        """A record at ``at`` with ``cuts`` over this one's (a key not given is kept)."""
        return LastModelCall(at, {**self.cuts, **cuts})


def checked_cold_after(value: float | None) -> float | None:
    """``cold_after`` checked: ``None`` or a number of seconds >= 0 (a clear ``ValueError``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(
            f"cold_after must be None (never cut early) or seconds >= 0, got {value!r}; "
            "write e.g. cold_after=300.0 (a prompt cache's usual lifetime)"
        )
    if math.isinf(value):
        return None
    return float(value)


@attrs.define
class Cuts:
    """What the bounding views of one provider see of the cache for one run.

    ``age`` is how long ago the session's last model call ended (``None``:
    none recorded, a call only ``cold_after=0`` treats as cold); ``keeps``
    whether the session keeps the record at all (when it does not, no view
    cuts early: it could not stay there); ``floors`` the starts kept with
    the session (by key, in the stored history); ``made`` the starts this
    run's views took, to keep.
    """

    age: float | None
    floors: Mapping[str, int]
    keeps: bool = True
    #: The provider's own prefix of every key (its name), so two providers keep apart.
    prefix: str = ""
    #: Where the messages a strategy is given start in the stored history.
    offset: int = 0
    made: dict[str, int] = attrs.field(factory=dict)

    def is_cold(self, cold_after: float | None) -> bool:
        """Whether a view with ``cold_after`` treats this call as cold."""
        if not self.keeps or cold_after is None:
            return False
        return cold_after == 0 or (self.age is not None and self.age >= cold_after)

    def start(
        self,
        key: str,
        stepped: int,
        due_next: int,
        *,
        cold_after: float | None,
        limit: int,
        offset: int | None = None,
    ) -> int:
        """The start a view takes: its ``stepped`` start, never before its floor, and when
        the call is cold the start ``due_next`` (its next cut); at most ``limit``.

        ``offset`` is where the view's first message is in the stored history (by
        default :attr:`offset`).
        """
        key = self.prefix + key
        offset = self.offset if offset is None else offset
        start = max(stepped, self.floors.get(key, 0) - offset)
        if self.is_cold(cold_after):
            start = max(start, due_next)
        start = min(start, limit)
        if self.keeps:
            self.made[key] = start + offset
        return start


def view_start(
    key: str,
    stepped: int,
    due_next: int,
    *,
    cold_after: float | None,
    limit: int,
) -> int:
    """:meth:`Cuts.start` under the provider that runs this strategy, else ``stepped``."""
    cuts = CUTS.get()
    if cuts is None:
        return stepped
    return cuts.start(key, stepped, due_next, cold_after=cold_after, limit=limit)


#: The cuts of the CompressionProvider whose strategy runs now (None: a strategy called
#: on its own computes its plain stepped start).
CUTS: ContextVar[Cuts | None] = ContextVar("raf_cuts", default=None)


async def read_cuts(session: object, prefix: str) -> Cuts:
    """The cuts of the views whose keys start with ``prefix``, with the age of the last call."""
    read = getattr(session, "last_model_call", None)
    if not callable(read) or not callable(getattr(session, "record_model_call", None)):
        return Cuts(None, {}, keeps=False)
    last: LastModelCall | None = await read()
    if last is None:
        return Cuts(None, {}, prefix=prefix)
    return Cuts(max(0.0, time.time() - last.at), last.cuts, prefix=prefix)


async def keep_cuts(session: object, cuts: Cuts | None) -> None:
    """Record now as the session's last model call, with the starts ``cuts`` took."""
    if cuts is None or not cuts.keeps:
        return
    await session.record_model_call(time.time(), dict(cuts.made))  # type: ignore[attr-defined]
