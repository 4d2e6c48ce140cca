"""Hypothesis strategies for structured output: values of an ``output_type``, and the
JSON a model answers them with."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from hypothesis import strategies as st

from raf._agent.output import OutputSpec, answer_json, output_spec

__all__ = ["output_json", "outputs"]

_REJECTED = object()


def outputs(output_type: Any) -> st.SearchStrategy[Any]:
    """Values of ``output_type`` as a run's ``response.output`` can hold them.

    ``output_type`` is what ``agent.run(..., output_type=T)`` takes: a
    pydantic model, a dataclass, a ``TypedDict`` or a plain type. Every value
    is drawn as JSON a model could answer and validated as raf validates an
    answer, so field constraints (``Field(ge=1)``, validators) hold: what
    your code gets from a run, for property tests of that code::

        @given(rs.outputs(Invoice))
        def test_totals(invoice): assert book(invoice).total >= 0

    Draws that do not validate are discarded, so a type whose constraints
    few random values meet makes a slow strategy: narrow it with ``.filter``
    or your own strategy for such a field (``st.register_type_strategy``).
    """
    if output_type is str:
        return st.text()
    spec = output_spec(output_type)
    return (
        _raw(output_type, 0)
        .map(lambda raw: _validated(spec, raw))
        .filter(lambda value: value is not _REJECTED)
    )


def output_json(value: Any, output_type: Any) -> str:
    """The JSON text a model answers ``value`` with when asked for ``output_type``.

    What a :class:`raf.ScriptedChatClient` plays back in a test: a plain
    type is wrapped as ``{"value": ...}``, as raf asks the model to.

    >>> output_json([1, 2], list[int])
    '{"value": [1, 2]}'
    """
    if output_type is str:
        return str(value)
    return answer_json(value, output_spec(output_type))


def _validated(spec: OutputSpec, raw: Any) -> Any:
    import pydantic

    try:
        return spec.validate(answer_json(raw, spec))
    except (pydantic.ValidationError, ValueError, TypeError, OverflowError):
        return _REJECTED


def _raw(form: Any, depth: int) -> st.SearchStrategy[Any]:
    """Plain data (dicts for models, dataclasses and TypedDicts) shaped like ``form``."""
    if depth > 8:
        return st.nothing()
    fields = _fields(form)
    if fields is not None:
        required, optional = fields
        return st.fixed_dictionaries(
            {name: _raw(hint, depth + 1) for name, hint in required.items()},
            optional={name: _raw(hint, depth + 1) for name, hint in optional.items()},
        )
    origin, args = typing.get_origin(form), typing.get_args(form)
    if origin in (list, tuple, set, frozenset) and args:
        if origin is tuple and (len(args) != 2 or args[1] is not Ellipsis):
            return st.tuples(*(_raw(arg, depth + 1) for arg in args)).map(list)
        return st.lists(_raw(args[0], depth + 1), max_size=4)
    if origin in (typing.Union, types.UnionType) and args:
        return st.one_of(*(_raw(arg, depth + 1) for arg in args))
    if origin is typing.Annotated and args:
        return _raw(args[0], depth)
    if form is type(None):
        return st.none()
    return st.from_type(form)


def _fields(form: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The required and optional fields of a model, dataclass or TypedDict, else None."""
    import pydantic

    required: dict[str, Any] = {}
    optional: dict[str, Any] = {}
    if isinstance(form, type) and issubclass(form, pydantic.BaseModel):
        for name, info in form.model_fields.items():
            key = info.alias or name
            (required if info.is_required() else optional)[key] = info.annotation
        return required, optional
    if isinstance(form, type) and dataclasses.is_dataclass(form):
        hints = typing.get_type_hints(form, include_extras=True)
        for field in dataclasses.fields(form):
            if not field.init:
                continue
            missing = (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            (required if missing else optional)[field.name] = hints[field.name]
        return required, optional
    import typing_extensions

    if isinstance(form, type) and typing_extensions.is_typeddict(form):
        hints = typing_extensions.get_type_hints(form)
        keys = getattr(form, "__required_keys__", frozenset(hints))
        return (
            {name: hint for name, hint in hints.items() if name in keys},
            {name: hint for name, hint in hints.items() if name not in keys},
        )
    return None
