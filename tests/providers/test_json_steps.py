"""JSON parsed in steps: the same value as json.loads, the same refusals, and pauses."""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raf._providers.json_steps import loads_in_steps

pytestmark = pytest.mark.anyio

VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=40,
)
LAYOUTS = st.sampled_from([{}, {"indent": 2}, {"separators": (",", ":")}, {"indent": "\t"}])


@given(value=VALUES, layout=LAYOUTS, step=st.integers(1, 64))
async def test_the_value_is_what_json_loads_gives(
    value: Any, layout: dict[str, Any], step: int
) -> None:
    text = " " + json.dumps(value, **layout) + "\n"
    assert await loads_in_steps(text, step_chars=step) == json.loads(text) == value


@given(text=st.text(alphabet='{}[]",: 1a\\nulteru', max_size=30))
async def test_a_text_json_refuses_is_refused(text: str) -> None:
    try:
        expected = json.loads(text)
    except ValueError:
        with pytest.raises(json.JSONDecodeError):
            await loads_in_steps(text, step_chars=1)
    else:
        assert await loads_in_steps(text, step_chars=1) == expected


async def test_a_long_list_is_parsed_with_the_loop_turning_in_between() -> None:
    page = {"result": {"tools": [{"name": f"tool{n}", "x": [n] * 20} for n in range(2_000)]}}
    text = json.dumps(page)
    turns = 0
    parsed = False

    async def ticker() -> None:
        nonlocal turns
        while not parsed:
            await anyio.lowlevel.checkpoint()
            turns += 1

    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        value = await loads_in_steps(text, step_chars=4_096)
        parsed = True
    assert value == page
    assert turns >= len(text) // 4_096 // 2  # json.loads: none at all
