"""The decoder of server-sent events the clients read streams with: each event's data,
whatever the line ends, the other fields and comments, and however the text is cut."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raf._clients._sse import EventData

# A data line's text: anything but a line end.
LINE = st.text(st.characters(exclude_characters="\r\n"), max_size=12)
END = st.sampled_from(["\n", "\r", "\r\n"])
# What may stand between events or among an event's lines: ignored by the decoder.
NOISE = st.sampled_from(
    [":", ": keep-alive", "event: delta", "id: 7", "retry: 3000", "ignored: field", "data"[:3]]
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A stream's text and the data of its events, in order. One kind of line end per
    stream: a CR then a LF would be one CRLF."""
    end = draw(END)
    text: list[str] = []
    expected: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        lines = draw(st.lists(LINE, min_size=1, max_size=3))
        for line in lines:
            for noise in draw(st.lists(NOISE, max_size=2)):
                text += [noise, end]
            # One space after the colon is the separator's: a line's own spaces stay.
            text += [draw(st.sampled_from(["data:", "data: "])) if line[:1] != " " else "data: "]
            text += [line, end]
        text.append(end)
        expected.append("\n".join(lines))
        if draw(st.booleans()):  # an event of no data in between: none
            text += [draw(NOISE), end, end]
    return "".join(text), expected


def fed(text: str, cuts: list[int]) -> list[str]:
    """The data ``text`` decodes to, fed in pieces cut at ``cuts``."""
    events, data, start = EventData(), [], 0
    for cut in sorted(cuts):
        data += events.feed(text[start:cut])
        start = max(start, cut)
    return data + events.feed(text[start:])


@given(streams(), st.lists(st.integers(0, 200), max_size=8))
def test_every_event_s_data_is_read_however_the_text_is_cut(
    stream: tuple[str, list[str]], cuts: list[int]
) -> None:
    text, expected = stream
    assert fed(text, cuts) == expected
    assert fed(text, list(range(len(text)))) == expected  # a character at a time


@given(streams(), LINE)
def test_an_event_the_stream_ends_before_its_empty_line_is_not_read(
    stream: tuple[str, list[str]], line: str
) -> None:
    text, expected = stream
    assert fed(text + f"data: {line}\n", []) == expected


def test_a_crlf_cut_between_two_pieces_is_one_line_end() -> None:
    events = EventData()
    assert events.feed("data: a\r") == []
    assert events.feed("\n") == []  # not an empty line: the CR's own LF
    assert events.feed("\r\n") == ["a"]


def test_a_byte_order_mark_opens_the_stream_only() -> None:
    events = EventData()
    assert events.feed("\ufeffdata: a\n\n") == ["a"]
    assert events.feed("\ufeffdata: b\n\n") == []  # a field named "\ufeffdata": ignored
