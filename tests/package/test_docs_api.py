"""The API reference and the maps agree with the code.

``docs/api.md`` is generated from the docstrings (mkdocstrings): one
``::: raf.Name`` directive per public name (``::: raf.observe.Name`` for a name
of a public module), each listed once in the page's index by topic. The
README and ``docs/index.md`` link every page of ``docs/``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import raf

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
#: The public modules beside raf, each with a section of the reference.
PUBLIC_MODULES = ("compression", "config", "errors", "observe")
# `::: raf.Name`, `::: raf.observe.Name` (a public module's), or
# `::: raf._private.path.Name` for a name loaded on first use.
DIRECTIVE = re.compile(r"^::: raf\.(?:(_[\w.]+|" + "|".join(PUBLIC_MODULES) + r")\.)?(\w+)$", re.M)
# Named in the reference without being in raf.__all__, on purpose: imported on first use
# (it needs an extra).
ALSO_DOCUMENTED = {"GeminiChatClient", "PostgresSessionStore", "RedisSessionStore"}


def _homes() -> dict[str, str]:
    """Every public name, and where it is documented: ``raf`` or its public module."""
    homes = dict.fromkeys((*raf.__all__, *ALSO_DOCUMENTED), "raf")
    for module in PUBLIC_MODULES:
        for name in importlib.import_module(f"raf.{module}").__all__:
            homes.setdefault(name, f"raf.{module}")
    return homes


def test_every_public_name_has_one_entry_in_the_api_reference() -> None:
    text = API.read_text(encoding="utf-8")
    entries = [
        (f"raf.{module}" if module and not module.startswith("_") else "raf", name)
        for module, name in DIRECTIVE.findall(text)
    ]
    names = [name for _, name in entries]
    homes = _homes()
    missing = sorted(set(homes) - set(names))
    twice = sorted({name for name in names if names.count(name) > 1})
    unknown = sorted(f"{where}.{name}" for where, name in entries if homes.get(name) != where)
    assert missing == [], f"docs/api.md has no entry for these public names: {missing}"
    assert twice == [], f"docs/api.md has more than one entry for: {twice}"
    assert unknown == [], f"docs/api.md documents these, which are not public there: {unknown}"


def test_the_index_of_the_reference_links_every_entry() -> None:
    text = API.read_text(encoding="utf-8")
    for name, home in _homes().items():
        if home == "raf" and name in ALSO_DOCUMENTED | set(raf._LATE):
            assert f"[`{name}`](#raf." in text, name  # its entry is under its module's path
        else:
            assert f"[`{name}`](#{home}.{name})" in text, name


def test_the_readme_and_the_map_link_every_guide() -> None:
    docs = API.parent
    readme = (docs.parent / "README.md").read_text(encoding="utf-8")
    index = (docs / "index.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in docs.glob("*.md") if p.name not in ("index.md", "changelog.md"))
    assert [p for p in pages if f"](docs/{p})" not in readme] == []
    assert [p for p in pages if f"]({p})" not in index] == []
    site = (docs.parent / "mkdocs.yml").read_text(encoding="utf-8")
    assert [p for p in pages if f": {p}" not in site] == []  # the site's navigation
