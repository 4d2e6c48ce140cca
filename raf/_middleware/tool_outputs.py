"""ToolOutputLimit: a tool result longer than a bound is cut once, when it is produced.

Tool-stack middleware (``Agent(tool_stack=[...])``). The model and the stored
history get the cut text (the head and the tail, or the head) with a marker
that says how much was left out and how to read it back; the full text is
kept with the session (``spill=True``), and the agent offers the model
``read_tool_result`` while a cut result is in what it sees (see
:mod:`raf._middleware.tool_output_read`).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Literal

import attrs

from raf._log import log as _log
from raf._middleware.tool_output_read import READ_TOOL, read_result
from raf._sessions.base import keeps_spills
from raf._values.context import ToolRequest
from raf._values.messages import ChatMessage
from raf._values.protocols import Session, Tool
from raf._values.spill import cut_marker, mentions_spill, spill_key

__all__ = ["ToolOutputLimit"]

#: The room a marker takes at most (a 64-character call id, a result of a billion
#: characters), with the line breaks around it: the least ``max_chars`` can be.
MARKER_CHARS: Final = len(cut_marker("c" * 64, 10**9, 10**8, 10**9 - 1)) + 2


def _max_chars(instance: ToolOutputLimit, attribute: object, value: int) -> None:
    if type(value) is not int:
        raise TypeError(f"ToolOutputLimit(max_chars) must be an int, got {value!r}")
    if value < MARKER_CHARS:
        raise ValueError(
            f"ToolOutputLimit(max_chars={value}): max_chars must be at least {MARKER_CHARS}, "
            f"the room of the marker that says what was left out and how to read it; write "
            f"ToolOutputLimit({MARKER_CHARS}) or more (a few thousand keeps a useful preview)"
        )


def _preview_chars(instance: ToolOutputLimit, attribute: object, value: int | None) -> None:
    if value is None:
        return
    most = instance.max_chars - MARKER_CHARS
    if type(value) is not int or not 0 <= value <= most:
        raise ValueError(
            f"ToolOutputLimit(max_chars={instance.max_chars}, preview_chars={value!r}): "
            f"preview_chars must be an int from 0 to {most} (max_chars less the marker's "
            f"{MARKER_CHARS}), or None for the most that fits"
        )


@attrs.frozen
class ToolOutputLimit:
    """Tool-stack middleware: a result longer than ``max_chars`` characters is cut once.

    ``Agent(tool_stack=[ToolOutputLimit(8000)])``. A tool result longer than
    ``max_chars`` is reduced when it is produced, before the model or the
    history sees it: to its head and its tail (``keep="head_tail"``) or its
    head (``keep="head"``), cut at a line break when one is near, with a
    marker in the place of what was left out::

        [raf: 18,000 characters left out (characters 1,000 to 19,000 of 20,000);
        read them with read_tool_result(call_id="call_1", offset=1000)]

    The cut text is all the model ever gets of it, so every later call sends
    the same bytes (the provider's prompt cache keeps serving them). A result
    within ``max_chars`` is untouched. The cut text is at most ``max_chars``;
    ``preview_chars`` keeps fewer characters of the result than fit (e.g.
    ``ToolOutputLimit(20_000, preview_chars=2_000)``: a result is left whole
    up to 20,000 characters, and one longer shows 2,000); ``None`` keeps as
    many as fit beside the marker.

    ``spill=True`` keeps the full result with the session (every store
    keeps it, so it survives a restart), and while a cut result is in what
    the model sees, the agent offers it ``read_tool_result(call_id,
    offset=0, limit=..., pattern=None)``: a slice of at most about
    ``max_chars`` characters, or the lines that match an RE2 regular
    expression (linear time, and a search stops after a few seconds). A
    session that cannot keep spilled results (a session class of your own
    without ``spill_tool_result``) gets the cut text, whose marker says the
    full result was not kept. ``spill=False`` never keeps it.

    >>> ToolOutputLimit(8000).keep
    'head_tail'
    >>> ToolOutputLimit(50)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: ToolOutputLimit(max_chars=50): max_chars must be at least ...
    """

    #: A result longer than this (characters) is cut; the cut text is at most this long.
    max_chars: int = attrs.field(validator=_max_chars)
    #: ``"head_tail"``: keep the start and the end; ``"head"``: the start.
    keep: Literal["head_tail", "head"] = attrs.field(
        default="head_tail", kw_only=True, validator=attrs.validators.in_(("head_tail", "head"))
    )
    #: Keep the full result with the session, and offer ``read_tool_result``.
    spill: bool = attrs.field(
        default=True, kw_only=True, validator=attrs.validators.instance_of(bool)
    )
    #: How many characters of a cut result to show (``None``: as many as fit).
    preview_chars: int | None = attrs.field(default=None, kw_only=True, validator=_preview_chars)

    @property
    def answers(self) -> tuple[Tool, ...]:
        """The tools this middleware answers itself (the agent knows them by name)."""
        return (READ_TOOL,) if self.spill else ()

    def offered_tools(self, messages: Sequence[ChatMessage]) -> tuple[Tool, ...]:
        """The tools to offer the model with ``messages``: ``read_tool_result`` while a tool
        result in them points at a spilled result, else none."""
        if self.spill:
            for message in reversed(messages):  # a cut result is most often a recent one
                if message.role == "tool" and mentions_spill(message.content):
                    return (READ_TOOL,)
        return ()

    async def __call__(
        self, request: ToolRequest, call_next: Callable[[ToolRequest], Awaitable[ChatMessage]]
    ) -> ChatMessage:
        """Answer ``read_tool_result``; cut any other call's result longer than ``max_chars``."""
        if not isinstance(request, ToolRequest):
            raise TypeError(
                "ToolOutputLimit belongs in Agent(tool_stack=[...]), got a "
                f"{type(request).__name__}"
            )
        if request.tool is READ_TOOL and self.spill:
            return await read_result(request, self.max_chars)
        message = await call_next(request)
        text = message.content
        if text is None or len(text) <= self.max_chars:
            return message
        call_id = message.tool_call_id or request.call.id
        key = await _spill(request.invocation.session, call_id, text) if self.spill else None
        return attrs.evolve(message, content=self.cut(text, key))

    def cut(self, text: str, call_id: str | None) -> str:
        """``text`` cut to at most ``max_chars``, its marker naming ``call_id`` (``None``: the
        full text was not kept). The same text and id give the same bytes, always."""
        total = len(text)
        room = self.preview_chars
        if room is None:  # as many as fit beside this marker (its figures change its length)
            room = self.max_chars - len(cut_marker(call_id, total, total, total)) - 2
            room -= len(f"{total:,}")  # the count left out, at most as long as the total
        room = max(0, min(room, total))
        head = room if self.keep == "head" else (room + 1) // 2
        start = _line_end(text, head)
        end = total - _line_start(text, total, room - head)
        marker = cut_marker(call_id, total, start, end)
        tail = f"\n{text[end:]}" if end < total else ""
        # The marker on a line of its own (the head ends with a line break when cut at one).
        before = "" if start == 0 or text[start - 1] == "\n" else "\n"
        return f"{text[:start]}{before}{marker}{tail}"


def _line_end(text: str, head: int) -> int:
    """Where a head of ``head`` characters ends: after a line break in its last quarter."""
    cut = text.rfind("\n", head - head // 4, head)
    return cut + 1 if head and cut >= 0 else head


def _line_start(text: str, total: int, tail: int) -> int:
    """How long a tail of at most ``tail`` characters is: from a line break in its first quarter."""
    if tail <= 0:
        return 0
    cut = text.find("\n", total - tail, total - tail + tail // 4)
    return total - cut - 1 if cut >= 0 else tail


async def _spill(session: Session, call_id: str, text: str) -> str | None:
    """Keep ``text`` with the session; the key it is kept under, which its marker names, or
    ``None`` when it is not kept (a failure is logged, and the model gets the cut text, which
    says so)."""
    if not keeps_spills(session):
        _log.warning("tool_output.not_kept", session=type(session).__name__, call_id=call_id)
        return None
    try:
        # An id too long for the marker's room is named by a short key of its own.
        key = spill_key(call_id)
        for again in itertools.count(2):
            kept = await session.spilled_tool_result(key)
            if kept is None or kept == text:
                break
            # The id of an earlier result (servers that number each answer's calls from
            # zero): a key of its own, so the earlier marker still reads its own result.
            key = spill_key(f"{call_id}#{again}")
        await session.spill_tool_result(key, text)
    except Exception as exc:
        _log.warning("tool_output.spill_failed", call_id=call_id, error=str(exc))
        return None
    return key
