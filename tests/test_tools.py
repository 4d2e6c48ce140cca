"""@tool: tools from sync and async functions, their schemas and their calls."""

from __future__ import annotations

import enum
import threading
from typing import Annotated, Literal

import anyio
import anyio.lowlevel
import pytest

from raf import FunctionTool, Tool, tool

pytestmark = pytest.mark.anyio


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


@tool
def add(a: int, b: int = 1) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@tool
async def fetch(url: str, retries: int = 0) -> str:
    """Fetch a page."""
    await anyio.lowlevel.checkpoint()
    return f"{url} after {retries} retries"


async def test_tool_from_a_sync_function() -> None:
    assert isinstance(add, FunctionTool)
    assert isinstance(add, Tool)
    assert add.name == "add"
    assert add.description == "Add two numbers."
    assert add.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {"type": "integer", "description": "The second number.", "default": 1},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    assert await add.invoke({"a": 2, "b": 3}) == 5
    assert await add.invoke({"a": 2}) == 3
    # the decorated function stays callable through the tool
    assert add.fn(1, 1) == 2


async def test_tool_from_an_async_function() -> None:
    assert fetch.name == "fetch"
    assert fetch.description == "Fetch a page."
    assert fetch.parameters["required"] == ["url"]
    assert await fetch.invoke({"url": "x"}) == "x after 0 retries"


async def test_description_is_the_first_paragraph_on_one_line() -> None:
    @tool
    def f() -> None:
        """Do a thing
        over two lines.

        The details are not sent.
        """

    @tool
    def undocumented() -> None:
        pass

    assert f.description == "Do a thing over two lines."
    assert undocumented.description == ""
    assert undocumented.parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


async def test_name_description_and_in_thread_options() -> None:
    seen: list[int] = []

    @tool(name="lookup", description="Look a key up.", in_thread=True)
    def blocking_lookup(key: Annotated[str, "the key"]) -> str:
        """Ignored docstring."""
        seen.append(threading.get_ident())
        return key.upper()

    assert blocking_lookup.name == "lookup"
    assert blocking_lookup.description == "Look a key up."
    assert blocking_lookup.in_thread is True
    assert blocking_lookup.parameters["properties"]["key"] == {
        "type": "string",
        "description": "the key",
    }
    assert await blocking_lookup.invoke({"key": "k"}) == "K"
    assert seen != [threading.get_ident()]  # it ran in a worker thread

    @tool(description="")
    def quiet() -> None:
        """Docstring."""

    assert quiet.description == ""


async def test_sync_tools_run_in_the_event_loop_thread_by_default() -> None:
    seen: list[int] = []

    @tool
    def where() -> None:
        seen.append(threading.get_ident())

    await where.invoke({})
    assert seen == [threading.get_ident()]


async def test_enum_arguments_are_converted() -> None:
    @tool
    def temperature(
        unit: Unit, fallback: Unit = Unit.CELSIUS, maybe: Unit | None = None
    ) -> tuple[Unit, Unit, Unit | None]:
        return unit, fallback, maybe

    assert temperature.parameters["properties"]["unit"] == {"enum": ["celsius", "fahrenheit"]}
    assert temperature.parameters["properties"]["fallback"]["default"] == "celsius"
    assert await temperature.invoke({"unit": "fahrenheit"}) == (
        Unit.FAHRENHEIT,
        Unit.CELSIUS,
        None,
    )
    assert await temperature.invoke({"unit": "celsius", "maybe": "fahrenheit"}) == (
        Unit.CELSIUS,
        Unit.CELSIUS,
        Unit.FAHRENHEIT,
    )


async def test_literal_arguments_pass_through() -> None:
    @tool
    def pick(mode: Literal["fast", "slow"]) -> str:
        return mode

    assert pick.parameters["properties"]["mode"] == {"enum": ["fast", "slow"], "type": "string"}
    assert await pick.invoke({"mode": "slow"}) == "slow"


async def test_unsupported_and_missing_hints_fail_at_decoration() -> None:
    with pytest.raises(TypeError, match=r"tool f: parameter 'x' needs a type hint"):

        @tool
        def f(x) -> None:  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(TypeError, match=r"tool g: parameter 'x': no JSON Schema"):

        @tool
        def g(x: bytes) -> None:
            pass

    with pytest.raises(TypeError, match=r"tool h: \*args and \*\*kwargs"):

        @tool
        def h(*args: int) -> None:
            pass

    with pytest.raises(TypeError, match="@tool needs a function"):
        tool(42)  # type: ignore[call-overload]


async def test_the_tool_function_raising_propagates_from_invoke() -> None:
    @tool
    async def broken() -> None:
        raise RuntimeError("boom")

    # invoke itself does not hide errors; the tool loop turns them into messages
    with pytest.raises(RuntimeError, match="boom"):
        await broken.invoke({})


async def test_enums_inside_lists_and_dicts_are_converted_item_by_item() -> None:
    @tool
    def paint(units: list[Unit], by_room: dict[str, Unit] | None = None) -> object:
        return units, by_room

    assert paint.parameters["properties"]["units"] == {
        "type": "array",
        "items": {"enum": ["celsius", "fahrenheit"]},
    }
    assert await paint.invoke({"units": ["celsius", "fahrenheit"]}) == (
        [Unit.CELSIUS, Unit.FAHRENHEIT],
        None,
    )
    assert await paint.invoke({"units": [], "by_room": {"hall": "celsius"}}) == (
        [],
        {"hall": Unit.CELSIUS},
    )


async def test_in_thread_is_refused_for_async_functions() -> None:
    # an async function run "in a thread" would only create a coroutine there,
    # never awaited: refuse it where the mistake is made
    with pytest.raises(TypeError, match=r"in_thread=True.*async"):

        @tool(in_thread=True)
        async def fetch_page(url: str) -> str:
            return url


async def test_unresolvable_hints_name_the_tool() -> None:
    # under `from __future__ import annotations` (as in this module) hints are
    # strings, and a class defined inside a function cannot be found again
    class Local(enum.Enum):
        A = "a"

    with pytest.raises(TypeError, match=r"tool pick_local: cannot resolve .*'Local'"):

        @tool
        def pick_local(mode: Local) -> str:
            return str(mode)
