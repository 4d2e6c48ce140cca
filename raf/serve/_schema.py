"""A client's output schema (``response_format``, ``text.format``): checked before the run,
then evaluated off the event loop, in linear-time regular expressions, within a bound.

A served client sends the JSON Schema its answer must fit, and jsonschema
evaluates it against the model's answer: a schema is a program the client
writes. So before the run the schema must be one the server can evaluate
safely, and each refusal is a 400 that names what is wrong:

- a JSON object of at most :data:`MAX_NODES` values, nested at most
  :data:`MAX_DEPTH` deep, valid against its metaschema, whose root is
  ``{"type": "object"}`` (as OpenAI's structured outputs ask);
- every ``$ref`` local (``#/$defs/...``) and resolved, and the schema with
  its ``$ref``s written out at most :data:`MAX_EXPANDED` values (a cycle
  counted once): a few ``$defs`` that each name the next twice are
  2^n checks of one value;
- every ``pattern`` (and ``patternProperties`` key) a regular expression
  RE2 takes: RE2 matches in time linear in the text, where Python's ``re``
  backtracks (``^(a+)+$`` over 45 characters is seconds, each more doubles
  it; even ``[a-z]+@`` is quadratic). A backreference or a lookaround is
  refused. (RE2's ``\\d`` and ``\\w`` are ASCII, as in the ECMA-262 patterns
  JSON Schema names; Python's are Unicode.)

The answer is then checked in a worker thread (never on the event loop), by
a validator whose keyword checks are counted (at most :func:`steps_for` the
answer: a schema that makes one value checked again and again through
``allOf`` and recursion stops there, and the run ends with an
:class:`~raf.errors.OutputValidationError`) and whose ``uniqueItems`` is one pass
over a hash set (jsonschema compares each pair of items that do not sort:
21 s for a 59 KB array of objects). Each error counts a step too, and so does
what one check reads of the schema beyond the answer (``patternProperties``,
``dependentRequired``...); ``enum`` is a hash set's look-up, ``properties``
reads the smaller of the schema's and the answer's keys, and ``multipleOf`` is
exact where floats overflow. An answer's number out of a float's range (``1e400``,
``NaN``) is not JSON here.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any, Final

import re2

from raf._agent.output import OutputSpec, output_name
from raf._agent.tool_problems import path_text
from raf._agent.tools import check_tool_schema
from raf.errors import OutputValidationError, ToolSchemaError
from raf.serve._http import HttpError

__all__: list[str] = []

#: The most values (objects, arrays, strings, numbers...) a client's schema may hold.
MAX_NODES: Final = 20_000
#: How deep a client's schema may nest (objects and arrays).
MAX_DEPTH: Final = 64
#: The most values of the schema with each ``$ref`` written out (a cycle counted once).
MAX_EXPANDED: Final = 100_000
#: The most keyword checks one answer may take: this many, and one more for each two
#: characters of the answer (a check of a legitimate answer takes about one per five);
#: 1 KB of an error's text counts one.
MIN_STEPS: Final = 20_000
# How many $refs one $ref may lead through (each a level of the checks' recursion).
_MAX_REFS: Final = 32
#: The most instructions of RE2's programs for a schema's patterns, together (each
#: compile holds the GIL about a microsecond an instruction; ``^.{0,1000}$`` is 9,002).
MAX_PROGRAM: Final = 100_000
#: Problems told to the model of one answer.
_MAX_PROBLEMS: Final = 20

# Keywords whose value is one subschema, a list of them, or a map of them; the other
# keywords hold data (enum, const, default, examples) or numbers and words.
_ONE: Final = frozenset({
    "additionalProperties", "unevaluatedProperties", "items", "contains", "propertyNames",
    "not", "if", "then", "else", "additionalItems", "unevaluatedItems",
})  # fmt: skip
_MANY: Final = frozenset({"allOf", "anyOf", "oneOf", "prefixItems", "items"})
_MAP: Final = frozenset({
    "properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
    "dependencies",
})  # fmt: skip
# Keywords that would let a schema reach past the document or rebind its base: refused.
_FOREIGN: Final = ("$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor")


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a client's bad pattern is its 400, not a line on stderr
    # RE2 compiles holding the GIL, in time about its program's size: '\\pL{0,400}' was
    # 0.45 s of a frozen event loop, each. 1 MB keeps one compile to milliseconds.
    options.max_mem = 1 << 20
    return options


_RE2_OPTIONS: Final = _options()


def _regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2; ``re2.error`` when RE2 does not take it."""
    return re2.compile(pattern, _RE2_OPTIONS)


def client_output(schema: Mapping[str, Any], name: str, where: str) -> OutputSpec:
    """The output a served run asks for under the client's ``schema`` (JSON, from the body);
    an :class:`HttpError` 400 naming what is wrong with it (see the module's text)."""
    check_size(schema, where)
    try:
        check_tool_schema(name, schema)
    except ToolSchemaError as exc:
        raise HttpError(400, f"{where} is not a valid JSON Schema: {exc.problem:.200}") from None
    if schema.get("type") != "object":
        raise HttpError(
            400, f"{where} must be {{'type': 'object', ...}} at its root (a JSON object)"
        )
    walk = _Walk(schema, where)
    try:
        walk.schema(schema, ())
    except RecursionError:  # 32 $refs, each to a subschema 64 deep
        raise HttpError(400, f"{where} is nested too deeply, with its $refs followed") from None
    if walk.unevaluated and walk.patterned:
        raise HttpError(
            400, f"{where}: unevaluatedProperties beside patternProperties is not served"
        )
    title = schema.get("title")
    spec_name = output_name(title if isinstance(title, str) and title else name)
    adapter = _SchemaAdapter(schema, walk.regexes)
    return OutputSpec(dict, schema, spec_name, False, adapter, in_thread=True)


def check_size(schema: object, where: str) -> None:
    """400 past :data:`MAX_NODES` values or :data:`MAX_DEPTH` levels; without recursion, so
    a body nested 10,000 deep is refused here and not by a ``RecursionError``."""
    count = 0
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise HttpError(400, f"{where} is too large: over {MAX_NODES} values")
        if depth > MAX_DEPTH:
            raise HttpError(400, f"{where} is nested too deeply: over {MAX_DEPTH} levels")
        if isinstance(node, dict):
            stack.extend((value, depth + 1) for value in node.values())
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)


class _Walk:
    """One pass over a client's schema: its ``$ref``s and patterns checked, its size with
    each ``$ref`` written out counted."""

    def __init__(self, root: Mapping[str, Any], where: str) -> None:
        self.root = root
        self.where = where
        self.sizes: dict[str, int] = {}  # a $ref's target: its size written out
        self.active: set[str] = set()  # the $refs being written out (a cycle stops there)
        self.unevaluated = False
        self.patterned = False
        self.regexes: dict[str, Any] = {}  # each pattern, compiled once (the checks use them)
        self.program = 0  # the size of their programs

    def fail(self, path: tuple[str | int, ...], problem: str) -> HttpError:
        at = path_text(path)
        at = at if len(at) <= 200 else at[:200] + "..."
        return HttpError(400, f"{self.where}{' at ' + at if at else ''}: {problem}")

    def schema(self, node: Any, path: tuple[str | int, ...]) -> int:
        """The size of ``node`` (a subschema) with its ``$ref``s written out."""
        if not isinstance(node, dict):
            return 1
        size = 1 + sum(_size(value) for key, value in node.items() if not _holds_schemas(key))
        if path and "$id" in node:
            raise self.fail(path, "a $id below the root is not served (a $ref must be local)")
        for key in _FOREIGN:
            if key in node:
                raise self.fail(path, f"{key} is not served (use $ref and $defs)")
        self.unevaluated |= "unevaluatedProperties" in node
        if isinstance(node.get("pattern"), str):
            self.pattern(node["pattern"], (*path, "pattern"))
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict):
            self.patterned |= bool(patterns)
            for pattern in patterns:
                self.pattern(pattern, (*path, "patternProperties", pattern))
        for key, value in node.items():
            if key in _ONE and isinstance(value, dict):
                size += self.schema(value, (*path, key))
            elif key in _MANY and isinstance(value, list):
                size += sum(self.schema(item, (*path, key, i)) for i, item in enumerate(value))
            elif key in _MAP and isinstance(value, dict):
                size += sum(self.schema(sub, (*path, key, name)) for name, sub in value.items())
            elif key in _MAP or key in _ONE or key in _MANY:
                size += _size(value)
        ref = node.get("$ref")
        if isinstance(ref, str):
            size += self.ref(ref, (*path, "$ref"))
        if size > MAX_EXPANDED:
            raise self.fail(path, f"with its $refs written out it is over {MAX_EXPANDED} values")
        return size

    def ref(self, ref: str, path: tuple[str | int, ...]) -> int:
        if not ref.startswith("#"):
            raise self.fail(path, f"the $ref {ref!r:.80} is not local ('#/$defs/...')")
        if ref in self.active:
            return 1  # a cycle: evaluated only as deep as the answer goes (and counted)
        if ref in self.sizes:
            return self.sizes[ref]
        target = _pointer(self.root, ref[1:])
        if target is None:
            raise self.fail(path, f"the $ref {ref!r:.80} resolves to nothing in the schema")
        if len(self.active) >= _MAX_REFS:
            raise self.fail(path, f"its $refs lead through over {_MAX_REFS} others")
        self.active.add(ref)
        try:
            size = self.schema(target, path)
        finally:
            self.active.discard(ref)
        self.sizes[ref] = size
        return size

    def pattern(self, pattern: str, path: tuple[str | int, ...]) -> None:
        if pattern in self.regexes:
            return
        try:
            self.regexes[pattern] = regex = _regex(pattern)
        except re2.error as exc:
            said = exc.args[0] if exc.args else ""
            reason = said.decode(errors="replace") if isinstance(said, bytes) else str(said)
            raise self.fail(
                path,
                f"the pattern {pattern!r:.80} cannot be checked safely here ({reason:.80}; "
                "patterns are matched by RE2: no backreferences or lookarounds)",
            ) from None
        self.program += regex.programsize
        if self.program > MAX_PROGRAM:
            raise self.fail(
                path, f"its patterns are too large to compile: over {MAX_PROGRAM} instructions"
            )


def _holds_schemas(key: str) -> bool:
    return key in _ONE or key in _MANY or key in _MAP


def _size(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + sum(_size(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(_size(item) for item in value)
    return 1


def _pointer(root: Any, pointer: str) -> Any:
    """What the JSON pointer ``pointer`` (``/$defs/A``, ``""`` the root) names, or ``None``."""
    node = root
    if not pointer:
        return node
    if not pointer.startswith("/"):
        return None  # a plain-name anchor ('#foo'): not served
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, (dict, bool)) else None


# -- the evaluation ----------------------------------------------------------------------


class _OverBudget(Exception):
    """The answer took more keyword checks than its :func:`steps_for`."""


def steps_for(text: str) -> int:
    """How many keyword checks an answer of ``text`` may take."""
    return MIN_STEPS + len(text) // 2


class _Budget:
    def __init__(self) -> None:
        self.left = MIN_STEPS

    def spend(self, steps: int = 1) -> None:
        self.left -= steps
        if self.left < 0:
            raise _OverBudget


class _SchemaAdapter:
    """``validate_json(text)`` as pydantic's ``TypeAdapter`` has it, by the safe validator.

    Built on the event loop; its validator is built at its first check (in the
    worker thread). One check at a time: the budget is the check's own.
    """

    def __init__(self, schema: Mapping[str, Any], regexes: Mapping[str, Any]) -> None:
        self.schema = schema
        self.regexes = regexes
        self.budget = _Budget()
        self.lock = threading.Lock()
        self.validator: Any = None

    def validate_json(self, text: str) -> dict[str, Any]:
        import pydantic

        try:
            value = json.loads(text, parse_constant=_not_json, parse_float=_finite)
        except RecursionError:
            raise _invalid(pydantic, [((), "the answer is nested too deeply")]) from None
        except ValueError as exc:
            raise _invalid(pydantic, [((), f"Invalid JSON: {exc}")]) from None
        if not isinstance(value, dict):
            raise _invalid(pydantic, [((), "the answer must be a JSON object")])
        with self.lock:
            self.budget.left = steps = steps_for(text)
            if self.validator is None:
                self.validator = _validator(self.schema, self.budget, self.regexes)
            try:
                errors = list(itertools.islice(self.validator.iter_errors(value), _MAX_PROBLEMS))
            except RecursionError:
                errors = None
                found = [((), "the answer is nested too deeply to check")]
            except _OverBudget:
                # Not the model's to mend: asking again would cost as much. The run ends.
                problem = f"checking it against the schema takes over {steps} steps"
                raise OutputValidationError(text, (problem,), 1) from None
        if errors is not None:
            found = [(tuple(error.absolute_path), error.message) for error in errors]
        if found:
            raise _invalid(pydantic, found)
        return value


def _invalid(pydantic: Any, found: Iterable[tuple[tuple[Any, ...], str]]) -> Exception:
    from pydantic_core import PydanticCustomError

    line_errors = [
        {
            "type": PydanticCustomError("json_schema", "{problem}", {"problem": message[:2000]}),
            "loc": path,
            "input": None,
        }
        for path, message in found
    ]
    error: Exception = pydantic.ValidationError.from_exception_data("output", line_errors)
    return error


def _validator(schema: Mapping[str, Any], budget: _Budget, regexes: Mapping[str, Any]) -> Any:
    """A jsonschema validator of ``schema`` whose every keyword check is counted against
    ``budget``, whose patterns are RE2's and whose ``uniqueItems`` is linear."""
    import jsonschema
    import referencing

    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    keywords: dict[str, Callable[..., Any]] = dict(base.VALIDATORS)
    keywords.update(
        pattern=functools.partial(_pattern, regexes),
        patternProperties=_charged(
            functools.partial(_pattern_properties, regexes), budget, _patterns_by_keys
        ),
        additionalProperties=_charged(
            functools.partial(_additional_properties, regexes), budget, _extras_by_patterns
        ),
        uniqueItems=_unique_items,
        properties=_properties,
        enum=_Enum().check,
        multipleOf=_multiple_of,
    )
    for name in ("dependentRequired", "dependentSchemas", "dependencies"):
        if name in keywords:  # each of their checks reads the whole map of the schema's
            keywords[name] = _charged(keywords[name], budget, _keys_width)
    for name in ("allOf", "oneOf"):  # each subschema, even {} (which counts no keyword)
        keywords[name] = _charged(keywords[name], budget, _width)
    counted = {name: _counted(check, budget) for name, check in keywords.items()}
    cls = jsonschema.validators.extend(base, counted)  # type: ignore[no-untyped-call]
    # An empty registry: a $ref never reaches the network (each was checked to be local).
    return cls(schema, registry=referencing.Registry())


def _counted(check: Callable[..., Any], budget: _Budget) -> Callable[..., Iterator[Any]]:
    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        budget.spend()
        for error in check(validator, value, instance, schema) or ():
            # Each error counts (anyOf keeps every error of each branch: a `required` of
            # 9,000 names under anyOf was 9,000 errors an object, uncounted), and a long
            # message (it quotes the instance) counts one more a KB.
            budget.spend(1 + len(error.message) // 1024)
            yield error

    return keyword


def _charged(
    check: Callable[..., Any], budget: _Budget, cost: Callable[[Any, Any, Any], int]
) -> Callable[..., Iterator[Any]]:
    """``check``, counting ``cost(value, instance, schema)`` more steps: what one check
    reads of the schema beyond the answer's size (a schema holds 20,000 values)."""

    def keyword(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        budget.spend(cost(value, instance, schema))
        yield from check(validator, value, instance, schema) or ()

    return keyword


def _width(value: Any, instance: Any, schema: Any) -> int:
    return len(value) if isinstance(value, (dict, list)) else 0


def _keys_width(value: Any, instance: Any, schema: Any) -> int:
    return _width(value, instance, schema) if isinstance(instance, dict) else 0


def _patterns_by_keys(patterns: Any, instance: Any, schema: Any) -> int:
    if not isinstance(patterns, dict) or not isinstance(instance, dict):
        return 0
    return len(patterns) * len(instance)


def _extras_by_patterns(additional: Any, instance: Any, schema: Any) -> int:
    return _patterns_by_keys(schema.get("patternProperties", {}), instance, schema)


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; ``1e400`` is no number JSON Schema can
    compare (jsonschema's ``multipleOf`` raised on its ``inf``: a 500)."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"the number {text:.40} is out of range")
    return number


def _properties(
    validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    """jsonschema's ``properties``, over the smaller of the schema's and the answer's keys:
    a schema of 9,000 properties was 9,000 look-ups for each small object of the answer."""
    if not validator.is_type(instance, "object"):
        return
    keys = [key for key in instance if key in properties]
    if len(properties) < len(instance):
        keys = [key for key in properties if key in instance]
    for key in keys:
        yield from validator.descend(instance[key], properties[key], path=key, schema_path=key)


class _Enum:
    """jsonschema's ``enum`` by a hash set of each list's values (built at its first check):
    one look-up where jsonschema compared the value with each of the list's (an enum of
    9,000 one-item arrays over 200 items: 14 s)."""

    def __init__(self) -> None:
        # The schema's lists by id(): the validator's own, and the schema outlives it.
        self.sets: dict[int, tuple[Any, frozenset[Any]]] = {}

    def check(self, validator: Any, enums: Any, instance: Any, schema: Any) -> Iterator[Any]:
        from jsonschema import ValidationError

        known = self.sets.get(id(enums))
        if known is None or known[0] is not enums:
            known = self.sets[id(enums)] = (enums, frozenset(_hashable(each) for each in enums))
        if _hashable(instance) not in known[1]:
            yield ValidationError(f"{instance!r:.200} is not one of {enums!r:.200}")


def _multiple_of(validator: Any, factor: Any, instance: Any, schema: Any) -> Iterator[Any]:
    """jsonschema's ``multipleOf``, exact (a fraction) where floats overflow: jsonschema
    divided a 4,000-digit integer by ``0.5`` into an ``OverflowError`` (a 500)."""
    from jsonschema import ValidationError

    if not validator.is_type(instance, "number"):
        return
    if isinstance(factor, float) or isinstance(instance, float):
        try:
            quotient = instance / factor
            failed = int(quotient) != quotient
        except (OverflowError, ValueError):
            failed = (Fraction(instance) / Fraction(factor)).denominator != 1
    else:
        failed = bool(instance % factor)
    if failed:
        yield ValidationError(f"{instance!r:.200} is not a multiple of {factor}")


def _compiled(regexes: Mapping[str, Any], pattern: str) -> Any:
    """``pattern`` as the schema's check compiled it (each a pattern of the schema)."""
    regex = regexes.get(pattern)
    return _regex(pattern) if regex is None else regex


def _pattern(
    regexes: Mapping[str, Any], validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[Any]:
    from jsonschema import ValidationError

    if validator.is_type(instance, "string") and not _compiled(regexes, pattern).search(instance):
        yield ValidationError(f"{instance!r:.200} does not match {pattern!r:.200}")


def _pattern_properties(
    regexes: Mapping[str, Any],
    validator: Any,
    patterns: Mapping[str, Any],
    instance: Any,
    schema: Any,
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _compiled(regexes, pattern)
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    regexes: Mapping[str, Any],
    validator: Any,
    additional: Any,
    instance: Any,
    schema: Mapping[str, Any],
) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    found = [_compiled(regexes, pattern) for pattern in schema.get("patternProperties", {})]
    extras = [
        key
        for key in instance
        if key not in properties and not any(regex.search(key) for regex in found)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        named = ", ".join(f"{extra!r:.60}" for extra in sorted(extras)[:5])
        more = f" and {len(extras) - 5} more" if len(extras) > 5 else ""
        yield ValidationError(f"Additional properties are not allowed ({named}{more})")


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema import ValidationError

    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for index, item in enumerate(instance):
        key = _hashable(item)
        if key in seen:
            yield ValidationError(f"has non-unique elements (item {index} repeats an earlier one)")
            return
        seen.add(key)


def _hashable(value: Any) -> Any:
    """``value`` (JSON) as a hashable key equal for values JSON Schema calls equal:
    ``1`` and ``1.0`` alike, ``true`` and ``1`` not, an object's keys in any order."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("l", tuple(_hashable(item) for item in value))
    if isinstance(value, dict):
        return ("d", frozenset((key, _hashable(item)) for key, item in value.items()))
    return ("z", None)
