"""The docs site builds with --strict (a broken link, section or reference fails), with the
API reference generated from the docstrings and its diagrams in place."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import raf

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_site_builds_strictly_with_its_reference_and_diagrams(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    reference = (site / "api" / "index.html").read_text()
    # Every public name has its generated entry (the lazily imported ones under their
    # module's path), with its docstring.
    for name in raf.__all__:
        assert f'id="raf.{name}"' in reference or f'.{name}"' in reference, name
    for module in ("raf.compression", "raf.config", "raf.errors", "raf.observe"):
        for name in importlib.import_module(module).__all__:
            assert f'id="{module}.{name}"' in reference or f'id="raf.{name}"' in reference, name
    assert "An observer that draws each run as a Mermaid sequence diagram" in reference
    assert ":class:" not in reference  # the docstrings' roles became code (and links)
    # The pictures: Mermaid blocks the theme draws.
    for page, diagram in [
        ("concepts", "flowchart TB"),
        ("cli", "sequenceDiagram"),
        ("streaming", "sequenceDiagram"),
    ]:
        html = (site / page / "index.html").read_text()
        assert f'<pre class="mermaid"><code>{diagram}' in html, page
    assert "raf-agents" in (site / "changelog" / "index.html").read_text()
