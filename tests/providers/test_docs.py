"""The examples of the provider guides run, and print what their comments say."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDES = (
    "providers.md",
    "declaring-providers.md",
    "streaming.md",
    *sorted(str(page.relative_to(DOCS)) for page in (DOCS / "providers").glob("*.md")),
)
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def examples() -> list[tuple[str, int, str]]:
    found = []
    for guide in (*GUIDES, "writing-a-provider.md"):
        text = (DOCS / guide).read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            # Of the guide to writing one, the example of volatile results: the others
            # are files to save and run as they say.
            if guide in GUIDES or "volatile=True" in match.group(1):
                found.append((guide, line, match.group(1)))
    return found


def expected_output(code: str) -> list[str]:
    """The comments that document a print: trailing ``# x`` and the comment lines after it."""
    expected: list[str] = []
    after_print = False
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and after_print:
            expected.append(stripped[2:] if stripped.startswith("# ") else "")
            continue
        after_print = stripped.startswith("print(")
        if after_print and "  # " in line:
            expected.append(line.split("  # ", 1)[1])
    return expected


def matches(pattern: str, line: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("..."))
    return re.fullmatch(regex, line) is not None


@pytest.mark.parametrize(("guide", "line", "code"), examples(), ids=lambda v: str(v)[:30])
def test_example_runs_and_prints_what_it_says(guide: str, line: int, code: str) -> None:
    if "McpToolsProvider(" in code:
        pytest.importorskip("mcp")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(code, f"{guide}:{line}", "exec"), {"__name__": "__example__"})
    printed = output.getvalue().splitlines()
    expected = expected_output(code)
    assert expected, f"{guide}:{line}: the example documents no output"
    assert len(printed) == len(expected), (printed, expected)
    for want, got in zip(expected, printed, strict=True):
        assert matches(want, got), f"{guide}:{line}: expected {want!r}, printed {got!r}"
