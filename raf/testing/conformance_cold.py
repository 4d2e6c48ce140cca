"""The conformance check of a store's record of the last model call (``cold_after``).

A store that has ``last_model_call()`` and ``record_model_call(at, cuts)``
keeps, per session, the time of its last model call and the starts of its
bounded views (see ``docs/long-running.md``); a store without them is not
checked here (``cold_after`` then has no effect with it).
"""

from __future__ import annotations

from typing import Any, Protocol


class Harness(Protocol):
    """:class:`raf.testing.conformance.Harness`'s shape (that module runs this check)."""

    async def new(self) -> Any: ...

    async def reopen(self, session: Any) -> Any: ...

__all__ = ["check_last_model_call_is_kept"]


def _check(condition: bool, rule: str, detail: object = "") -> None:
    if not condition:
        raise AssertionError(f"{rule}" + (f" (got {detail!r})" if detail != "" else ""))


def _shape(record: Any) -> tuple[float, dict[str, int]] | None:
    return None if record is None else (record.at, dict(record.cuts))


async def check_last_model_call_is_kept(harness: Harness) -> None:
    rule = "the last model call is kept with the session, each view's start merged in"
    session: Any = await harness.new()
    if not callable(getattr(session, "record_model_call", None)):
        return
    _check(await session.last_model_call() is None, f"{rule}: a new session has none")
    await session.record_model_call(1000.5, {"a/messages": 4})
    _check(_shape(await session.last_model_call()) == (1000.5, {"a/messages": 4}), rule)
    await session.record_model_call(2000.25, {"b/cut": 7})
    await session.record_model_call(2500.0, {"a/messages": 6})
    want = (2500.0, {"a/messages": 6, "b/cut": 7})
    _check(_shape(await session.last_model_call()) == want, rule, await session.last_model_call())
    again: Any = await harness.reopen(session)
    _check(_shape(await again.last_model_call()) == want, f"{rule}: also once reopened")
    await again.add_messages([])
    other: Any = await harness.new()
    _check(await other.last_model_call() is None, f"{rule}: sessions keep their own")
