"""JSON Schema from type hints, and the argument checker."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raf.schema import SchemaError, check_arguments, schema_for_function, schema_for_type


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


# -- schema_for_type -------------------------------------------------------------


@pytest.mark.parametrize(
    ("hint", "schema"),
    [
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (str, {"type": "string"}),
        (bool, {"type": "boolean"}),
        (type(None), {"type": "null"}),
        (Any, {}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list, {"type": "array"}),
        (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
        (
            tuple[int, str],
            {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
        ),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (dict, {"type": "object"}),
        (Literal["a", "b"], {"enum": ["a", "b"], "type": "string"}),
        (Literal[1, 2], {"enum": [1, 2], "type": "integer"}),
        (Literal[1, "a"], {"enum": [1, "a"]}),
        (Color, {"enum": ["red", "blue"]}),
        (Level, {"enum": [1, 2]}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (
            list[dict[str, int]],
            {
                "type": "array",
                "items": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
        ),
        (Annotated[int, "how many"], {"type": "integer", "description": "how many"}),
    ],
)
def test_schema_for_type(hint: Any, schema: dict[str, Any]) -> None:
    assert schema_for_type(hint) == schema


@pytest.mark.parametrize("hint", [bytes, complex, object, dict[int, str], set[bytes]])
def test_unsupported_hints_are_type_errors(hint: Any) -> None:
    with pytest.raises(TypeError, match="JSON"):
        schema_for_type(hint)


# -- schema_for_function -------------------------------------------------------


def test_required_and_defaults() -> None:
    def search(
        query: str,
        limit: int = 10,
        exact: bool = False,
        tags: list[str] | None = None,
        color: Color = Color.BLUE,
        point: tuple[int, int] = (0, 0),
    ) -> None: ...

    schema, _ = schema_for_function(search)
    assert schema["type"] == "object"
    assert schema["required"] == ["query"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["query"] == {"type": "string"}
    assert props["limit"] == {"type": "integer", "default": 10}
    assert props["exact"] == {"type": "boolean", "default": False}
    # None is the natural default of an optional parameter: no "default" noise
    assert props["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]
    }
    assert props["color"]["default"] == "blue"  # the enum's value, as JSON
    assert props["point"]["default"] == [0, 0]


def test_annotated_and_docstring_args_describe_parameters() -> None:
    def weather(city: str, days: Annotated[int, "days ahead, 1 to 7"] = 1) -> str:
        """Forecast the weather.

        Uses the national service.

        Args:
            city: The city name,
                in English.
            days (int): ignored, Annotated wins.
        """
        return city

    schema, documented = schema_for_function(weather)
    assert schema["properties"]["city"]["description"] == "The city name, in English."
    assert schema["properties"]["days"]["description"] == "days ahead, 1 to 7"
    assert documented == {"city": "The city name, in English.", "days": "ignored, Annotated wins."}


def test_missing_hint_is_a_type_error_naming_function_and_parameter() -> None:
    def f(a: int, b) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(TypeError, match=r"tool f: parameter 'b' needs a type hint"):
        schema_for_function(f)


def test_unsupported_hint_names_the_parameter() -> None:
    def f(data: bytes) -> None: ...

    with pytest.raises(TypeError, match=r"tool f: parameter 'data': no JSON Schema for type"):
        schema_for_function(f)


@pytest.mark.parametrize("signature", ["*args: int", "**kwargs: int", "a: int, /"])
def test_star_args_and_positional_only_are_type_errors(signature: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"def f({signature}) -> None: ...", namespace)
    with pytest.raises(TypeError, match=r"tool f: .*(\*args|positional-only)"):
        schema_for_function(namespace["f"])


def test_non_json_default_is_a_type_error() -> None:
    def f(x: int = object()) -> None: ...  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"default of 'x' is not JSON"):
        schema_for_function(f)


# -- check_arguments: examples -------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "age": {"type": "integer", "minimum": 0},
        "height": {"type": "number"},
        "admin": {"type": "boolean"},
        "role": {"enum": ["dev", "ops"]},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "scores": {"type": "object", "additionalProperties": {"type": "number"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    "value",
    [
        {"name": "Ann"},
        {"name": "Ann", "age": 3, "height": 1.7, "admin": True, "role": "ops"},
        {"name": "Ann", "height": 2},  # an integer is a number
        {"name": "Ann", "age": 3.0},  # JSON Schema: 3.0 is an integer
        {"name": "Ann", "nick": None},
        {"name": "Ann", "nick": "A"},
        {"name": "Ann", "tags": []},
        {"name": "Ann", "tags": ["a", "b", "c"]},
        {"name": "Ann", "address": {"city": "Oslo"}},
        {"name": "Ann", "scores": {"math": 1, "art": 2.5}},
    ],
)
def test_check_accepts(value: dict[str, Any]) -> None:
    check_arguments(PERSON, value)


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        ([], "$", "expected object, got array"),
        ({}, "$", "missing required property 'name'"),
        ({"name": "Ann", "x": 1}, "$", "unexpected property 'x'"),
        ({"name": 5}, "$.name", "expected string, got integer"),
        ({"name": ""}, "$.name", "shorter than 1"),
        ({"name": "A", "age": 1.5}, "$.age", "expected integer, got number"),
        ({"name": "A", "age": True}, "$.age", "expected integer, got boolean"),
        ({"name": "A", "age": "3"}, "$.age", "expected integer, got string"),
        ({"name": "A", "age": -1}, "$.age", "less than the minimum 0"),
        ({"name": "A", "height": False}, "$.height", "expected number, got boolean"),
        ({"name": "A", "admin": 1}, "$.admin", "expected boolean, got integer"),
        ({"name": "A", "role": "boss"}, "$.role", "expected one of ['dev', 'ops']"),
        ({"name": "A", "nick": 3}, "$.nick", "matches none of"),
        ({"name": "A", "tags": ["a", 2]}, "$.tags[1]", "expected string, got integer"),
        ({"name": "A", "tags": ["a"] * 4}, "$.tags", "more than 3 items"),
        ({"name": "A", "address": {}}, "$.address", "missing required property 'city'"),
        ({"name": "A", "address": {"city": None}}, "$.address.city", "expected string, got null"),
        ({"name": "A", "address": {"city": "x", "zip": 1}}, "$.address", "unexpected property"),
        ({"name": "A", "scores": {"art": "high"}}, "$.scores.art", "expected number"),
    ],
)
def test_check_rejects_with_the_path(value: Any, path: str, problem: str) -> None:
    with pytest.raises(SchemaError) as caught:
        check_arguments(PERSON, value)
    assert caught.value.path == path
    assert problem in caught.value.problem
    assert str(caught.value).startswith(f"{path}: ")


def test_check_tuples_const_allof_and_unknown_keywords() -> None:
    pair = schema_for_type(tuple[int, str])
    check_arguments(pair, [1, "a"])
    with pytest.raises(SchemaError, match=r"\$\[1\]: expected string"):
        check_arguments(pair, [1, 2])
    with pytest.raises(SchemaError, match="fewer than 2 items"):
        check_arguments(pair, [1])
    with pytest.raises(SchemaError, match="expected 'x'"):
        check_arguments({"const": "x"}, "y")
    with pytest.raises(SchemaError, match="more than the maximum 5"):
        check_arguments({"allOf": [{"type": "integer"}, {"maximum": 5}]}, 6)
    check_arguments({"type": "string", "format": "email", "x-custom": 1}, "not checked")
    check_arguments({"type": ["string", "null"]}, None)
    with pytest.raises(SchemaError, match="expected string or null, got integer"):
        check_arguments({"type": ["string", "null"]}, 1)


# -- check_arguments: properties -----------------------------------------------

_scalar_hints = st.sampled_from(
    [int, float, str, bool, Literal["a", "b"], Literal[1, 2, 3], Color, Level]
)


def _compound(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        inner.map(lambda h: list[h]),  # type: ignore[valid-type]
        inner.map(lambda h: dict[str, h]),  # type: ignore[valid-type]
        inner.map(lambda h: Optional[h]),  # noqa: UP045
    )


hints = st.recursive(_scalar_hints, _compound, max_leaves=4)

_keys = st.text(min_size=1, max_size=5)


def values_for(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    """Values that fit the schemas schema_for_type produces."""
    if "anyOf" in schema:
        return st.one_of([values_for(option) for option in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(-(10**9), 10**9)
    if kind == "number":
        return st.integers(-100, 100) | st.floats(allow_nan=False, allow_infinity=False)
    if kind == "string":
        return st.text(max_size=10)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(values_for(schema["items"]), max_size=3)
    if kind == "object":
        return st.dictionaries(_keys, values_for(schema["additionalProperties"]), max_size=3)
    raise AssertionError(f"no values for {schema}")


@settings(max_examples=100)
@given(st.data(), hints)
def test_values_generated_from_a_schema_always_pass(data: st.DataObject, hint: Any) -> None:
    schema = schema_for_type(hint)
    value = data.draw(values_for(schema))
    check_arguments(schema, value)
    # and the same value as an argument of a tool object
    check_arguments(
        {"type": "object", "properties": {"x": schema}, "required": ["x"]}, {"x": value}
    )


_wrong_for = {
    "integer": st.floats(allow_nan=False).filter(lambda f: not f.is_integer())
    | st.booleans()
    | st.text()
    | st.none(),
    "number": st.booleans() | st.text() | st.none() | st.lists(st.integers(), max_size=2),
    "string": st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False),
    "boolean": st.integers() | st.text() | st.none() | st.floats(allow_nan=False),
}


@settings(max_examples=100)
@given(st.data(), st.sampled_from(sorted(_wrong_for)), st.integers(0, 2))
def test_a_wrong_type_fails_at_its_path(data: st.DataObject, kind: str, depth: int) -> None:
    schema: dict[str, Any] = {"type": kind}
    wrong = data.draw(_wrong_for[kind])
    value: Any = wrong
    path = "$"
    for level in range(depth):  # bury the wrong value in objects and arrays
        if level % 2 == 0:
            schema = {"type": "object", "properties": {"k": schema}, "required": ["k"]}
            value = {"k": value}
        else:
            schema = {"type": "array", "items": schema}
            value = [value]
    expected_path = path + "".join(
        ".k" if lvl % 2 == 0 else "[0]" for lvl in reversed(range(depth))
    )
    with pytest.raises(SchemaError) as caught:
        check_arguments(schema, value)
    assert caught.value.path == expected_path
    assert caught.value.problem.startswith(f"expected {kind}, got ")


@given(st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=50)
def test_integer_accepts_exactly_the_integral_floats(number: float) -> None:
    if number.is_integer():
        check_arguments({"type": "integer"}, number)
    else:
        with pytest.raises(SchemaError):
            check_arguments({"type": "integer"}, number)


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        (schema_for_type(Level), True),  # true is not 1 in JSON
        (schema_for_type(Literal[0, "a"]), False),
        ({"const": 1}, True),
        ({"enum": [[1, 0]]}, [True, False]),
        ({"enum": [True]}, 1),
    ],
)
def test_enum_and_const_tell_booleans_from_numbers(schema: dict[str, Any], value: Any) -> None:
    with pytest.raises(SchemaError):
        check_arguments(schema, value)


def test_enum_and_const_compare_numbers_by_value() -> None:
    check_arguments(schema_for_type(Level), 1.0)
    check_arguments({"const": 2.0}, 2)
    check_arguments({"enum": [{"a": [1, "x"]}]}, {"a": [1, "x"]})


def test_one_of_means_exactly_one() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"type": "number"}]}
    check_arguments(schema, 1.5)  # a number, not an integer: exactly one
    with pytest.raises(SchemaError, match="matches 2 of the oneOf schemas"):
        check_arguments(schema, 2)
    with pytest.raises(SchemaError, match="matches none of"):
        check_arguments(schema, "two")
