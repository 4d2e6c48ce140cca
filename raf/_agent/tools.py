"""Tools a model can call: the Tool protocol, the @tool decorator, and argument checks.

``@tool`` functions are described and checked by pydantic, from their
signature (see :mod:`raf._agent.tool_signature`): the JSON Schema, then validation
and coercion of each call's arguments into the declared types. Any other
tool (hand-made, MCP) is checked against its own ``parameters`` with
``jsonschema``. Both are imported when first needed, not with raf.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, cast, overload

import attrs

from raf._agent.tool_problems import path_text, problems
from raf._values.protocols import Tool
from raf.errors import ToolArgumentsError, ToolSchemaError

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

    from raf._agent.tool_signature import Signature

__all__ = ["FunctionTool", "Tool", "check_tool_arguments", "check_tool_schema", "tool"]


@attrs.frozen(slots=True)
class FunctionTool:
    """A :class:`Tool` made from a Python function, usually by :func:`tool`.

    A ``FunctionTool`` made by ``@tool`` validates and coerces its arguments
    with pydantic from the function's signature. One built by hand with its
    own ``parameters`` has that schema checked here (a
    :class:`~raf.errors.ToolSchemaError` when it is not a valid JSON Schema) and
    its arguments checked against it, as any other tool.
    """

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: Mapping[str, Any]
    in_thread: bool = False
    #: ``True``, or ``callable(call: ToolCall) -> bool`` asked per call: whether a person
    #: must approve a call before it runs (see ``docs/approvals.md``).
    approval: bool | Callable[[Any], bool] = attrs.field(default=False, kw_only=True)
    _signature: Signature | None = attrs.field(
        default=None, kw_only=True, repr=False, eq=False, alias="_signature"
    )
    #: The jsonschema validator of ``parameters``, built with the tool (``None`` for a
    #: ``@tool`` function, which pydantic checks).
    schema_validator: Validator | None = attrs.field(init=False, default=None, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if self._signature is None:
            # A malformed schema is refused now, not at the first call. attrs' way to set a
            # field of a frozen class in its own __attrs_post_init__:
            object.__setattr__(
                self, "schema_validator", build_validator(self.name, self.parameters)
            )

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Check ``arguments``, then call the function with them as keyword arguments.

        Arguments that do not fit raise :class:`~raf.errors.ToolArgumentsError`
        before the function is called.
        """
        if self._signature is not None:
            kwargs = self._signature.bind(self.name, arguments)
        else:
            check_tool_arguments(self, arguments)
            kwargs = dict(arguments)
        if self.in_thread:
            # raf cannot stop a thread, but it stops waiting for it when the call is
            # cancelled (a deadline, the tool stack's timeout): the thread runs on, and its
            # late result or error goes nowhere (nothing holds it once the await raised).
            from anyio.to_thread import run_sync  # here: `import raf` need not load it

            return await run_sync(lambda: self.fn(**kwargs), abandon_on_cancel=True)
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = False,
    approval: bool | Callable[[Any], bool] = False,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = False,
    approval: bool | Callable[[Any], bool] = False,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a :class:`Tool` from a sync or async function.

    Each parameter's type hint is read by pydantic: it gives the JSON Schema
    shown to the model, and each call's arguments are validated and coerced
    into the declared types before the function runs (``int``, ``float``,
    ``str``, ``bool``, ``list``, ``set``, ``tuple``, ``dict``, ``Literal``,
    enums, ``TypedDict``, dataclasses, pydantic models, ``Optional``,
    ``Annotated[int, Field(ge=1)]``, ...). Defaults make a parameter
    optional; ``Annotated[T, "text"]``, ``Field(description=...)`` or a
    Google-style ``Args:`` section describe it. The description is the
    docstring's first paragraph. A blocking sync function should say
    ``in_thread=True`` so it runs in a worker thread. ``approval=True`` makes
    every call wait for a person's decision, ``approval=callable`` (given the
    :class:`raf.ToolCall`, returning a bool) decides per call (see
    ``docs/approvals.md``).

    >>> @tool
    ... def add(a: int, b: int = 1) -> int:
    ...     '''Add two numbers.'''
    ...     return a + b
    >>> add.name, add.parameters["required"]
    ('add', ['a'])
    """

    if not (approval is True or approval is False or callable(approval)):
        raise TypeError(f"@tool(approval=...) takes a bool or a callable(call), got {approval!r}")

    def make(function: Callable[..., Any]) -> FunctionTool:
        if not callable(function):
            raise TypeError(f"@tool needs a function, got {function!r}")
        if in_thread and inspect.iscoroutinefunction(function):
            raise TypeError(
                f"@tool(in_thread=True) is for blocking sync functions; "
                f"{function.__name__} is async and runs on the event loop already"
            )
        signature, parameters = _describe(function)
        text = description if description is not None else _docstring_summary(function)
        return FunctionTool(
            function,
            name or function.__name__,
            text,
            parameters,
            in_thread,
            approval=approval,
            _signature=signature,
        )

    return make if fn is None else make(fn)


def _describe(function: Callable[..., Any]) -> tuple[Any, dict[str, Any]]:
    # Local: the signature is read with pydantic, imported when the first tool is made, so
    # `import raf` does not import pydantic.
    from raf._agent.tool_signature import describe

    return describe(function)


def _docstring_summary(fn: Callable[..., Any]) -> str:
    """The first paragraph of ``fn``'s docstring, on one line."""
    doc = inspect.getdoc(fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


# -- any other tool: jsonschema against its parameters ---------------------------------


def check_tool_schema(name: str, schema: object) -> None:
    """Raise :class:`~raf.errors.ToolSchemaError` unless ``schema`` is a valid JSON Schema.

    ``name`` is the tool's, for the message. The schema must be JSON (a
    mapping of strings, numbers, booleans, ``None``, lists and mappings) and
    valid against the metaschema of its ``$schema`` (draft 2020-12 when it
    names none or one that jsonschema does not know). Call it where tools
    come from elsewhere (an MCP server's listing, an API description), so a
    bad one is refused where it is found.

    >>> from raf.errors import ToolSchemaError
    >>> try:
    ...     check_tool_schema("search", {"type": "object", "properties": []})
    ... except ToolSchemaError as exc:
    ...     print(exc)
    tool 'search' has an invalid parameters schema: at properties: [] is not of type 'object'
    """
    build_validator(name, schema)


def check_tool_arguments(tool: Tool, arguments: Mapping[str, Any]) -> None:
    """Check ``arguments`` against ``tool.parameters`` with jsonschema.

    Raises :class:`~raf.errors.ToolArgumentsError` naming each misfit with its
    path, or :class:`~raf.errors.ToolSchemaError` when the schema itself is not
    valid. The validator is built once per schema and kept (a
    :class:`FunctionTool` holds its own). This checks, it does not coerce: a ``@tool`` function
    gets coercion from its own signature instead.
    """
    import referencing.exceptions

    validator = _validator(tool)
    try:
        # a bound on the errors collected: 100,000 wrong items need not make 100,000 messages
        errors = list(itertools.islice(validator.iter_errors(arguments), _MAX_ERRORS + 1))
    except RecursionError:
        raise ToolArgumentsError(tool.name, ("the arguments are nested too deeply",)) from None
    except referencing.exceptions.Unresolvable as exc:
        raise ToolSchemaError(tool.name, f"a $ref cannot be resolved: {exc}") from None
    if errors:
        more = len(errors) > _MAX_ERRORS
        errors = sorted(errors[:_MAX_ERRORS], key=lambda error: _path_order(error.absolute_path))
        found = ((error.absolute_path, error.message) for error in errors)
        raise ToolArgumentsError(tool.name, problems(found, more=more))


_MAX_ERRORS = 1000


def _path_order(location: Iterable[Any]) -> tuple[tuple[int, int, str], ...]:
    """Sorts paths in document order: ``n[2]`` before ``n[10]``."""
    return tuple((0, part, "") if isinstance(part, int) else (1, 0, str(part)) for part in location)


# How a ToolSchemaError's problem begins when the schema cannot even be sent as JSON.
_NOT_JSON: Final = "not JSON"


def check_tool_json(tool: Tool) -> None:
    """Raise :class:`~raf.errors.ToolSchemaError` when ``tool.parameters`` cannot be sent as JSON
    (a set, a circular or too deep structure, a bytes key, NaN): a tool no client can
    offer to the model. A schema that is JSON but not a valid JSON Schema passes here:
    it is refused when the model calls the tool. Cached by the schema, as the validator
    is; a tool that holds its ``schema_validator`` was checked when it was built."""
    if isinstance(tool, FunctionTool) or _held(tool) is not None:
        return
    try:
        _validator(tool)
    except ToolSchemaError as exc:
        if exc.problem.startswith(_NOT_JSON):
            raise


def _held(tool: Tool) -> Validator | None:
    """The validator a tool holds, built with it (``FunctionTool``, an MCP server's tool)."""
    held = getattr(tool, "schema_validator", None)
    return held if callable(getattr(held, "iter_errors", None)) else None


def _validator(tool: Tool) -> Validator:
    """The validator of ``tool.parameters``: the tool's own (:func:`_held`), else the one
    cached for its schema (by the schema's JSON text: it depends on nothing else)."""
    held = _held(tool)
    if held is not None:
        return held
    checker = _checker(tool.parameters)
    if isinstance(checker, str):
        raise ToolSchemaError(tool.name, checker)  # a fresh one: no traceback piles up
    return checker


def _checker(schema: object) -> Validator | str:
    """The validator of ``schema``, or what is wrong with it."""
    if not isinstance(schema, Mapping):
        return f"expected a JSON object, got {type(schema).__name__}"
    try:
        text = json.dumps(schema, default=_mapping_as_dict, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"{_NOT_JSON}: {exc}"
    return _checker_of(text)


@functools.lru_cache(maxsize=1024)
def _checker_of(text: str) -> Validator | str:
    try:
        return build_validator("", json.loads(text))
    except ToolSchemaError as exc:
        return exc.problem


def build_validator(name: str, schema: object) -> Validator:
    """The jsonschema validator of a tool's ``schema``; a :class:`~raf.errors.ToolSchemaError` says
    what is wrong with it (a tool that holds it checks its arguments with no cache)."""
    # jsonschema (and RE2) are imported when a tool is first checked, not with raf.
    import jsonschema
    import referencing

    from raf._agent.linear_schema import check_patterns, linear

    if not isinstance(schema, Mapping):
        raise ToolSchemaError(name, f"expected a JSON object, got {type(schema).__name__}")
    try:
        plain = _plain_json(schema)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolSchemaError(name, f"{_NOT_JSON}: {exc}") from None
    declared = plain.get("$schema")
    if declared is not None and not isinstance(declared, str):
        raise ToolSchemaError(name, f"at $schema: {declared!r} is not of type 'string'")
    cls = jsonschema.validators.validator_for(plain, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(plain)
    except jsonschema.SchemaError as exc:
        where = path_text(exc.absolute_path)
        raise ToolSchemaError(
            name, f"{'at ' + where + ': ' if where else ''}{exc.message}"
        ) from None
    except RecursionError:
        raise ToolSchemaError(name, "nested too deeply") from None
    problem = check_patterns(plain)
    if problem is not None:
        raise ToolSchemaError(name, problem)
    # An empty registry: a tool's $ref never reaches the network. Patterns match with RE2.
    return cast("Validator", linear(cls)(plain, registry=referencing.Registry()))


def _plain_json(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy (dicts and lists) of a schema that may hold read-only mappings and tuples."""
    text = json.dumps(schema, default=_mapping_as_dict, allow_nan=False)
    plain: dict[str, Any] = json.loads(text)
    return plain


def _mapping_as_dict(value: object) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} {value!r:.60}")
