"""An output schema made strict-compatible for OpenAI's structured outputs (every property
required, no extra properties), and the request fields of the two OpenAI APIs that ask for it.

OpenAI's strict mode (``"strict": true``) guarantees the answer matches the schema,
but accepts only a subset of JSON Schema: every object lists all its properties in
``required`` and says ``additionalProperties: false``, and no ``default``. So an
optional property (one with a default) becomes *required but nullable*: the model
always writes it, ``null`` when it has no value, and raf's validation reads a
``null`` for a property whose type does not allow one as "use the default" (see
``raf._agent.output``). A mapping with free keys (``dict[str, int]``) cannot be written
this way at all: it is refused before the request is sent.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from raf.errors import BadRequestError

__all__: list[str] = []

# Keywords strict mode refuses that only constrain or annotate: left out.
_DROPPED: Final = frozenset({"default", "discriminator"})
# Keywords whose value maps names to schemas (not a schema itself).
_SCHEMA_MAPS: Final = frozenset({"properties", "$defs", "definitions"})
_NOT_NAME: Final = re.compile(r"[^a-zA-Z0-9_-]+")


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` made strict-compatible, recursively (``$defs`` too); a new dict.

    >>> strict_schema({"type": "object", "properties": {"a": {"type": "integer",
    ...     "default": 1}}})
    {'type': 'object', 'properties': {'a': {'anyOf': [{'type': 'integer'}, {'type': 'null'}]}}, \
'additionalProperties': False, 'required': ['a']}
    """
    # One run's many calls, and every run of one output type, send one schema: its strict
    # form is made once, kept by the schema's JSON text (shared: the callers only send it).
    return _strict_of(json.dumps(schema, default=_as_dict))


@functools.lru_cache(maxsize=256)
def _strict_of(text: str) -> dict[str, Any]:
    strict: dict[str, Any] = _strict(json.loads(text), "#")
    return strict


def _as_dict(value: object) -> Any:
    if isinstance(value, Mapping):  # a read-only mapping in a schema built in code
        return dict(value)
    raise TypeError(f"an output schema holds a {type(value).__name__}, not JSON: {value!r:.60}")


def _strict(node: Any, path: str) -> Any:
    if isinstance(node, list):
        return [_strict(item, f"{path}/{n}") for n, item in enumerate(node)]
    if not isinstance(node, Mapping):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _strict(sub, f"{path}/{key}/{name}") for name, sub in value.items()}
        else:
            # oneOf (a discriminated union) is anyOf to strict mode.
            out["anyOf" if key == "oneOf" else key] = _strict(value, f"{path}/{key}")
    if out.get("type") == "object" or "properties" in out:
        additional = out.get("additionalProperties")
        if isinstance(additional, Mapping) or ("properties" not in out and additional is not False):
            raise BadRequestError(
                f"the output schema cannot be made strict at {path}: an object with free "
                "keys (a dict[str, ...]) cannot be asked for in OpenAI's strict mode; "
                "use a model with named fields, or a list of key/value objects"
            )
        properties: dict[str, Any] = out.get("properties", {})
        required = set(node.get("required", ()))
        for name, sub in properties.items():
            if name not in required:
                properties[name] = _nullable(sub)
        out["additionalProperties"] = False
        out["required"] = list(properties)
    return out


def accepts_null(schema: Any) -> bool:
    """Whether ``schema`` (not following ``$ref``) allows ``null``."""
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(accepts_null(option) for option in schema.get("anyOf", ()))


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if accepts_null(schema):
        return schema
    if set(schema) == {"anyOf"}:
        return {"anyOf": [*schema["anyOf"], {"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def schema_name(schema: Mapping[str, Any]) -> str:
    """The ``name`` OpenAI wants for a schema: its title, in the letters it allows."""
    title = schema.get("title")
    name = _NOT_NAME.sub("_", title).strip("_")[:64] if isinstance(title, str) else ""
    return name or "output"


def response_format(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Chat completions' ``response_format`` asking for ``schema``, strict."""
    return {
        "type": "json_schema",
        "json_schema": {
            "name": schema_name(schema),
            "schema": strict_schema(schema),
            "strict": True,
        },
    }


def text_format(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API's ``text.format`` asking for ``schema``, strict."""
    return {
        "type": "json_schema",
        "name": schema_name(schema),
        "schema": strict_schema(schema),
        "strict": True,
    }
