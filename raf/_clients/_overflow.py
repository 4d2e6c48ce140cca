"""Each server's "the prompt is too long" answer, read as raf.ContextOverflowError with
the sizes the server said: OpenAI's ``context_length_exceeded``, Anthropic's
``prompt is too long``, Gemini's ``INVALID_ARGUMENT`` on the input token count."""

from __future__ import annotations

import re
from typing import Any, Final

from raf.errors import ContextOverflowError

__all__: list[str] = []

#: The words of each server's refusal, and where its message says the two sizes: the
#: prompt's (``input``) and the window's (``max``).
#: OpenAI: "This model's maximum context length is 128000 tokens. However, your messages
#: resulted in 130000 tokens" (or "you requested 130005 tokens (125005 in the messages,
#: ...)"); Responses: "Your input exceeds the context window of this model" (no sizes).
_OPENAI_MAX: Final = re.compile(r"maximum context length is (?P<max>\d+)")
_OPENAI_INPUT: Final = (
    re.compile(r"\((?P<input>\d+) in the messages"),
    re.compile(r"resulted in (?P<input>\d+) tokens"),
    re.compile(r"requested (?P<input>\d+) tokens"),
)
#: Anthropic: "prompt is too long: 208310 tokens > 200000 maximum", or, for a prompt that
#: leaves no room for max_tokens, "input length and `max_tokens` exceed context limit:
#: 199759 + 8192 > 200000".
_ANTHROPIC: Final = re.compile(r"prompt is too long(?:: (?P<input>\d+) tokens > (?P<max>\d+))?")
_ANTHROPIC_ROOM: Final = re.compile(
    r"exceed context limit(?:: (?P<input>\d+) \+ \d+ > (?P<max>\d+))?"
)
#: Gemini: "The input token count (1200293) exceeds the maximum number of tokens allowed
#: (1048576)." (the file-upload variant drops the first clause).
_GEMINI: Final = re.compile(
    r"(?:input token count \((?P<input>\d+)\) exceeds )?the maximum number of tokens allowed"
    r"(?: \((?P<max>\d+)\))?",
    re.IGNORECASE,
)


def _size(match: re.Match[str] | None, *groups: str) -> int | None:
    if match is None:
        return None
    for group in groups:
        value = match.group(group) if group in match.re.groupindex else None
        if value is not None:
            return int(value)
    return None


def overflow(error: Any, text: str, status: int | None) -> ContextOverflowError | None:
    """The :class:`raf.ContextOverflowError` of an error object a server sent (OpenAI's or
    Anthropic's ``{"type"|"code", "message"}``, Gemini's ``{"status", "message"}``), with
    ``text`` the message raf would have raised; ``None`` when it is no "too long" answer."""
    if isinstance(error, dict) and isinstance(error.get("error"), dict):
        error = error["error"]  # a whole body (the Anthropic SDK keeps it so)
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    message = message if isinstance(message, str) else ""
    found: tuple[int | None, int | None] | None = None
    if error.get("code") == "context_length_exceeded" or "maximum context length" in message:
        # The prompt's own size first: "requested" counts the completion's tokens too.
        said = (pattern.search(message) for pattern in _OPENAI_INPUT)
        found = (
            next((_size(match, "input") for match in said if match), None),
            _size(_OPENAI_MAX.search(message), "max"),
        )
    elif "prompt is too long" in message or "exceed context limit" in message:
        match = _ANTHROPIC.search(message) or _ANTHROPIC_ROOM.search(message)
        found = (_size(match, "input"), _size(match, "max"))
    elif error.get("status") == "INVALID_ARGUMENT" and (match := _GEMINI.search(message)):
        found = (_size(match, "input"), _size(match, "max"))
    if found is None:
        return None
    input_tokens, max_tokens = found
    sizes = (
        f" ({input_tokens} tokens, the window holds {max_tokens})"
        if input_tokens is not None and max_tokens is not None
        else ""
    )
    return ContextOverflowError(
        f"{text} - the prompt is longer than the model's context window{sizes}: send less "
        "(a shorter history, or raf.CompactionMiddleware)",
        input_tokens=input_tokens,
        max_tokens=max_tokens,
        status_code=status,
    )
