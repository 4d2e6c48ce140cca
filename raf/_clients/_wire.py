"""What both OpenAI clients build their request bodies with: the JSON encoder, each
message's JSON cached by identity under a bound, the message parts of a client's last few
bodies to extend, and the joining of a body's parts.

A client gives :class:`WireCache` its way of writing one message as JSON, and
:class:`RecentBodies` its way of writing a run of messages; the caching, its bounds and
the reuse of an earlier body are the same for chat completions and the Responses API.
"""

from __future__ import annotations

import collections
import contextlib
import json
import json.encoder
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from raf._errors import BadRequestError
from raf._values.messages import ChatMessage

__all__: list[str] = []

#: The ``tool_choice`` values that are words, not a tool's name.
TOOL_CHOICE_WORDS: Final = frozenset({"auto", "none", "required"})
#: Extra options that are how the request is sent, not what it says: the SDK's own.
TRANSPORT_EXTRA: Final = frozenset({"timeout", "extra_headers", "extra_query", "extra_body"})

#: How much message JSON a :class:`WireCache` keeps before it forgets the oldest.
WIRE_CACHE_BYTES: Final = 32 * 1024 * 1024
#: How many earlier bodies a client keeps to extend, and the largest it keeps.
RECENT_BODIES: Final = 4
RECENT_MAX_BYTES: Final = 8 * 1024 * 1024
#: Past this many chunks a body's chunks are joined into one (later joins stay short).
MAX_CHUNKS: Final = 64
#: The names a chunk's JSON depends on besides its messages: none.
NO_KEYS: Final[frozenset[str]] = frozenset()


def _not_json(value: object) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


# The SDK's own encoding (compact, UTF-8, no NaN), with mappings taken as objects; one
# encoder for all calls, as json.dumps builds a new one per call when given options.
_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_not_json
)
#: The JSON of one string, quotes included: the json module's own C encoder.
string: Final[Any] = json.encoder.encode_basestring


def dumps(value: Any) -> str:
    """``value`` as JSON the way the SDK writes it (compact, UTF-8, no NaN)."""
    return _ENCODER.encode(value)


def plain(value: Any) -> Any:
    """A copy of ``value`` in dicts and lists: schemas may hold read-only mappings and
    tuples, the wire wants dicts and lists."""
    return json.loads(json.dumps(value, default=_not_json))


def no_call_id(index: int) -> BadRequestError:
    """The error of a tool message with no ``tool_call_id``, at ``messages[index]``."""
    return BadRequestError(
        f"messages[{index}]: a tool message needs a tool_call_id (the id of the call it answers)"
    )


def join_body(head: bytes, key: bytes, chunks: Iterable[bytes], after: bytes) -> bytes:
    """One body: ``head`` (a JSON object) without its ``}``, then ``,"key":[`` and the
    message ``chunks`` joined with commas, then ``]`` and ``after`` (what closes it).

    One copy of a body that can be megabytes long.
    """
    pieces: list[bytes] = [head[:-1], b',"' + key + b'":[']
    for chunk in chunks:
        pieces += (chunk, b",")
    if pieces[-1] == b",":
        pieces.pop()
    pieces += (b"]", after)
    return b"".join(pieces)


def utf8(text: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (no UTF-8 form) becomes its JSON escape
    ``\\udXXX``, as the clients' whole-body encoding does: the JSON stays valid."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


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


@attrs.frozen
class Body:
    """The message part of a body sent: its messages, and their JSON in chunks; chunk
    ``i`` holds the messages from ``ends[i - 1]`` (0 for the first) up to ``ends[i]``,
    and its JSON depends on the names ``keys[i]`` besides those messages."""

    messages: tuple[ChatMessage, ...]
    chunks: tuple[bytes, ...]
    ends: tuple[int, ...]
    keys: tuple[frozenset[str], ...]


#: ``encode(messages, start)``: the JSON of a run of messages (``messages[start:]`` of a
#: call), joined with commas, and the names it depends on besides them.
RunEncoder = Callable[[tuple[ChatMessage, ...], int], tuple[bytes, frozenset[str]]]


class RecentBodies:
    """The message parts of a client's last few bodies, to extend (see :meth:`chunks`)."""

    __slots__ = ("encode", "recent")

    def __init__(self, encode: RunEncoder) -> None:
        self.encode = encode
        self.recent: collections.deque[Body] = collections.deque(maxlen=RECENT_BODIES)

    def chunks(self, messages: Sequence[ChatMessage]) -> tuple[bytes, ...]:
        """The messages' JSON, in chunks to join with commas, reusing an earlier body's.

        Each body is kept as chunks of message JSON, with the count of messages
        each chunk ends at. A new call reuses the longest run of chunks whose
        messages are a prefix of its own (a tuple comparison in C: identity
        first, then equality, so a history decoded anew each turn matches too,
        dearer but far cheaper than encoding it again) and encodes only the
        rest, as one new chunk. A leading system message is a chunk of its own,
        matched apart: instructions that change each turn (retrieved passages,
        say) do not spoil the match of the history behind them. The chunks are
        shared between bodies, never copied; what is kept is bounded in count
        and size.
        """
        current = messages if type(messages) is tuple else tuple(messages)
        count = len(current)
        lead = 1 if count and getattr(current[0], "role", None) == "system" else 0
        chunks: tuple[bytes, ...] = ()
        ends: tuple[int, ...] = ()
        keys: tuple[frozenset[str], ...] = ()
        candidates = [body for body in reversed(self.recent) if body.ends[-1] <= count]
        # Same objects first (one pointer test): they are the cheapest to compare.
        candidates.sort(key=lambda body: body.messages[-1] is not current[len(body.messages) - 1])
        for body in candidates:
            skip = lead if body.ends[0] == lead else 0
            # The longest few runs of chunks only: a long conversation has many.
            for index in range(len(body.ends) - 1, max(len(body.ends) - 4, skip) - 1, -1):
                end = body.ends[index]
                if current[skip:end] == body.messages[skip:end]:
                    chunks = body.chunks[skip : index + 1]
                    ends = body.ends[skip : index + 1]
                    keys = body.keys[skip : index + 1]
                    break
            if ends:
                if skip:
                    first, first_keys = self.encode(current[:1], 0)
                    chunks, ends, keys = (first, *chunks), (1, *ends), (first_keys, *keys)
                break
        else:
            if lead:
                first, first_keys = self.encode(current[:1], 0)
                chunks, ends, keys = (first,), (1,), (first_keys,)
        done = ends[-1] if ends else 0
        if done < count:
            rest, rest_keys = self.encode(current[done:], done)
            chunks, ends, keys = (*chunks, rest), (*ends, count), (*keys, rest_keys)
        if len(chunks) > MAX_CHUNKS:  # one copy now keeps later joins short
            chunks = (*chunks[:lead], b",".join(chunks[lead:]))
            ends = (*ends[:lead], count)
            keys = (*keys[:lead], NO_KEYS.union(*keys[lead:]))
        if chunks and sum(map(len, chunks)) <= RECENT_MAX_BYTES:
            self.recent.append(Body(current, chunks, ends, keys))
        return chunks

    def forget(self, key: str) -> None:
        """Drop the bodies whose JSON depends on ``key``: what it names changed."""
        if any(key in chunk_keys for body in self.recent for chunk_keys in body.keys):
            kept = [body for body in self.recent if not any(key in k for k in body.keys)]
            self.recent.clear()
            self.recent.extend(kept)
