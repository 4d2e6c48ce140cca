"""Each message's JSON cached by identity: what ``raf._sessions.base``'s request hash
still imports. The OpenAI clients no longer use it (they send plain dicts); it goes once
the request hash is plain (issue 30, item 3).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Sequence
from typing import Final

from raf._errors import BadRequestError
from raf._values.messages import ChatMessage

__all__: list[str] = []

#: How much message JSON a :class:`WireCache` keeps before it forgets the oldest.
WIRE_CACHE_BYTES: Final = 32 * 1024 * 1024


class WireCache:
    """Each message's wire JSON, by identity, written by ``encode(message, index)``.

    Messages are frozen, so an entry never goes stale. The cache holds the
    message itself next to its JSON, so its id cannot be reused while the
    entry exists; it forgets the oldest entries past ``max_bytes`` of JSON.
    (Strong references, not weak ones: a warm lookup is then one C loop, half
    the cost.) ``encode`` must depend on the message alone.
    """

    __slots__ = ("encode", "held", "json", "max_bytes", "size")

    def __init__(
        self, encode: Callable[[ChatMessage, int], bytes], max_bytes: int = WIRE_CACHE_BYTES
    ) -> None:
        self.encode = encode
        self.max_bytes = max_bytes
        self.json: dict[int, bytes] = {}
        self.held: collections.deque[tuple[int, ChatMessage, int]] = collections.deque()
        self.size = 0

    def one(self, message: ChatMessage, index: int = 0) -> bytes:
        """The JSON of ``message`` (``messages[index]`` of a call, for errors)."""
        key = id(message)
        data = self.json.get(key)
        if data is not None:
            return data
        if type(message) is not ChatMessage:
            raise BadRequestError(
                f"messages[{index}] must be a ChatMessage, got {type(message).__name__}"
            )
        data = self.encode(message, index)
        # Held before it is visible, dropped after it is not: a cached id is always live.
        self.held.append((key, message, len(data)))
        self.json[key] = data
        self.size += len(data)
        while self.size > self.max_bytes and self.held:
            old_key, _held, size = self.held.popleft()
            self.json.pop(old_key, None)
            self.size -= size
        return data

    def many(self, messages: Sequence[ChatMessage], start: int = 0) -> list[bytes]:
        """:meth:`one` of each message, in order (a new list); an error names
        ``messages[start + i]``.

        The lookup is one C loop (``map``) and the misses are found by C scans
        (``list.index``): over a history whose messages are cached only the new
        messages cost Python work, several times less than a Python loop over all.
        """
        found: list[bytes | None] = list(map(self.json.get, map(id, messages)))
        index = -1
        with contextlib.suppress(ValueError):  # no miss left
            while True:
                index = found.index(None, index + 1)
                found[index] = self.one(messages[index], start + index)
        return found  # type: ignore[return-value]
