"""Tools a model can call: the Tool protocol and the @tool decorator."""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Callable, Mapping
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
    _enums: Mapping[str, type[enum.Enum]] = attrs.field(factory=dict, repr=False)

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Call the function with ``arguments`` as keyword arguments."""
        kwargs = dict(arguments)
        for name, enum_type in self._enums.items():
            if name in kwargs and kwargs[name] is not None:
                kwargs[name] = enum_type(kwargs[name])
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
        parameters, _ = schema_for_function(function)
        text = description if description is not None else description_from_docstring(function)
        return FunctionTool(
            function,
            name or function.__name__,
            text,
            parameters,
            in_thread,
            _enum_parameters(function),
        )

    return make if fn is None else make(fn)


def _enum_parameters(fn: Callable[..., Any]) -> dict[str, type[enum.Enum]]:
    found: dict[str, type[enum.Enum]] = {}
    for name, hint in typing.get_type_hints(fn).items():
        candidates = get_args(hint) if get_origin(hint) is not None else (hint,)
        for candidate in candidates:
            if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
                found[name] = candidate
    return found
