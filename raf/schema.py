"""JSON Schema for tools: derived from type hints, and checked against arguments.

The checker covers the keywords models are given in practice (types,
properties, required, additionalProperties, items, prefixItems, enum,
const, anyOf, oneOf (exactly one), allOf, bounds); keywords it does not know
are accepted, not refused.
"""

from __future__ import annotations

import enum
import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

__all__ = ["SchemaError", "check_arguments", "schema_for_function"]

JsonSchema = dict[str, Any]

_SCALARS: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class SchemaError(ValueError):
    """A value does not fit a schema; ``path`` says where (``$.items[2]``)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def schema_for_function(fn: Callable[..., Any]) -> tuple[JsonSchema, dict[str, str]]:
    """The parameters schema of ``fn`` from its type hints.

    Returns the schema and the description of each parameter found in the
    docstring's ``Args:`` section. A parameter without a usable hint is a
    ``TypeError`` naming the function and the parameter.
    """
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(
            f"tool {fn.__name__}: cannot resolve its type hints ({exc}); the types must be "
            "importable from the function's module (under `from __future__ import "
            "annotations`, a class defined inside a function is not)"
        ) from exc
    documented = _docstring_args(inspect.getdoc(fn) or "")
    properties: dict[str, JsonSchema] = {}
    required: list[str] = []
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(
                f"tool {fn.__name__}: *args and **kwargs cannot be described to a model"
            )
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} is positional-only")
        if name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r} needs a type hint")
        try:
            schema = schema_for_type(hints[name])
        except TypeError as exc:
            raise TypeError(f"tool {fn.__name__}: parameter {name!r}: {exc}") from None
        if name in documented and "description" not in schema:
            schema["description"] = documented[name]
        if parameter.default is parameter.empty:
            required.append(name)
        elif parameter.default is not None or not _allows_null(schema):
            schema["default"] = _json_default(fn, name, parameter.default)
        properties[name] = schema
    result: JsonSchema = {"type": "object", "properties": properties, "required": required}
    result["additionalProperties"] = False
    return result, documented


def schema_for_type(hint: Any) -> JsonSchema:
    """The JSON Schema of one type hint (``TypeError`` when it has none)."""
    origin = get_origin(hint)
    if origin is Annotated:
        inner, *metadata = get_args(hint)
        schema = schema_for_type(inner)
        text = [m for m in metadata if isinstance(m, str)]
        if text:
            schema["description"] = " ".join(text)
        return schema
    if hint is Any:
        return {}
    if hint is type(None) or hint is None:
        return {"type": "null"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [member.value for member in hint]}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is Literal:
        values = list(get_args(hint))
        literal: JsonSchema = {"enum": values}
        kinds = {_SCALARS.get(type(v)) for v in values}
        if len(kinds) == 1 and None not in kinds:
            literal["type"] = kinds.pop()
        return literal
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        return {"anyOf": [schema_for_type(option) for option in options]}
    if hint in (list, tuple, set, frozenset) or origin in (list, set, frozenset, Sequence):
        args = get_args(hint)
        return {"type": "array", "items": schema_for_type(args[0])} if args else {"type": "array"}
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": schema_for_type(args[0])}
        return {
            "type": "array",
            "prefixItems": [schema_for_type(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if hint in (dict, Mapping) or origin in (dict, Mapping):
        args = get_args(hint)
        if args and args[0] is not str:
            raise TypeError(f"JSON objects have string keys, not {args[0]!r}")
        if len(args) == 2:
            return {"type": "object", "additionalProperties": schema_for_type(args[1])}
        return {"type": "object"}
    raise TypeError(f"no JSON Schema for type {hint!r}")


def _allows_null(schema: JsonSchema) -> bool:
    return schema.get("type") == "null" or any(
        option.get("type") == "null" for option in schema.get("anyOf", ())
    )


def _json_default(fn: Callable[..., Any], name: str, value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    if value is None or isinstance(value, (str, int, float, bool, list, dict)):
        return value
    raise TypeError(f"tool {fn.__name__}: default of {name!r} is not JSON: {value!r}")


def _docstring_args(doc: str) -> dict[str, str]:
    """Parameter descriptions from a Google-style ``Args:`` section."""
    found: dict[str, str] = {}
    lines = doc.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() in _ARGS_HEADINGS)
    except StopIteration:
        return found
    indent: int | None = None
    current: str | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            break  # the next section
        if indent is None:
            indent = depth
        head, sep, text = line.strip().partition(":")
        name = head.split("(")[0].strip()
        if depth == indent and sep and name.isidentifier():
            current = name
            found[name] = text.strip()
        elif current is not None:
            found[current] = f"{found[current]} {line.strip()}".strip()
    return found


_ARGS_HEADINGS = frozenset({"Args:", "Arguments:", "Parameters:"})


def description_from_docstring(fn: Callable[..., Any]) -> str:
    """The first paragraph of ``fn``'s docstring, on one line."""
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
}


def check_arguments(schema: Mapping[str, Any], value: Any, path: str = "$") -> None:
    """Raise :class:`SchemaError` if ``value`` does not fit ``schema``."""
    expected = schema.get("type")
    if expected is not None:
        names = [expected] if isinstance(expected, str) else list(expected)
        if not any(_JSON_TYPES.get(name, lambda v: True)(value) for name in names):
            raise SchemaError(path, f"expected {' or '.join(names)}, got {_json_type(value)}")
    if "enum" in schema and not any(_same_json(value, option) for option in schema["enum"]):
        raise SchemaError(path, f"expected one of {schema['enum']!r}, got {value!r}")
    if "const" in schema and not _same_json(value, schema["const"]):
        raise SchemaError(path, f"expected {schema['const']!r}, got {value!r}")
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            problems = []
            matched = 0
            for option in schema[keyword]:
                try:
                    check_arguments(option, value, path)
                except SchemaError as exc:
                    problems.append(exc.problem)
                else:
                    matched += 1
                    if keyword == "anyOf":
                        break
            if not matched:
                raise SchemaError(path, "matches none of: " + "; ".join(problems))
            if matched > 1 and keyword == "oneOf":
                raise SchemaError(path, f"matches {matched} of the oneOf schemas, not exactly one")
    for option in schema.get("allOf", ()):
        check_arguments(option, value, path)
    if isinstance(value, dict):
        _check_object(schema, value, path)
    elif isinstance(value, list):
        _check_array(schema, value, path)
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise SchemaError(path, f"shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            raise SchemaError(path, f"longer than {schema['maxLength']} characters")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaError(path, f"{value} is less than the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaError(path, f"{value} is more than the maximum {schema['maximum']}")


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality: like ``==``, except that ``true`` is not ``1`` nor ``false`` ``0``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_same_json, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[key], b[key]) for key in a)
    return bool(a == b)


def _check_object(schema: Mapping[str, Any], value: dict[str, Any], path: str) -> None:
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise SchemaError(path, f"missing required property {name!r}")
    additional = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in properties:
            check_arguments(properties[name], item, f"{path}.{name}")
        elif additional is False:
            allowed = ", ".join(repr(p) for p in properties) or "none"
            raise SchemaError(path, f"unexpected property {name!r} (allowed: {allowed})")
        elif isinstance(additional, Mapping):
            check_arguments(additional, item, f"{path}.{name}")


def _check_array(schema: Mapping[str, Any], value: list[Any], path: str) -> None:
    if len(value) < schema.get("minItems", 0):
        raise SchemaError(path, f"fewer than {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        raise SchemaError(path, f"more than {schema['maxItems']} items")
    prefix = schema.get("prefixItems", ())
    for index, item in enumerate(value):
        if index < len(prefix):
            check_arguments(prefix[index], item, f"{path}[{index}]")
        elif isinstance(schema.get("items"), Mapping):
            check_arguments(schema["items"], item, f"{path}[{index}]")


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _JSON_TYPES[name](value):
            return name
    return type(value).__name__
