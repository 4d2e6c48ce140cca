"""JSON Schema validators whose patterns RE2 matches: linear time, whatever the arguments.

A tool's arguments are written by the model, and a prompt injection can steer
them at a schema's ``pattern``: Python's ``re`` backtracks (``^(a+)+$`` against
forty ``a`` and a ``!`` takes 2^40 steps, holding the GIL, so no thread or
deadline stops it). Here ``pattern``, ``patternProperties`` and the
``additionalProperties`` that depends on them match with RE2 (as
:mod:`raf._middleware.tool_output_read` does), and :func:`check_patterns` refuses,
when the schema is built, a pattern RE2 cannot match (a backreference, a
lookaround) and the one keyword whose matching jsonschema keeps to itself
(``unevaluatedProperties`` beside ``patternProperties``). Imported when a tool's
schema is first checked (as jsonschema is), not with raf.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any, Final

import jsonschema
import re2

__all__: list[str] = []

#: Keywords whose values are data, not schemas: a "pattern" inside them is not one.
_DATA: Final = frozenset({"const", "enum", "default", "examples"})


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a bad pattern is the schema's error, not a line on stderr
    # RE2 compiles in time about its program's size, holding the GIL: 1 MB keeps one
    # compile to milliseconds.
    options.max_mem = 1 << 20
    return options


_RE2_OPTIONS: Final = _options()


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (kept: a schema's patterns are matched again and again);
    ``re2.error`` when RE2 cannot match it."""
    return re2.compile(pattern, _RE2_OPTIONS)


def check_patterns(schema: Any) -> str | None:
    """What keeps ``schema``'s patterns from being matched in linear time (and where), or
    ``None``."""
    for path, node in _schemas(schema):
        at = f"at {'.'.join(path)}: " if path else ""
        found = node.get("pattern")
        named = node.get("patternProperties")
        patterns = [("pattern", found)] if isinstance(found, str) else []
        if isinstance(named, Mapping):
            patterns += [(f"patternProperties.{key}", key) for key in named if isinstance(key, str)]
            if named and "unevaluatedProperties" in node:
                return (
                    f"{at}unevaluatedProperties beside patternProperties cannot be checked in "
                    "linear time; write additionalProperties"
                )
        for where, pattern in patterns:
            try:
                compiled(pattern)
            except re2.error as exc:
                return (
                    f"at {'.'.join((*path, where))}: the pattern {pattern!r:.80} cannot be "
                    f"checked safely: RE2 cannot match it ({exc}); patterns are matched in "
                    "linear time, without backreferences or lookarounds"
                )
    return None


def _schemas(node: Any) -> Iterator[tuple[tuple[str, ...], Mapping[str, Any]]]:
    """Every object of ``node`` that may be a schema, with its path (data keywords' values
    left out)."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), node)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, Mapping):
            yield path, item
            stack += [((*path, str(k)), v) for k, v in item.items() if k not in _DATA]
        elif isinstance(item, list):
            stack += [((*path, str(n)), v) for n, v in enumerate(item)]


def _search(pattern: str, text: str) -> bool:
    return compiled(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in named and not any(_search(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        # jsonschema's own words (its additionalProperties, with re.search in place of RE2).
        if "patternProperties" in schema:
            verb = "does" if len(extras) == 1 else "do"
            listed = ", ".join(repr(extra) for extra in sorted(extras))
            shown = ", ".join(repr(pattern) for pattern in sorted(patterns))
            error = f"{listed} {verb} not match any of the regexes: {shown}"
        else:
            were = "was" if len(extras) == 1 else "were"
            listed = ", ".join(repr(extra) for extra in sorted(extras, key=str))
            error = f"Additional properties are not allowed ({listed} {were} unexpected)"
        yield jsonschema.ValidationError(error)


@functools.cache
def linear(cls: Any) -> Any:
    """``cls`` (a jsonschema validator class) with its patterns matched by RE2."""
    return jsonschema.validators.extend(  # type: ignore[no-untyped-call]
        cls,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )
