"""Token counts of a prompt with an OpenAI model's own encoding, read from files on disk.

tiktoken downloads its encoding files on first use, which an offline machine
or a CI runner cannot do. The ``bpe-openai`` package (extra
``raf-agents[tokens]``) ships ``o200k_base`` and ``cl100k_base`` inside its
wheel and encodes as tiktoken does (the Rust ``bpe-openai`` crate of GitHub's
``rust-gems``), so counting never touches the network. Without it, or for a
model whose encoding is unknown, the count is :func:`raf.compression.approximate_tokens`'s.

The framing follows OpenAI's own recipe for chat messages (3 tokens a message,
1 more for a name, 3 to prime the reply); a tool's declaration is counted as
the tokens of its JSON, which is close to, not exactly, what the API bills.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from typing import Final

from raf._values.messages import ChatMessage
from raf._values.protocols import Tool
from raf._values.tokens import approximate_prompt_tokens

__all__: list[str] = []

#: Model name prefixes and their encodings; the first that matches wins (``gpt-4o``
#: before ``gpt-4``). A provider prefix (``openai/gpt-4o``) is dropped first.
_ENCODINGS: Final = (
    ("o200k_base", ("gpt-4o", "chatgpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "gpt-oss")),
    ("o200k_base", ("o1", "o3", "o4")),
    ("cl100k_base", ("gpt-4", "gpt-3.5", "gpt-35", "text-embedding-3", "text-embedding-ada-002")),
)
_PER_MESSAGE: Final = 3
_PER_NAME: Final = 1
_REPLY_PRIMING: Final = 3
_PER_TOOL: Final = 8

Encode = Callable[[str], int]


def encoding_name(model: str) -> str | None:
    """The encoding of an OpenAI model (``"o200k_base"``, ``"cl100k_base"``), ``None`` when
    raf does not know it.

    >>> encoding_name("gpt-4o-mini"), encoding_name("gpt-4-0613"), encoding_name("llama3")
    ('o200k_base', 'cl100k_base', None)
    """
    name = model.rsplit("/", 1)[-1].lower()
    for encoding, prefixes in _ENCODINGS:
        for prefix in prefixes:
            if name == prefix or name.startswith((prefix + "-", prefix + ".")):
                return encoding
            if prefix[0] == "o" and prefix[1:].isdigit() and name.startswith(prefix):
                return encoding  # o1, o3-mini, o4-mini-high
    return None


@cache
def text_counter(encoding: str) -> Encode | None:
    """The token count of a text in ``encoding``, or ``None`` when ``bpe-openai`` is not
    installed. Texts a conversation sends again and again are counted once."""
    with warnings.catch_warnings():
        # bpe-openai 0.1 opens its files with importlib.resources' deprecated open_binary.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import bpe_openai  # optional (extra raf-agents[tokens]): loaded on first count
        except ImportError:
            return None
        encoder = bpe_openai.get_encoding(encoding)
        encoder.encode_ordinary("")

    @lru_cache(maxsize=8192)
    def count(text: str) -> int:
        return len(encoder.encode_ordinary(text))

    return count


def counted_with(model: str) -> str:
    """What :func:`count_prompt` counts ``model``'s prompts with: an encoding, or
    ``"approximate"``."""
    encoding = encoding_name(model)
    if encoding is None or text_counter(encoding) is None:
        return "approximate"
    return encoding


def count_prompt(model: str, messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> int:
    """The tokens of a prompt (its messages and tool declarations) for ``model``."""
    encoding = encoding_name(model)
    count = None if encoding is None else text_counter(encoding)
    if count is None:
        return approximate_prompt_tokens(messages, tools)
    total = _REPLY_PRIMING if messages else 0
    for message in messages:
        total += _PER_MESSAGE + count(message.role) + count(message.content or "")
        if message.name:
            total += _PER_NAME + count(message.name)
        for call in message.tool_calls:
            total += _PER_MESSAGE + count(call.name) + count(call.arguments)
    for tool in tools:
        declaration = {"name": tool.name, "description": tool.description}
        declaration["parameters"] = tool.parameters  # type: ignore[assignment]
        total += _PER_TOOL + count(json.dumps(declaration, sort_keys=True, default=str))
    return total
