"""@tool's side of pydantic: the model of a function's parameters, the JSON Schema shown
to the model, and the validation and coercion of each call's arguments.

Imported when a function is made a tool, not with raf: `import raf` loads no pydantic.
"""

from __future__ import annotations

import inspect
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Annotated, Any, get_args, get_origin

import attrs
import pydantic
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema

from raf._agent.tool_problems import problems
from raf.errors import ToolArgumentsError

__all__: list[str] = []


@attrs.frozen(slots=True)
class Signature:
    """How a function's arguments are validated: a pydantic model built once, at decoration."""

    model: type[pydantic.BaseModel]
    #: (model field, parameter name) of each parameter, in order
    fields: tuple[tuple[str, str], ...]

    def bind(self, tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments of the call, validated and coerced (ToolArgumentsError)."""
        try:
            parsed = self.model.model_validate(arguments)
        except pydantic.ValidationError as exc:
            raise ToolArgumentsError(
                tool, problems((error["loc"], error["msg"]) for error in exc.errors())
            ) from None
        given = parsed.model_fields_set
        # Only what the model sent: a missing argument takes the function's own
        # default (the very object, not pydantic's copy of it).
        return {name: getattr(parsed, field) for field, name in self.fields if field in given}


# -- @tool: a pydantic model from the signature ----------------------------------------


class _ToolJsonSchema(GenerateJsonSchema):
    """pydantic's JSON Schema without the titles it derives from names (noise to a model)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        result = super().generate(schema, mode)
        result.pop("title", None)
        return result


_CONFIG = pydantic.ConfigDict(extra="forbid")


def describe(fn: Callable[..., Any]) -> tuple[Signature, dict[str, Any]]:
    """The pydantic model of ``fn``'s parameters, and the JSON Schema made from it."""
    where = f"tool {fn.__name__}"
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(
            f"{where}: cannot resolve its type hints ({exc}); the types must be "
            "importable from the function's module (under `from __future__ import "
            "annotations`, a class defined inside a function is not)"
        ) from exc
    documented = _docstring_args(inspect.getdoc(fn) or "")
    definitions: dict[str, Any] = {}
    fields: list[tuple[str, str]] = []
    for index, (name, parameter) in enumerate(inspect.signature(fn).parameters.items()):
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{where}: *args and **kwargs cannot be described to a model")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where}: parameter {name!r} is positional-only")
        if name not in hints:
            raise TypeError(f"{where}: parameter {name!r} needs a type hint")
        if isinstance(parameter.default, FieldInfo):
            raise TypeError(
                f"{where}: parameter {name!r}: write `{name}: Annotated[T, Field(...)] = default`, "
                "not `= Field(...)`, so that the function keeps a usable default"
            )
        # Field names of our own, the parameter's name as the alias: a parameter
        # may be called `json`, `model_config` or `_x` without clashing with
        # BaseModel's namespace.
        field = f"p{index}"
        hint = hints[name]
        default = ... if parameter.default is parameter.empty else parameter.default
        described = _description(hint, documented.get(name))
        # description=None would count as set and hide a Field(description=...) in the hint
        info = (
            pydantic.Field(default, alias=name)
            if described is None
            else pydantic.Field(default, alias=name, description=described)
        )
        definitions[field] = (hint, info)
        fields.append((field, name))
    try:
        with warnings.catch_warnings():
            # pydantic warns and leaves a default that is not JSON out of the
            # schema: refuse it where the mistake is made instead.
            warnings.simplefilter("error", pydantic.json_schema.PydanticJsonSchemaWarning)
            model = pydantic.create_model(
                f"{fn.__name__}_arguments", __config__=_CONFIG, **definitions
            )
            schema = model.model_json_schema(schema_generator=_ToolJsonSchema)
    except _PYDANTIC_REFUSALS:
        raise _refusal(where, definitions, fields) from None
    schema.setdefault("required", [])  # some APIs want the list even when empty
    return Signature(model, tuple(fields)), schema


def _description(hint: Any, documented: str | None) -> str | None:
    """A parameter's description: ``Annotated[T, "text"]``, else the docstring's ``Args:``.

    pydantic ignores plain strings in ``Annotated``; a ``Field(description=...)``
    there wins over both, and pydantic applies it itself.
    """
    metadata = get_args(hint)[1:] if get_origin(hint) is Annotated else ()
    if any(isinstance(m, FieldInfo) and m.description is not None for m in metadata):
        return None
    text = [m for m in metadata if isinstance(m, str)]
    return " ".join(text) if text else documented


_PYDANTIC_REFUSALS = (
    pydantic.PydanticUserError,
    pydantic.PydanticUndefinedAnnotation,
    pydantic.json_schema.PydanticJsonSchemaWarning,
)


def _refusal(where: str, definitions: dict[str, Any], fields: list[tuple[str, str]]) -> TypeError:
    """Why pydantic refused the signature, naming the first parameter it refuses alone."""
    for field, name in fields:
        hint, info = definitions[field]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", pydantic.json_schema.PydanticJsonSchemaWarning)
                pydantic.create_model("probe", **{field: definitions[field]}).model_json_schema()
        except pydantic.json_schema.PydanticJsonSchemaWarning:
            return TypeError(
                f"{where}: parameter {name!r}: its default {info.default!r} is not JSON"
            )
        except _PYDANTIC_REFUSALS as exc:
            # pydantic's first sentence; the rest is advice for model authors
            reason = str(exc).strip().splitlines()[0].split(". ")[0].rstrip(".")
            return TypeError(f"{where}: parameter {name!r}: {reason} (type {hint!r})")
    return TypeError(f"{where}: pydantic cannot describe its parameters")


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
