"""The hand-kept pages agree with the code: ``docs/api.md`` names every public name once.

Each table row's first cell names what the row is about (the backticked
names in it); the rows of the ``raf`` sections (all but ``raf.testing``'s)
must name every name of ``raf.__all__`` exactly once. ``Agent``'s row shows
its real signature. The README and ``docs/index.md`` link every page of
``docs/``.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import raf

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"
# Named in a first cell of a raf section without being in raf.__all__, on purpose:
# imported on first use (needs an extra), a builtin named as a base, raf.otel's function.
ALSO_NAMED = {"RedisSessionStore", "TimeoutError", "raf"}
# Public subpackages with a section of their own: their names are not raf's.
SUBPACKAGE_SECTIONS = ("testing", "durable", "serve")
# The first identifier of each backticked span: `Agent(...)` -> Agent, `@tool` -> tool.
NAME = re.compile(r"`@?([A-Za-z_]\w*)")


def _first_cells() -> list[tuple[str, str]]:
    """(section, first cell) of every table row of the raf sections (not a subpackage's)."""
    rows = []
    section = ""
    for line in API.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:]
        elif (
            line.startswith("| ")
            and not line.startswith(("| name ", "|---"))
            and not any(f"`raf.{sub}`" in section for sub in SUBPACKAGE_SECTIONS)
        ):
            rows.append((section, line.split(" | ")[0][2:]))
    return rows


def test_every_public_name_is_in_the_api_reference_once() -> None:
    seen: dict[str, int] = {}
    for _, cell in _first_cells():
        for name in set(NAME.findall(cell)):
            seen[name] = seen.get(name, 0) + 1
    missing = sorted(set(raf.__all__) - set(seen))
    twice = sorted(name for name, count in seen.items() if count > 1 and name != "raf")
    unknown = sorted(set(seen) - set(raf.__all__) - ALSO_NAMED)
    assert missing == [], f"docs/api.md does not name these public names: {missing}"
    assert twice == [], f"docs/api.md names these in more than one row: {twice}"
    assert unknown == [], f"docs/api.md names these, which raf does not export: {unknown}"


def _shown(parameter: inspect.Parameter) -> str:
    if parameter.default is inspect.Parameter.empty:
        return parameter.name
    return f"{parameter.name}={parameter.default!r}"


def test_the_agent_row_shows_its_real_signature() -> None:
    parameters = list(inspect.signature(raf.Agent).parameters.values())
    shown = [_shown(p) for p in parameters if p.kind is not p.KEYWORD_ONLY]
    shown.append("*")
    shown += [_shown(p) for p in parameters if p.kind is p.KEYWORD_ONLY]
    expected = f"`Agent({', '.join(shown)})`"
    cells = [cell for _, cell in _first_cells() if cell.startswith("`Agent(")]
    assert cells == [expected]


def test_the_readme_and_the_map_link_every_guide() -> None:
    docs = API.parent
    readme = (docs.parent / "README.md").read_text(encoding="utf-8")
    index = (docs / "index.md").read_text(encoding="utf-8")
    pages = sorted(page.name for page in docs.glob("*.md") if page.name != "index.md")
    assert [p for p in pages if f"](docs/{p})" not in readme] == []
    assert [p for p in pages if f"]({p})" not in index] == []
