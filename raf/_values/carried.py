"""What an assistant turn carries for its own wire, to be sent back unchanged: the model's
reasoning (Reasoning) and the server's compaction of the conversation (Compaction)."""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any

import attrs

from raf._values.text import check_optional_str, check_str, clean_text

__all__ = ["Compaction", "Reasoning"]


@attrs.frozen(slots=True)
class Reasoning:
    """A model's reasoning that came with an assistant turn, kept to be sent back unchanged.

    Thinking models (Anthropic thinking blocks with their signatures, OpenAI Responses
    reasoning items, Gemini thought signatures) need their reasoning back in the later
    calls of a tool loop. The client that read the turn puts it here, on the assistant
    message, so it lives wherever the message lives (history, session store, another
    process). ``source`` names its wire (``"anthropic"``, ``"openai.responses"``,
    ``"gemini"``); a client replays its own source's only. ``data`` is that wire's own
    JSON text, opaque to raf (a repr shows its start only).

    >>> Reasoning("anthropic", '[{"type": "thinking", "signature": "s"}]')
    Reasoning(source='anthropic', data='[{"type": "t...ature": "s"}]')
    """

    source: str = attrs.field(validator=check_str)
    data: str = attrs.field(converter=clean_text, validator=check_str, repr=reprlib.repr)

    def to_dict(self) -> dict[str, str]:
        """A plain-JSON form."""
        return {"source": self.source, "data": self.data}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reasoning:
        """The inverse of :meth:`to_dict`."""
        return cls(data["source"], data["data"])


@attrs.frozen(slots=True)
class Compaction:
    """A server's compaction of the conversation, as its wire sent it, kept with the turn.

    A model server that compacts a long conversation itself (OpenAI Responses
    ``context_management``, Anthropic's ``compact_20260112`` edit) answers with an
    item that stands for everything before it. The client that read it puts it on
    the assistant message (``ChatMessage.compaction``), so it is stored wherever the
    message is. ``source`` names its wire (``"openai.responses"``, ``"anthropic"``);
    ``data`` is that wire's own JSON text, opaque to raf (a repr shows its start only);
    ``summary`` is a plain-text summary any model can read, when known (Anthropic's
    block carries one; an OpenAI item is encrypted).

    To its own wire, a history that holds one is sent from that message on (the
    standing system prompt first), the item unchanged; what it replaced stays in the
    session and is never sent to that wire again. Another wire never gets the item:
    it gets the summary in place of what the item replaced, or, with no summary,
    the history as stored (see :class:`raf.CompactionMiddleware` for one that fits).

    >>> Compaction("anthropic", '{"type": "compaction", "content": "..."}', summary="...")
    Compaction(source='anthropic', data='{"type": "co...tent": "..."}', summary='...')
    """

    source: str = attrs.field(validator=check_str)
    data: str = attrs.field(converter=clean_text, validator=check_str, repr=reprlib.repr)
    summary: str | None = attrs.field(
        default=None, converter=clean_text, validator=check_optional_str
    )

    def to_dict(self) -> dict[str, str]:
        """A plain-JSON form (``summary`` only when there is one)."""
        data = {"source": self.source, "data": self.data}
        if self.summary is not None:
            data["summary"] = self.summary
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Compaction:
        """The inverse of :meth:`to_dict`."""
        return cls(data["source"], data["data"], data.get("summary"))
