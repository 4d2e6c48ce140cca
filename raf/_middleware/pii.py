"""pii_redactor: a guardrail check that rewrites personal data and secrets into placeholders.

What it finds: e-mail addresses; phone numbers written as phone numbers
(international ``+…``, ``(555) 123-4567``, ``555-123-4567``, ``020 7946 0958``);
card numbers (13 to 19 digits with a card's first digits that pass the Luhn
check, so an order number almost never does); IBANs in any case (their mod-97
checksum); API keys (the prefixes of the common vendors, followed by a random-looking tail).

Card and phone numbers are found as a person or a word processor writes them too: grouped
with no-break or thin spaces, any kind of dash, fullwidth digits, zero-width characters
between the digits. The text is folded to plain digits, spaces and hyphens once (linear
time, same patterns), and what is found there is replaced in the text as it was written.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Final

from raf._values.verdict import Check, GuardrailContext, Verdict

__all__ = ["pii_redactor"]

#: What :func:`pii_redactor` can redact, in the order it looks.
ENTITIES: Final = ("api_key", "email", "iban", "card", "phone")

_API_KEY = re.compile(
    r"""(?<![\w-])(?:
        sk-(?:proj-|live-|test-|ant-(?:api\d\d-)?|svcacct-)?[A-Za-z0-9_-]{20,}
      | (?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{16,}
      | gh[pousr]_[A-Za-z0-9]{30,}
      | github_pat_[A-Za-z0-9_]{30,}
      | xox[abposr]-[A-Za-z0-9-]{10,}
      | AKIA[0-9A-Z]{16}
      | AIza[0-9A-Za-z_-]{35}
      | glpat-[A-Za-z0-9_-]{20,}
      | hf_[A-Za-z0-9]{30,}
    )(?![\w-])""",
    re.VERBOSE,
)
_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"
)
# Any case: people type an IBAN in lower case too (the checksum keeps words out).
_IBAN = re.compile(
    r"\b[A-Z]{2}\d{2}(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,3})?\b", re.IGNORECASE
)
_CARD = re.compile(r"(?<![\w-])[2-6](?:[ -]?\d){12,18}(?![\w-])")
_PHONE = re.compile(
    # Not a piece of a longer run of digit groups (an account number, an invalid IBAN).
    r"""(?<![\w+])(?<!\d[ .-])(?:
        \+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}
      | \(\d{2,4}\)[ .-]?\d{3,4}[ .-]?\d{3,4}
      | \d{3}([.-])\d{3}\1\d{4}
      | \d{3}[ ]\d{3}[ ]\d{4}
      | 0\d{2,4}[ -]\d{3,4}[ -]?\d{3,4}
    )(?![\w-])(?![ .-]\d)""",
    re.VERBOSE,
)


# One character for one: how the same number is written with other characters.
_FOLD_ONE: Final = {
    **dict.fromkeys(map(ord, "\u00a0\u2007\u2009\u202f"), " "),  # no-break, figure, thin
    **dict.fromkeys(range(0x2010, 0x2016), "-"),  # hyphens and dashes, - to ―
    **dict.fromkeys(map(ord, "\u2212\ufe63\uff0d"), "-"),  # minus, small and fullwidth
    **{0xFF10 + n: str(n) for n in range(10)},  # fullwidth digits
    0xFF0B: "+",
    0xFF08: "(",
    0xFF09: ")",
}
# Characters that show nothing: dropped from the folded text (zero-width spaces and
# joiners, the soft hyphen, the invisible operators, the Mongolian vowel separator).
_ZERO_WIDTH: Final = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad\u2061\u2062\u2063\u2064\u180e")
_UNUSUAL: Final = re.compile(
    "[" + "".join(map(chr, _FOLD_ONE)) + "".join(sorted(_ZERO_WIDTH)) + "]"
)


def _fold(text: str) -> tuple[str, list[int]]:
    """``text`` in plain digits, spaces and hyphens, and where each of its characters was."""
    same_length = text.translate(_FOLD_ONE)
    origin = [i for i, c in enumerate(same_length) if c not in _ZERO_WIDTH]
    return "".join(same_length[i] for i in origin), origin


def _sub_folded(
    pattern: re.Pattern[str], replace: Callable[[re.Match[str]], str], text: str
) -> str:
    """``pattern.sub(replace, text)``, matched on the folded text.

    ``replace`` gives a placeholder or the match unchanged; a placeholder takes the place
    of what the match covers in ``text`` (the zero-width characters inside it too).
    """
    if not _UNUSUAL.search(text):
        return pattern.sub(replace, text)
    folded, origin = _fold(text)
    pieces: list[str] = []
    last = 0
    for match in pattern.finditer(folded):
        placeholder = replace(match)
        if placeholder == match.group():
            continue
        start, end = origin[match.start()], origin[match.end() - 1] + 1
        pieces += (text[last:start], placeholder)
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _luhn(digits: str) -> bool:
    total = 0
    for position, digit in enumerate(reversed(digits)):
        value = int(digit) * (2 if position % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def _iban_ok(compact: str) -> bool:
    if not 15 <= len(compact) <= 34:
        return False
    moved = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _entropy(text: str) -> float:
    """Shannon entropy in bits per character."""
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _api_key(match: re.Match[str]) -> str:
    # A prefix followed by words (sk-learn-is-a-library) is no key: a key's tail is random,
    # so it has digits among its letters and many different characters.
    token = match.group()
    random = any(c.isdigit() for c in token) and _entropy(token) >= 3.5
    return "[api_key]" if random else token


def _email(match: re.Match[str]) -> str:
    return "[email]"


def _iban(match: re.Match[str]) -> str:
    # The pattern may run on into a following upper-case word: try it without its tail groups.
    groups = match.group().split(" ")
    for end in range(len(groups), 0, -1):
        if _iban_ok("".join(groups[:end])):
            return "[iban]" + match.group()[len(" ".join(groups[:end])) :]
    return match.group()


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"[ -]", "", match.group())
    # The cards that begin with 2 are Mastercard's 2221-2720: a run of years (2023 2024
    # 2025 2026) is none, though one in ten passes the Luhn check.
    if digits[0] == "2" and not 2221 <= int(digits[:4]) <= 2720:
        return match.group()
    return "[card]" if 13 <= len(digits) <= 19 and _luhn(digits) else match.group()


def _phone(match: re.Match[str]) -> str:
    digits = sum(c.isdigit() for c in match.group())
    return "[phone]" if 7 <= digits <= 15 else match.group()


_RULES: Final[dict[str, tuple[re.Pattern[str], Callable[[re.Match[str]], str]]]] = {
    "api_key": (_API_KEY, _api_key),
    "email": (_EMAIL, _email),
    "iban": (_IBAN, _iban),
    "card": (_CARD, _card),
    "phone": (_PHONE, _phone),
}

# The numbers a word processor or a phone's keyboard writes with other characters.
_FOLDED: Final = frozenset({"card", "phone"})


def redact(text: str, entities: Iterable[str] = ENTITIES) -> str:
    """``text`` with each entity found replaced by its placeholder (``[email]``, ...).

    >>> redact("Write to ann@example.org or call +44 20 7946 0958.")
    'Write to [email] or call [phone].'
    >>> redact("Card 4111 1111 1111 1111, order 4111111111111112.")
    'Card [card], order 4111111111111112.'
    """
    for entity in entities:
        pattern, replace = _RULES[entity]
        if entity in _FOLDED:
            text = _sub_folded(pattern, replace, text)
        else:
            text = pattern.sub(replace, text)
    return text


def pii_redactor(*, entities: Iterable[str] = ENTITIES) -> Check:
    """A check that rewrites personal data and secrets into placeholders.

    ``entities`` picks what it looks for, among ``"api_key"``, ``"email"``,
    ``"iban"``, ``"card"`` and ``"phone"`` (all by default). Put it in an
    :class:`raf.InputGuardrail`, :class:`raf.OutputGuardrail` or
    :class:`raf.ToolGuardrail`; a text without any passes as it is.

    >>> import anyio
    >>> check = pii_redactor(entities=["email"])
    >>> anyio.run(check, "to ann@example.org", None)
    Verdict(action='rewrite', reason=None, text='to [email]')
    """
    if isinstance(entities, str):
        raise TypeError(f"pii_redactor: entities must be a list of names, got {entities!r}")
    chosen = tuple(entities)
    if not chosen:  # a guardrail that lets everything through, looking like one that guards
        raise ValueError(
            f"pii_redactor: no entities: it would redact nothing; known: {', '.join(ENTITIES)}"
        )
    unknown = [entity for entity in chosen if entity not in _RULES]
    if unknown:
        raise ValueError(f"pii_redactor: unknown entities {unknown}; known: {', '.join(ENTITIES)}")
    ordered = tuple(entity for entity in ENTITIES if entity in chosen)

    async def pii_redactor(text: str, context: GuardrailContext) -> Verdict:
        redacted = redact(text, ordered)
        return Verdict.allow() if redacted == text else Verdict.rewrite(redacted)

    return pii_redactor
