"""Tools a model can call: the Tool protocol and the @tool decorator."""

from __future__ import annotations

import enum
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol, get_args, get_origin, overload, runtime_checkable

import anyio.to_thread
import attrs

from raf.schema import description_from_docstring, schema_for_function

__all__ = ["FunctionTool", "Tool", "tool"]


@runtime_checkable
class Tool(Protocol):
    """Something the model can call.

    ``parameters`` is the JSON Schema of the arguments object. raf checks the
    model's arguments against it before ``invoke`` is called, so ``invoke``
    gets a mapping that fits. The result is sent back to the model: a ``str``
    as it is, anything else as JSON.
    """

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> Mapping[str, Any]: ...

    async def invoke(self, arguments: Mapping[str, Any]) -> Any: ...


@attrs.frozen(slots=True)
class FunctionTool:
    """A :class:`Tool` made from a Python function by :func:`tool`."""

    fn: Callable[..., Any]
    name: str
    description: str
    parameters: Mapping[str, Any]
    in_thread: bool = False
    _converters: Mapping[str, Callable[[Any], Any]] = attrs.field(factory=dict, repr=False)

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Call the function with ``arguments`` as keyword arguments."""
        kwargs = dict(arguments)
        for name, convert in self._converters.items():
            if name in kwargs and kwargs[name] is not None:
                kwargs[name] = convert(kwargs[name])
        if self.in_thread:
            return await anyio.to_thread.run_sync(lambda: self.fn(**kwargs))
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, in_thread: bool = False
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    in_thread: bool = False,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a :class:`Tool` from a sync or async function.

    The schema comes from the type hints (``int``, ``float``, ``str``,
    ``bool``, ``list[...]``, ``dict[str, ...]``, ``Literal``, enums,
    ``Optional``, ``Annotated[T, "description"]``), defaults make a
    parameter optional, and the description is the docstring's first
    paragraph; ``Args:`` entries describe the parameters. A blocking sync
    function should say ``in_thread=True`` so it runs in a worker thread.

    >>> @tool
    ... def add(a: int, b: int = 1) -> int:
    ...     '''Add two numbers.'''
    ...     return a + b
    >>> add.name, add.parameters["required"]
    ('add', ['a'])
    """

    def make(function: Callable[..., Any]) -> FunctionTool:
        if not callable(function):
            raise TypeError(f"@tool needs a function, got {function!r}")
        if in_thread and inspect.iscoroutinefunction(function):
            raise TypeError(
                f"@tool(in_thread=True) is for blocking sync functions; "
                f"{function.__name__} is async and runs on the event loop already"
            )
        parameters, _ = schema_for_function(function)
        text = description if description is not None else description_from_docstring(function)
        return FunctionTool(
            function,
            name or function.__name__,
            text,
            parameters,
            in_thread,
            _enum_converters(function),
        )

    return make if fn is None else make(fn)


def _enum_converters(fn: Callable[..., Any]) -> dict[str, Callable[[Any], Any]]:
    """For each parameter whose hint holds an enum, how to turn JSON into members."""
    found: dict[str, Callable[[Any], Any]] = {}
    for name, hint in typing.get_type_hints(fn).items():
        convert = _enum_converter(hint)
        if convert is not None and name != "return":
            found[name] = convert
    return found


def _enum_converter(hint: Any) -> Callable[[Any], Any] | None:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [c for c in map(_enum_converter, args) if c is not None]
        return partial(_first_fit, options) if options else None
    if origin in (dict, Mapping) and len(args) == 2:
        value = _enum_converter(args[1])
        return None if value is None else partial(_convert_values, value)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return None  # fixed-length tuples of enums are too rare to be worth a converter
    if origin is not None and args and origin not in (dict, Mapping, typing.Literal):
        # list[E], set[E], tuple[E, ...]: the model sends a JSON array of values
        item = _enum_converter(args[0])
        return None if item is None else partial(_convert_items, item)
    return None


def _first_fit(options: list[Callable[[Any], Any]], value: Any) -> Any:
    for convert in options:
        try:
            return convert(value)
        except (ValueError, TypeError):
            continue
    return value  # another member of the union (None, int, ...): leave it as sent


def _convert_items(convert: Callable[[Any], Any], value: Any) -> Any:
    return [None if item is None else convert(item) for item in value]


def _convert_values(convert: Callable[[Any], Any], value: Any) -> Any:
    return {key: None if item is None else convert(item) for key, item in value.items()}
