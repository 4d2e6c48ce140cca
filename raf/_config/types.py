"""The value types of a config's options, each with what it must be in words (:class:`Expect`).

Shared by the option models of the providers (:mod:`raf._config.models`) and of the
stacks' middleware (:mod:`raf._config.stack_options`); like them, never imported by
``import raf``.
"""

from __future__ import annotations

import inspect
import os
from typing import Annotated, Any, Literal, Union

import attrs
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__: list[str] = []


@attrs.frozen
class Expect:
    """Metadata of a type: what a value must be, in words (``"an integer >= 1"``)."""

    text: str


def _fspath(value: object) -> object:
    # A declaration built in code may hold a Path; a TOML file holds a string.
    return os.fspath(value) if isinstance(value, os.PathLike) else value


Flag = Annotated[bool, Field(strict=True), Expect("true or false")]
Count = Annotated[int, Field(strict=True, ge=1), Expect("an integer >= 1")]
NonNegativeCount = Annotated[int, Field(strict=True, ge=0), Expect("an integer >= 0")]
Positive = Annotated[
    float, Field(strict=True, gt=0, allow_inf_nan=False), Expect("a positive number")
]
NonNegative = Annotated[
    float, Field(strict=True, ge=0, allow_inf_nan=False), Expect("a number >= 0")
]
Text = Annotated[str, Field(strict=True, min_length=1), Expect("a non-empty string")]
AnyText = Annotated[str, Field(strict=True), Expect("a string")]
TextList = Annotated[list[str], Field(strict=True), Expect("a list of strings")]
TextTable = Annotated[dict[str, str], Field(strict=True), Expect("a table of strings")]
PathText = Annotated[
    str,
    Field(strict=True, min_length=1),
    BeforeValidator(_fspath),
    Expect("a path (a non-empty string)"),
]
#: Seconds after the session's last model call from which its cache counts as expired;
#: ``false``: never (TOML has no null). ``inf`` means never too, as in Python.
ColdAfter = Annotated[
    # Left to right: 0 is a number of seconds, not false (0 == False to Literal[False]).
    Union[Annotated[float, Field(strict=True, ge=0)], Literal[False]],  # noqa: UP007
    Field(union_mode="left_to_right"),
    Expect("a number of seconds >= 0, or false (never cut early)"),
]
#: An amount of US dollars: a number, or a decimal string that keeps every digit.
Money = Annotated[
    Union[  # noqa: UP007
        Annotated[str, Field(strict=True)],
        Annotated[int, Field(strict=True)],
        Annotated[float, Field(strict=True)],
    ],
    Expect("a number of USD >= 0, or a decimal string ('0.50')"),
]


class Closed(BaseModel):
    """A table whose every key is known: any other key is refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def class_default(cls: Any, parameter: str) -> Any:
    """The default of ``cls``'s ``parameter``, read from its signature: an option's
    default in the schema is the class's own, never a number written twice."""
    return inspect.signature(cls).parameters[parameter].default


def cold_after(value: float | Literal[False]) -> float | None:
    """A ``cold_after`` option as the classes take it: ``false`` is ``None`` (never)."""
    return None if value is False else value


def given(options: BaseModel, *names: str) -> dict[str, Any]:
    """The options of ``names`` that the file sets, as keywords of the class they build
    (``cold_after = false`` as ``None``): what it does not set keeps the class's default."""
    found = {name: getattr(options, name) for name in names if name in options.model_fields_set}
    if "cold_after" in found:
        found["cold_after"] = cold_after(found["cold_after"])
    return found
