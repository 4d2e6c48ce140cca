"""docs/costs.md shows the ledger report that ``python docs/_costs_report.py`` prints now:
a report in money made by running raf, not typed by hand."""

from __future__ import annotations

import runpy
from pathlib import Path

import anyio

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_page_holds_the_report_the_script_prints() -> None:
    script = runpy.run_path(str(DOCS / "_costs_report.py"))
    text = anyio.run(script["report"])
    page = (DOCS / "costs.md").read_text(encoding="utf-8")
    block = page.split("<!-- costs-report -->\n```text\n", 1)[1].split("```", 1)[0]
    assert block == text + "\n", "run `python docs/_costs_report.py --write`"
    assert "cost by layer (4 priced calls; gpt-4o-mini):" in text
