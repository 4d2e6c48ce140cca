"""The API reference and the maps agree with the code.

``docs/api.md`` is generated from the docstrings (mkdocstrings): one
``::: raf.Name`` directive per public name, each listed once in the page's
index by topic. The README and ``docs/index.md`` link every page of
``docs/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import raf

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"
# `::: raf.Name`, or `::: raf._private.path.Name` for a name loaded on first use.
DIRECTIVE = re.compile(r"^::: raf\.(?:_[\w.]+\.)?(\w+)$", re.M)
# Named in the reference without being in raf.__all__, on purpose: imported on first use
# (it needs an extra), and the public subpackages' own names.
ALSO_DOCUMENTED = {"GeminiChatClient", "PostgresSessionStore", "RedisSessionStore"}


def test_every_public_name_has_one_entry_in_the_api_reference() -> None:
    text = API.read_text(encoding="utf-8")
    entries = [name for name in DIRECTIVE.findall(text) if "." not in name]
    top_level = [
        name
        for line in text.splitlines()
        if line.startswith("::: raf.")
        and not line.startswith(("::: raf.testing", "::: raf.otel"))
        and not line.startswith(("::: raf.serve", "::: raf.durable"))
        for name in DIRECTIVE.findall(line)
    ]
    missing = sorted(set(raf.__all__) - set(entries))
    twice = sorted({name for name in top_level if top_level.count(name) > 1})
    unknown = sorted(set(top_level) - set(raf.__all__) - ALSO_DOCUMENTED)
    assert missing == [], f"docs/api.md has no entry for these public names: {missing}"
    assert twice == [], f"docs/api.md has more than one entry for: {twice}"
    assert unknown == [], f"docs/api.md documents these, which raf does not export: {unknown}"


def test_the_index_of_the_reference_links_every_entry() -> None:
    text = API.read_text(encoding="utf-8")
    for name in raf.__all__:
        assert f"[`{name}`](#" in text, name


def test_the_readme_and_the_map_link_every_guide() -> None:
    docs = API.parent
    readme = (docs.parent / "README.md").read_text(encoding="utf-8")
    index = (docs / "index.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in docs.glob("*.md") if p.name not in ("index.md", "changelog.md"))
    assert [p for p in pages if f"](docs/{p})" not in readme] == []
    assert [p for p in pages if f"]({p})" not in index] == []
    site = (docs.parent / "mkdocs.yml").read_text(encoding="utf-8")
    assert [p for p in pages if f": {p}" not in site] == []  # the site's navigation
