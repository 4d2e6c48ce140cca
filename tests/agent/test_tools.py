"""@tool: tools from sync and async functions, their schemas, validation and coercion."""

from __future__ import annotations

import dataclasses
import enum
import json
import pickle
import re
import sys
import threading
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import anyio
import anyio.lowlevel
import jsonschema
import pydantic
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

import raf._agent.tool_problems
from raf import (
    Agent,
    ContextProvider,
    ContextResult,
    FunctionTool,
    ScriptedChatClient,
    Tool,
    ToolCall,
    ToolRequest,
    check_tool_arguments,
    check_tool_schema,
    tool,
)
from raf.errors import ToolArgumentsError, ToolSchemaError

pytestmark = pytest.mark.anyio


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Item(BaseModel):
    name: str
    qty: Annotated[int, Field(ge=1)]


@dataclasses.dataclass
class Point:
    x: float
    y: float = 0.0


class Address(TypedDict):
    street: str
    number: int


class StdlibTypedDict(typing.TypedDict):
    """pydantic wants typing_extensions.TypedDict before Python 3.12."""

    x: int


class Opaque:
    """A class pydantic knows nothing about."""


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


async def test_descriptions_from_annotated_field_and_docstring() -> None:
    @tool
    def weather(
        city: str,
        days: Annotated[int, "days ahead, 1 to 7"] = 1,
        unit: Annotated[str, Field(description="from Field")] = "C",
    ) -> str:
        """Forecast the weather.

        Uses the national service.

        Args:
            city: The city name,
                in English.
            days (int): ignored, Annotated wins.
            unit: ignored, Field wins.
        """
        return city

    props = weather.parameters["properties"]
    assert weather.description == "Forecast the weather."
    assert props["city"]["description"] == "The city name, in English."
    assert props["days"]["description"] == "days ahead, 1 to 7"
    assert props["unit"]["description"] == "from Field"


async def test_enum_arguments_are_converted() -> None:
    @tool
    def temperature(
        unit: Unit, fallback: Unit = Unit.CELSIUS, maybe: Unit | None = None
    ) -> tuple[Unit, Unit, Unit | None]:
        return unit, fallback, maybe

    schema = temperature.parameters
    assert schema["properties"]["unit"] == {"$ref": "#/$defs/Unit"}
    assert schema["$defs"]["Unit"]["enum"] == ["celsius", "fahrenheit"]
    assert schema["properties"]["fallback"]["default"] == "celsius"
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


async def test_enums_inside_lists_and_dicts_are_converted_item_by_item() -> None:
    @tool
    def paint(units: list[Unit], by_room: dict[str, Unit] | None = None) -> object:
        return units, by_room

    assert paint.parameters["properties"]["units"] == {
        "type": "array",
        "items": {"$ref": "#/$defs/Unit"},
    }
    assert await paint.invoke({"units": ["celsius", "fahrenheit"]}) == (
        [Unit.CELSIUS, Unit.FAHRENHEIT],
        None,
    )
    assert await paint.invoke({"units": [], "by_room": {"hall": "celsius"}}) == (
        [],
        {"hall": Unit.CELSIUS},
    )


@tool
def order(
    items: list[Item],
    count: int,
    tags: set[str],
    span: tuple[int, str],
    level: Level,
    where: Point,
    address: Address,
    repeat: Annotated[int, Field(ge=1, le=5)] = 1,
    note: str | None = None,
) -> dict[str, Any]:
    """Place an order (returns what it received, to look at)."""
    return dict(locals())


async def test_arguments_are_coerced_into_the_declared_types() -> None:
    got = await order.invoke(
        {
            "items": [{"name": "tea", "qty": 2}],
            "count": "3",  # a numeric string for an int
            "tags": ["a", "b", "a"],
            "span": [1, "x"],
            "level": 2,
            "where": {"x": 1},
            "address": {"street": "Main", "number": "7"},
        }
    )
    assert got["items"] == [Item(name="tea", qty=2)]
    assert type(got["count"]) is int
    assert got["count"] == 3
    assert got["tags"] == {"a", "b"}
    assert got["span"] == (1, "x")
    assert got["level"] is Level.HIGH
    assert got["where"] == Point(1.0, 0.0)
    assert got["address"] == {"street": "Main", "number": 7}
    assert got["repeat"] == 1
    assert got["note"] is None


async def test_the_schema_describes_the_declared_types() -> None:
    schema = order.parameters
    props = schema["properties"]
    assert schema["required"] == [
        "items",
        "count",
        "tags",
        "span",
        "level",
        "where",
        "address",
    ]
    assert props["items"] == {"type": "array", "items": {"$ref": "#/$defs/Item"}}
    assert schema["$defs"]["Item"]["properties"]["qty"] == {"type": "integer", "minimum": 1}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    assert props["span"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    assert props["repeat"] == {"type": "integer", "minimum": 1, "maximum": 5, "default": 1}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert not any("title" in value for value in props.values())
    jsonschema.Draft202012Validator.check_schema(schema)


async def test_arguments_that_do_not_fit_are_refused_with_their_paths() -> None:
    called: list[int] = []

    @tool
    def stock(items: list[Item], repeat: Annotated[int, Field(ge=1)] = 1) -> None:
        called.append(1)

    with pytest.raises(ToolArgumentsError) as caught:
        await stock.invoke(
            {
                "items": [
                    {"name": "a", "qty": 1},
                    {"name": "b", "qty": 3},
                    {"name": "c", "qty": 0},
                ],
                "repeat": "many",
                "colour": "red",
            }
        )
    assert caught.value.tool == "stock"
    assert caught.value.problems == (
        "items[2].qty: Input should be greater than or equal to 1",
        "repeat: Input should be a valid integer, unable to parse string as an integer",
        "colour: Extra inputs are not permitted",
    )
    assert str(caught.value).startswith(
        "invalid arguments for 'stock': items[2].qty: Input should be greater than or equal to 1; "
    )
    assert called == []  # the function never ran

    with pytest.raises(ToolArgumentsError, match=r"^invalid arguments for 'stock': items: Field"):
        await stock.invoke({})


async def test_many_problems_are_counted_not_all_listed() -> None:
    @tool
    def numbers(values: list[int]) -> None:
        pass

    with pytest.raises(ToolArgumentsError) as caught:
        await numbers.invoke({"values": ["x"] * 50})
    problems = caught.value.problems
    assert len(problems) == raf._agent.tool_problems.MAX_PROBLEMS + 1
    assert problems[0].startswith("values[0]: Input should be a valid integer")
    assert problems[-1] == "and 40 more"


async def test_a_missing_argument_takes_the_functions_own_default_object() -> None:
    shared: list[int] = []

    @tool
    def keep(items: list[int] = shared) -> bool:
        return items is shared

    assert await keep.invoke({}) is True  # the very object, not pydantic's copy of it
    assert await keep.invoke({"items": []}) is False


async def test_parameter_names_may_be_any_identifier() -> None:
    @tool
    def odd(json: str, model_config: int, _private: bool = False, schema: str = "s") -> str:
        return f"{json} {model_config} {_private} {schema}"

    assert set(odd.parameters["properties"]) == {"json", "model_config", "_private", "schema"}
    assert await odd.invoke({"json": "j", "model_config": 2, "_private": True}) == "j 2 True s"
    with pytest.raises(ToolArgumentsError, match="p0: Extra inputs"):
        await odd.invoke({"json": "j", "model_config": 2, "p0": "internal field names stay hidden"})


async def test_the_model_is_built_once_when_the_tool_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    create_model = pydantic.create_model

    def counting(name: str, /, **kwargs: Any) -> Any:
        built.append(name)
        return create_model(name, **kwargs)

    monkeypatch.setattr(pydantic, "create_model", counting)

    @tool
    def square(x: int) -> int:
        return x * x

    assert built == ["square_arguments"]
    for value in range(20):
        assert await square.invoke({"x": value}) == value * value
    assert built == ["square_arguments"]


async def test_unsupported_and_missing_hints_fail_at_decoration() -> None:
    with pytest.raises(TypeError, match=r"tool f: parameter 'x' needs a type hint"):

        @tool
        def f(x) -> None:  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(TypeError, match=r"tool g: parameter 'x': Unable to generate pydantic"):

        @tool
        def g(x: Opaque) -> None:
            pass

    with pytest.raises(
        TypeError,
        match=r"^tool c: parameter 'cb': Cannot generate a JsonSchema for "
        r"core_schema.CallableSchema \(type collections.abc.Callable\[\[int\], int\]\)$",
    ):

        @tool
        def c(cb: Callable[[int], int]) -> None:
            pass

    with pytest.raises(TypeError, match=r"tool h: \*args and \*\*kwargs"):

        @tool
        def h(*args: int) -> None:
            pass

    with pytest.raises(TypeError, match=r"tool p: parameter 'a' is positional-only"):

        @tool
        def p(a: int, /) -> None:
            pass

    with pytest.raises(TypeError, match="@tool needs a function"):
        tool(42)  # type: ignore[call-overload]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="a pydantic rule for Python 3.11")
async def test_a_stdlib_typed_dict_is_refused_before_python_3_12() -> None:
    with pytest.raises(
        TypeError,
        match=r"^tool t: parameter 'a': Please use `typing_extensions.TypedDict` instead of "
        r"`typing.TypedDict` on Python < 3.12 \(type",
    ):

        @tool
        def t(a: StdlibTypedDict) -> None:
            pass


async def test_a_default_that_is_not_json_fails_at_decoration() -> None:
    with pytest.raises(
        TypeError,
        match=r"tool f: parameter 'marker': its default <.*Opaque object at .*> is not JSON$",
    ):

        @tool
        def f(marker: object = Opaque()) -> None:
            pass

    with pytest.raises(TypeError, match=r"tool g: parameter 'n': write `n: Annotated\[T, Field"):

        @tool
        def g(n: int = Field(3, ge=1)) -> None:
            pass


async def test_the_tool_function_raising_propagates_from_invoke() -> None:
    @tool
    async def broken() -> None:
        raise RuntimeError("boom")

    # invoke itself does not hide errors; the tool loop turns them into messages
    with pytest.raises(RuntimeError, match="boom"):
        await broken.invoke({})


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


# -- hand-made schemas -------------------------------------------------------------------


def echo(**kwargs: Any) -> dict[str, Any]:
    return kwargs


MALFORMED = [
    ({"enum": 5}, "at enum: 5 is not of type 'array'"),
    ({"type": "object", "properties": ["a"]}, "at properties: ['a'] is not of type 'object'"),
    ({"type": 5}, "at type: 5 is not valid under any of the given schemas"),
    ({"type": "object", "required": 5}, "at required: 5 is not of type 'array'"),
    ({"properties": {"x": {"minimum": "1"}}}, "at properties.x.minimum: '1' is not of type"),
    ({"$schema": {}}, "at $schema: {} is not of type 'string'"),
    ({"x": {1, 2}}, "not JSON: set {1, 2}"),
]


@pytest.mark.parametrize(("schema", "problem"), MALFORMED)
def test_a_malformed_schema_is_refused_naming_the_tool(
    schema: dict[str, Any], problem: str
) -> None:
    expected = rf"^tool 'search' has an invalid parameters schema: {problem}"
    with pytest.raises(ToolSchemaError, match=_literal(expected)) as caught:
        check_tool_schema("search", schema)
    assert caught.value.tool == "search"
    with pytest.raises(ToolSchemaError, match=_literal(expected)):
        FunctionTool(echo, "search", "Search.", schema)


def _literal(pattern: str) -> str:
    # the problems quote brackets and dollars: match them as text after the anchor
    import re

    return "^" + re.escape(pattern[1:])


@pytest.mark.parametrize(
    "schema",
    [
        {},
        {"type": "object", "properties": {"x": True, "y": False}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
        {"$schema": "https://example.com/unknown", "type": "object"},
        {
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/node"}},
            "$defs": {"node": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        },
    ],
)
def test_valid_schemas_pass(schema: dict[str, Any]) -> None:
    check_tool_schema("ok", schema)


async def test_a_hand_made_function_tool_checks_its_own_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1}, "free": True, "never": False},
        "required": ["n"],
    }
    made = FunctionTool(echo, "count", "Count.", schema)
    assert await made.invoke({"n": 2, "free": [1]}) == {"n": 2, "free": [1]}
    with pytest.raises(ToolArgumentsError) as caught:
        await made.invoke({"n": 0, "never": 1})
    # jsonschema (4.26) reports a `false` subschema without the path that led to it
    assert caught.value.problems == (
        "False schema does not allow 1",
        "n: 0 is less than the minimum of 1",
    )


@dataclasses.dataclass(frozen=True, eq=False)
class HandMade:
    """A hand-made tool (as MCP's): the schema comes from elsewhere."""

    name: str
    parameters: Any
    description: str = "hand-made"

    async def invoke(self, arguments: Any) -> Any:
        return dict(arguments)


def test_check_arguments_names_the_path_every_time() -> None:
    schema = {
        "type": "object",
        "properties": {"rows": {"type": "array", "items": {"type": "object", "required": ["id"]}}},
    }
    checked = HandMade("rows", schema)
    for _ in range(5):
        check_tool_arguments(checked, {"rows": [{"id": 1}]})
        with pytest.raises(ToolArgumentsError, match=r"rows\[1\]: 'id' is a required property"):
            check_tool_arguments(checked, {"rows": [{"id": 1}, {}]})
    # a tool of the same name with other parameters is checked against its own schema
    other = HandMade("rows", {"type": "object", "required": ["rows"]})
    with pytest.raises(ToolArgumentsError, match=r"^invalid arguments for 'rows': 'rows' is a"):
        check_tool_arguments(other, {})


def test_check_arguments_refuses_a_malformed_schema_every_time() -> None:
    broken = HandMade("broken", {"type": "object", "required": 5})
    for _ in range(2):
        with pytest.raises(ToolSchemaError, match="tool 'broken' has an invalid parameters"):
            check_tool_arguments(broken, {})


def test_a_ref_that_cannot_be_resolved_is_a_schema_error_not_a_fetch() -> None:
    remote = HandMade("remote", {"$ref": "https://example.com/schema.json"})
    with pytest.raises(ToolSchemaError, match="a \\$ref cannot be resolved"):
        check_tool_arguments(remote, {})


def test_the_new_errors_survive_pickling() -> None:
    for error in (
        ToolArgumentsError("f", ("a: Field required", "b: bad")),
        ToolSchemaError("f", "at enum: 5 is not of type 'array'"),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert copy.tool == "f"


# -- properties ----------------------------------------------------------------------------

HINTS: list[Any] = [
    int,
    float,
    bool,
    str,
    list[int],
    set[str],
    tuple[int, str],
    tuple[float, ...],
    dict[str, Unit],
    Literal["a", "b", 3],
    Level,
    int | None,
    Item,
    Point,
    Address,
    list[Item | None],
]


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from(HINTS))
def test_what_fits_the_schema_is_accepted_and_comes_back_as_sent(
    data: st.DataObject, hint: Any
) -> None:
    # The contract with the model: JSON that fits the schema it was shown is
    # never refused, and arrives in the declared type.
    adapter = pydantic.TypeAdapter(hint)
    value = data.draw(st.from_type(hint).filter(_valid(adapter)))
    sent = adapter.dump_python(value, mode="json")
    assume(_is_json(sent))  # NaN and infinities are not JSON: no model can send them

    def take(v: Any) -> Any:
        return v

    take.__annotations__ = {"v": hint, "return": Any}
    made = tool(take)
    jsonschema.Draft202012Validator(made.parameters).validate({"v": sent})
    got = anyio.run(made.invoke, {"v": sent})
    assert got == value


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _valid(adapter: pydantic.TypeAdapter[Any]) -> Any:
    def check(value: Any) -> bool:
        try:
            adapter.validate_python(value, strict=True)
        except pydantic.ValidationError:
            return False
        return True

    return check


async def test_paths_quote_keys_that_are_not_names() -> None:
    @tool
    def scores(by_name: dict[str, int]) -> None:
        pass

    with pytest.raises(ToolArgumentsError) as caught:
        await scores.invoke({"by_name": {"ann": 1, "first name": "x"}})
    assert caught.value.problems == (
        'by_name["first name"]: Input should be a valid integer, unable to parse string as an '
        "integer",
    )


def test_a_flood_of_misfits_is_told_in_brief() -> None:
    numbers = HandMade(
        "numbers", {"type": "object", "properties": {"n": {"items": {"type": "integer"}}}}
    )
    with pytest.raises(ToolArgumentsError) as caught:
        check_tool_arguments(numbers, {"n": ["x"] * 5000})
    problems = caught.value.problems
    assert problems[0] == "n[0]: 'x' is not of type 'integer'"
    assert len(problems) == raf._agent.tool_problems.MAX_PROBLEMS + 1
    assert problems[-1] == f"and more than {1000 - raf._agent.tool_problems.MAX_PROBLEMS} more"
    with pytest.raises(ToolArgumentsError) as caught:
        check_tool_arguments(numbers, {"n": ["x"] * 12})
    assert caught.value.problems[-1] == "and 2 more"
    assert caught.value.problems[2] == "n[2]: 'x' is not of type 'integer'"  # not n[10]


# --- in_thread: raf stops waiting for a thread it started when the call is cancelled -------


class Blocked:
    """A blocking function for a worker thread: it waits until released (at most 10 s)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()

    def __call__(self) -> str:
        self.release.wait(10)
        self.finished.set()
        return "late"


async def test_a_tool_in_a_thread_honours_the_callers_deadline() -> None:
    blocked = Blocked()
    slow = tool(name="slow", in_thread=True)(lambda: blocked())
    model = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "slow", "{}")), "never"])
    try:
        with anyio.fail_after(20), anyio.move_on_after(0.3) as deadline:
            await Agent(model, tools=[slow]).run("go")
        assert deadline.cancelled_caught
        # raf stopped waiting: the run is over while the thread still runs.
        assert not blocked.finished.is_set()
    finally:
        blocked.release.set()


async def test_a_tool_in_a_thread_honours_the_timeout_recipe() -> None:
    blocked = Blocked()
    slow = tool(name="slow", in_thread=True)(lambda: blocked())

    async def timeout(request: ToolRequest, call_next: Callable[[ToolRequest], Any]) -> Any:
        with anyio.move_on_after(0.3):
            return await call_next(request)
        return request.reply("Error: the tool did not finish in time")

    call = ScriptedChatClient.tool_turn(ToolCall("1", "slow", "{}"))
    model = ScriptedChatClient([call, "gave up"])
    try:
        with anyio.fail_after(20):
            response = await Agent(model, tools=[slow], tool_stack=[timeout]).run("go")
        assert response.text == "gave up"
        assert not blocked.finished.is_set()
        tool_message = model.requests[1].messages[-1]
        assert tool_message.content == "Error: the tool did not finish in time"
    finally:
        blocked.release.set()
    # The abandoned thread's late result goes nowhere: the run has its answer already.
    assert blocked.finished.wait(10)
    assert response.text == "gave up"


# --- A hand-made tool whose parameters are not JSON: refused where the tool comes in -------


def _not_json_schemas() -> list[Any]:
    circular: dict[str, Any] = {"type": "object"}
    circular["properties"] = {"self": circular}
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(3000):
        deep = {"type": "object", "properties": {"x": deep}}
    return [
        {"type": "object", "enum": {1, 2}},
        circular,
        {"type": "object", "properties": {b"raw": {"type": "string"}}},
        deep,
        {"type": "number", "maximum": float("nan")},
    ]


@pytest.mark.parametrize(
    "parameters", _not_json_schemas(), ids=["set", "circular", "bytes key", "3000 deep", "nan"]
)
async def test_a_hand_made_tool_that_is_not_json_is_refused_when_the_agent_is_built(
    parameters: Any,
) -> None:
    with pytest.raises(ToolSchemaError, match="'odd' has an invalid parameters schema: not JSON"):
        Agent(ScriptedChatClient(["never"]), tools=[HandMade("odd", parameters)])


@pytest.mark.parametrize(
    "parameters", _not_json_schemas(), ids=["set", "circular", "bytes key", "3000 deep", "nan"]
)
async def test_a_provider_tool_that_is_not_json_ends_the_run_before_the_model_is_called(
    parameters: Any,
) -> None:
    class Offers(ContextProvider):
        async def on_invoking(self, *args: Any) -> ContextResult:
            return ContextResult(tools=[HandMade("odd", parameters)])

    model = ScriptedChatClient(["never"])
    with pytest.raises(ToolSchemaError, match="not JSON"):
        await Agent(model, stack=[Offers()]).run("go")
    assert model.requests == []


async def test_a_hand_made_tool_with_a_malformed_but_json_schema_still_reaches_the_model() -> None:
    # Only what cannot be sent at all is refused up front; a schema that is JSON but not a
    # valid JSON Schema is refused when the model calls the tool (the model is told).
    odd = HandMade("odd", {"type": "object", "enum": 5})
    model = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "odd", "{}")), "ok"])
    response = await Agent(model, tools=[odd]).run("go")
    assert response.text == "ok"
    assert [t.name for t in model.requests[0].options.tools] == ["odd"]
    told = model.requests[1].messages[-1]
    assert (told.role, told.tool_call_id) == ("tool", "1")
    assert "schema" in (told.content or "")


class _Handmade:
    """A Tool of its own (not a FunctionTool): checked against its ``parameters``."""

    def __init__(self, name: str, parameters: dict[str, Any]) -> None:
        self.name = name
        self.description = "a hand-made tool"
        self.parameters = parameters

    async def invoke(self, arguments: Any) -> Any:
        return arguments


def test_a_tools_arguments_are_checked_against_its_schema_as_it_is_now() -> None:
    # The validator is kept by the schema itself (its JSON text), not by the tool's id: a
    # schema changed in place, or another tool at a reused id, is never checked by a
    # validator of another schema.
    parameters: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    handmade = _Handmade("add", parameters)
    check_tool_arguments(handmade, {"a": 1})
    parameters["required"] = ["b"]
    with pytest.raises(ToolArgumentsError, match="'b' is a required property"):
        check_tool_arguments(handmade, {"a": 1})
    for number in range(50):  # new tools, some at the ids of the ones before
        strict = {"type": "object", "required": [f"x{number}"]}
        with pytest.raises(ToolArgumentsError, match=f"'x{number}' is a required property"):
            check_tool_arguments(_Handmade("t", strict), {})


def test_a_function_tool_holds_its_own_validator() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    made = FunctionTool(lambda a: a, "echo", "Echo.", schema)
    with pytest.raises(ToolArgumentsError):
        check_tool_arguments(made, {})
    with pytest.raises(ToolSchemaError, match="not JSON"):
        FunctionTool(lambda: None, "bad", "Bad.", {"type": "object", "enum": {1, 2}})


# A pattern is matched by RE2 (linear time): the model writes the arguments, and a prompt
# injection can steer them at a pattern that backtracks (Python's re took 2^n steps here).
CATASTROPHIC = "^(a+)+$"
STEERED = "a" * 5_000 + "!"


@pytest.mark.parametrize(
    ("schema", "arguments", "problem"),
    [
        (
            {"type": "object", "properties": {"code": {"type": "string", "pattern": CATASTROPHIC}}},
            {"code": STEERED},
            "code: 'aaaa",
        ),
        (
            {
                "type": "object",
                "patternProperties": {CATASTROPHIC: {"type": "integer"}},
                "additionalProperties": False,
            },
            {"a" * 60 + "!": 1},
            "does not match any of the regexes: '^(a+)+$'",
        ),
        (
            {"type": "object", "patternProperties": {CATASTROPHIC: {"type": "integer"}}},
            {"a" * 60: "one"},
            "'one' is not of type 'integer'",
        ),
    ],
)
def test_a_pattern_that_backtracks_is_matched_in_linear_time(
    schema: dict[str, Any], arguments: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ToolArgumentsError, match=re.escape(problem)):
        check_tool_arguments(HandMade("steered", schema), arguments)
    check_tool_arguments(HandMade("steered", schema), {})


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "string", "pattern": "(?=a)b"}, "at pattern: the pattern '(?=a)b' cannot be"),
        (
            {"type": "object", "properties": {"k": {"patternProperties": {"(a)\\1": {}}}}},
            "at properties.k.patternProperties.(a)\\1: the pattern",
        ),
        (
            {"type": "object", "patternProperties": {"a": {}}, "unevaluatedProperties": False},
            "unevaluatedProperties beside patternProperties",
        ),
    ],
)
def test_a_pattern_re2_cannot_match_is_refused_with_the_schema(
    schema: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ToolSchemaError, match=re.escape(problem)):
        check_tool_schema("linear", schema)
