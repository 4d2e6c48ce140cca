"""Where a streamed answer held back by an output guardrail may be cut into windows.

An :class:`raf.OutputGuardrail` holds the text of a streamed answer until a
check passed on it. It judges it window by window: a window ends at a
sentence end (a full-width ``。`` too), or, once ``hold_back`` characters wait, at the last space
that is not between two code-like words (words with a digit, or short
upper-case groups: so a phone, card or account number written in groups is
not cut in two), else at ``hold_back`` itself: no more than that ever waits.
"""

from __future__ import annotations

import re

__all__: list[str] = []

#: A sentence ends with ., ! or ? (and closing quotes or brackets) before a space, with
#: a full-width stop, exclamation or question mark (Chinese and Japanese put no space
#: after it; then its closing quotes or bracket), or at a line break; the window ends
#: after it.
_SENTENCE_END = re.compile(
    r"""[.!?]["')\]]*\s|[\u3002\uff01\uff1f][\u300d\u300f\uff09\u201d\u2019]*|\n"""
)
_WORD = re.compile(r"\S+")


def cut_point(held: str, hold_back: int) -> int | None:
    """Where to cut ``held`` (text not yet judged) into a window, or ``None`` to wait.

    The window is ``held[:cut]``, at most ``hold_back`` characters: up to
    the first sentence end within them; else, when ``held`` has reached
    ``hold_back``, up to the last space not between two code-like words;
    else ``hold_back`` characters.

    >>> cut_point("Hello there. How", 200)
    13
    >>> cut_point("no end yet", 200) is None
    True
    >>> cut_point("call 555 123 4567 now", 12)
    5
    >>> cut_point("One. Two. Thr", 200)
    5
    >>> cut_point("x" * 30, 10)
    10
    >>> cut_point("你好。再见", 200)
    3
    """
    region = held[:hold_back]
    # The first sentence end: each sentence is judged on its own, so a blocked one
    # takes no sentence before it down with it.
    end = _SENTENCE_END.search(region)
    if end is not None:
        return end.end()
    if len(held) < hold_back:
        return None
    return _last_safe_space(region) or hold_back


def forced(held: str, hold_back: int) -> bool:
    """Whether :func:`cut_point` cuts ``held`` at ``hold_back`` for want of a sentence end or
    a space it may cut at (a span across that cut is in neither window whole).

    >>> forced("x" * 30, 10), forced("call 555 123 4567 now", 12), forced("ab", 10)
    (True, False, False)
    """
    region = held[:hold_back]
    return (
        len(held) >= hold_back
        and _SENTENCE_END.search(region) is None
        and _last_safe_space(region) is None
    )


def _last_safe_space(region: str) -> int | None:
    """The start of the last word of ``region`` that follows a word, not both code-like."""
    words = list(_WORD.finditer(region))
    for index in range(len(words) - 1, 0, -1):
        if not (_code_like(words[index - 1].group()) and _code_like(words[index].group())):
            return words[index].start()
    return None


def _code_like(word: str) -> bool:
    """A word that may be one group of a number or code written in groups (``4111``,
    ``(555)``, ``WEST`` of an IBAN)."""
    return any(c.isdigit() for c in word) or (len(word) <= 4 and word.isupper())
