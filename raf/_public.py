"""The public modules' one helper: each public name says where users import it from."""

from __future__ import annotations

import types
from collections.abc import Iterable

__all__: list[str] = []


def say_home(module: str, values: Iterable[object]) -> None:
    """Set ``__module__`` of each class and function among ``values`` to ``module``.

    As httpx does: a traceback, a repr and the API reference then name the public
    module a user imports the name from (``raf``, ``raf.observe``), not the private one
    that defines it, which may move.
    """
    for value in values:
        if isinstance(value, (type, types.FunctionType)):
            value.__module__ = module
