"""How the problems of a tool call's arguments are told to the model: short, and few."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

#: How many problems of one call are told to the model; the rest are counted.
MAX_PROBLEMS = 10
#: Each problem's text is cut to this length (a validator may quote the whole input).
MAX_PROBLEM_CHARS = 300


def path_text(location: Iterable[Any]) -> str:
    """``items[2].qty`` from ``("items", 2, "qty")``."""
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(str(part), ensure_ascii=False)}]"
    return text


def problems(found: Iterable[tuple[Iterable[Any], str]], *, more: bool = False) -> tuple[str, ...]:
    problems: list[str] = []
    extra = 0
    for location, message in found:
        if len(problems) == MAX_PROBLEMS:
            extra += 1
            continue
        where = path_text(location)
        text = f"{where}: {message}" if where else message
        if len(text) > MAX_PROBLEM_CHARS:
            text = text[: MAX_PROBLEM_CHARS - 3] + "..."
        problems.append(text)
    if more:
        problems.append(f"and more than {extra} more")
    elif extra:
        problems.append(f"and {extra} more")
    return tuple(problems)
