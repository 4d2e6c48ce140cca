"""pii_redactor: what it rewrites, what it leaves alone, streamed or not."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from raf import (
    Agent,
    GuardrailContext,
    InputGuardrail,
    OutputGuardrail,
    ScriptedChatClient,
    Update,
    Verdict,
    pii_redactor,
)

pytestmark = pytest.mark.anyio

CONTEXT = GuardrailContext("pii", "output")


async def redacted(text: str, **options: object) -> str:
    verdict = await pii_redactor(**options)(text, CONTEXT)  # type: ignore[arg-type]
    return text if verdict.action == "allow" else verdict.text or ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to ann.lee+news@mail.example.co.uk", "write to [email]"),
        ("call +44 20 7946 0958 today", "call [phone] today"),
        ("call (415) 555-0100 or 415-555-0100", "call [phone] or [phone]"),
        ("call 415 555 0100 or 020 7946 0958", "call [phone] or [phone]"),
        ("visa 4111 1111 1111 1111 ok", "visa [card] ok"),
        ("mc 5555-5555-5555-4444, amex 378282246310005", "mc [card], amex [card]"),
        ("IBAN DE89 3704 0044 0532 0130 00 OK", "IBAN [iban] OK"),
        ("pay GB82WEST12345698765432 now", "pay [iban] now"),
        ("key sk-proj-Ab3dEf9hIj2kLm8nOp4qRs", "key [api_key]"),
        ("token ghp_aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z", "token [api_key]"),
        ("aws AKIAIOSFODNN7EXAMPLE", "aws [api_key]"),
        ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "stripe [api_key]"),
        # As people type them: lower case, with or without spaces.
        ("iban de89 3704 0044 0532 0130 00 ok", "iban [iban] ok"),
        ("pay gb82west12345698765432 now", "pay [iban] now"),
        ("mc 2223 0031 2200 3222", "mc [card]"),  # a Mastercard of the 2-series
    ],
)
async def test_what_it_rewrites(text: str, expected: str) -> None:
    assert await redacted(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "order 4111111111111112 shipped",  # a card's shape, but the Luhn check fails
        "order #12345678901234 is on its way",  # passes no card rule (its first digit)
        "tracking 1234567890123",  # 13 digits, first digit 1: no card
        "IBAN DE89 3704 0044 0532 0130 02",  # one digit off: the checksum fails
        "on 2024-01-15 at 10:30, version 1.2.3, host 192.168.1.10, pi 3.14159",
        "100,000 users in 1990 and 2001, room 555, zip 94103",
        "use sk-learn-is-a-great-library for that",  # a prefix, but words, not a key
        "the meeting is at noon; bring the report",
        # Runs of years pass the Luhn check one time in ten; no card begins with 20.
        "in 2010 2011 2012 2013 and 2023 2024 2025 2026 sales grew",
        "uuid 123e4567-e89b-12d3-a456-426614174000, sha d41d8cd98f00b204e9800998ecf8427e",
    ],
)
async def test_what_it_leaves_alone(text: str) -> None:
    assert await redacted(text) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Grouped with no-break spaces (a word processor's), narrow no-break spaces (French).
        ("visa 4111\u00a01111\u00a01111\u00a01111 ok", "visa [card] ok"),
        ("visa 4111\u202f1111\u202f1111\u202f1111 ok", "visa [card] ok"),
        ("call +44\u00a020\u00a07946\u00a00958 today", "call [phone] today"),
        ("call 415\u202f555\u202f0100 today", "call [phone] today"),
        # Every kind of dash: hyphen, non-breaking hyphen, figure, en, em dash, bar, minus.
        *(
            (f"mc 5555{d}5555{d}5555{d}4444 ok", "mc [card] ok")
            for d in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"
        ),
        *(
            (f"call 415{d}555{d}0100 today", "call [phone] today")
            for d in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"
        ),
        # Fullwidth digits (a Japanese or Chinese keyboard).
        ("card \uff14\uff11\uff11\uff11" + "\uff11" * 12 + " ok", "card [card] ok"),
        ("tel \uff10\uff12\uff10 \uff17\uff19\uff14\uff16 \uff10\uff19\uff15\uff18", "tel [phone]"),
        # Zero-width characters between the digits, where no one sees them.
        *(
            (f"visa 4111{z}1111{z}1111{z}1111 ok", "visa [card] ok")
            for z in "\u200b\u200c\u200d\u2060\ufeff"
        ),
        ("visa 4\u200b1\u200b1\u200b1 1111 1111 1111", "visa [card]"),
        # The soft hyphen (a word processor's invisible break point), the invisible
        # operators and the Mongolian vowel separator show nothing either.
        *(
            (f"visa 4111{z}1111{z}1111{z}1111 ok", "visa [card] ok")
            for z in "\u00ad\u2061\u2062\u2063\u2064\u180e"
        ),
        ("call 415-\u00ad555-0100 today", "call [phone] today"),
        ("call 415\u200b-555-\u20600100 today", "call [phone] today"),
        # All of them at once, and the text around a number kept as it was written.
        ("a\u00a0b 4111\u2013\u200b1111\u00a01111\uff0d1111 c\u2014d", "a\u00a0b [card] c\u2014d"),
    ],
)
async def test_numbers_written_with_other_characters(text: str, expected: str) -> None:
    assert await redacted(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "order 4111\u00a01111\u00a01111\u00a01112 shipped",  # the Luhn check still fails
        "pages 10\u201312 and 2024\u20132025",  # ranges, not numbers
        "zero\u200bwidth\u00a0text \uff11\uff12\uff13",
    ],
)
async def test_other_characters_alone_are_no_number(text: str) -> None:
    assert await redacted(text) == text


def test_folding_is_linear_on_a_long_run_of_separators() -> None:
    # No backtracking blow-up: a megabyte of digits and odd separators is one pass.
    text = ("1\u200b\u00a0\u2013" * 250_000) + "x"
    from raf._middleware.pii import redact

    assert redact(text, ["card", "phone"]).endswith("x")


def test_luhn_separates_cards_from_order_numbers() -> None:
    from raf._middleware.pii import _luhn

    assert _luhn("4111111111111111")
    assert _luhn("79927398713")
    assert not _luhn("4111111111111112")
    assert not _luhn("79927398710")


async def test_entities_pick_what_it_looks_for() -> None:
    text = "ann@example.org, +44 20 7946 0958"
    assert await redacted(text, entities=["email"]) == "[email], +44 20 7946 0958"
    with pytest.raises(ValueError, match="unknown entities \\['ssn'\\]"):
        pii_redactor(entities=["ssn"])
    with pytest.raises(TypeError, match="a list of names"):
        pii_redactor(entities="email")
    with pytest.raises(ValueError, match="no entities: it would redact nothing"):
        pii_redactor(entities=[])


prose = st.lists(
    st.sampled_from(["the", "report", "is", "ready", "Thanks", "we", "met", "at", "noon"]),
    min_size=1,
    max_size=40,
).map(" ".join)


@given(prose)
async def test_ordinary_text_is_untouched(text: str) -> None:
    assert await pii_redactor()(text, CONTEXT) == Verdict.allow()


FRAGMENTS = [
    "hello",
    "the report",
    "Thanks.",
    "order 4111111111111112",
    "mail ann@example.org",
    "call +1 415 555 0100",
    "card 4111 1111 1111 1111",
    "IBAN DE89 3704 0044 0532 0130 00",
    "key sk-proj-Ab3dEf9hIj2kLm8nOp4qRs",
    "sk-learn-is-a-library",
]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=12),
    st.lists(st.sampled_from([" ", ". ", ", ", "\n"]), min_size=12, max_size=12),
    st.lists(st.integers(0, 600), max_size=30),
    st.integers(60, 200),
)
async def test_streamed_or_not_the_answer_is_redacted_alike(
    fragments: list[str], separators: list[str], cuts: list[int], hold_back: int
) -> None:
    text = "".join(f + s for f, s in zip(fragments, separators, strict=False)).strip()
    # The window never ends inside a run of number-like words (digits, or short upper-case
    # groups like an IBAN's) unless the run is longer than the window: that is the law's bound.
    assume(longest_number_run(text) < hold_back)
    points = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    chunks = [text[a:b] for a, b in itertools.pairwise(points)]
    guard = OutputGuardrail(pii_redactor(), hold_back=hold_back)
    whole = await Agent(ScriptedChatClient([text]), chat_stack=[guard]).run("x")
    received: list[str] = []

    async def on_update(update: Update) -> None:
        received.append(update.text)

    agent = Agent(ScriptedChatClient([chunks]), chat_stack=[guard])
    streamed = await agent.run("x", on_update=on_update)
    assert "".join(received) == streamed.text == whole.text
    for secret in ("ann@", "0100", "1111 1111", "3704", "Ab3dEf"):
        assert secret not in whole.text


def longest_number_run(text: str) -> int:
    """The length of the longest run of words that each have a digit or are short capitals."""
    longest = 0
    start: int | None = None
    for match in re.finditer(r"\S+", text):
        word = match.group()
        if any(c.isdigit() for c in word) or (len(word) <= 4 and word.isupper()):
            start = match.start() if start is None else start
            longest = max(longest, match.end() - start)
        else:
            start = None
    return longest


async def test_the_request_is_redacted_before_the_model_sees_it() -> None:
    client = ScriptedChatClient(["ok"])
    agent = Agent(client, stack=[InputGuardrail(pii_redactor())])
    await agent.run("I am ann@example.org, IBAN GB82 WEST 1234 5698 7654 32")
    assert client.requests[0].messages[-1].content == "I am [email], IBAN [iban]"
