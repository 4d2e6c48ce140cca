"""The marker of a cut tool result: written from the result's figures, read back the same."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from raf._values.spill import CutResult, cut_marker, mentions_spill, parse_cut


@given(
    call_id=st.one_of(st.none(), st.text(min_size=1, max_size=60)),
    total=st.integers(min_value=1, max_value=10**10),
    data=st.data(),
)
def test_a_marker_reads_back_as_it_was_written(
    call_id: str | None, total: int, data: st.DataObject
) -> None:
    start = data.draw(st.integers(min_value=0, max_value=total))
    end = data.draw(st.integers(min_value=start, max_value=total))
    marker = cut_marker(call_id, total, start, end)
    assert parse_cut(f"head\n{marker}\ntail") == CutResult(call_id, total, start, end)
    assert mentions_spill(marker) == (call_id is not None)


def test_text_without_a_marker_of_raf_reads_as_none() -> None:
    assert parse_cut(None) is None
    assert parse_cut("plain text") is None
    # Figures that do not add up are not a marker raf wrote.
    assert parse_cut("[raf: 5 characters left out (characters 1 to 3 of 9)]") is None
    assert parse_cut("[raf: 2 characters left out (characters 1 to 3 of 9)]") == CutResult(
        None, 9, 1, 3
    )
