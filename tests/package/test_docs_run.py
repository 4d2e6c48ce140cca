r"""Every Python block of the docs runs as written, or says why it cannot.

The pages are ``docs/*.md``, ``docs/providers/*.md`` and ``README.md``. Each
```` ```python ```` block runs in a fresh namespace (``__name__`` is
``"__main__"``, as for a script), in a temporary working directory, with its
output captured. A block that cannot run says so in the page, right before
it, with a reason::

    <!-- not run: needs an OpenAI key -->
    ```python
    ...
    ```

A block that is a file the page names on its first line (``# name.py``, or a
docstring that starts with the name) is also written into the working directory
of the page's other blocks, so a later block can import it; a block named
``test_*.py`` is a test file, run with pytest on both anyio backends.
``>>>`` examples outside fences are doctests, run by pytest's
``--doctest-glob`` (pyproject.toml), not here.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import structlog

ROOT = Path(__file__).resolve().parents[2]
PAGES = (
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "providers").glob("*.md")),
    ROOT / "README.md",
)
# ```python, ```py or ```python3, also indented (in a list item).
FENCE = re.compile(r"^([ \t]*)```(?:python3?|py)[ \t]*\n(.*?)^\1```", re.DOTALL | re.MULTILINE)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*$", re.DOTALL)
FILE_NAME = re.compile(r'^(?:#\s*|"""\s*)([\w-]+\.py)\b')


@attrs.frozen
class Block:
    """One ```python block of a page."""

    page: Path
    line: int
    code: str
    #: Why it is not run (from ``<!-- not run: reason -->``), or None.
    not_run: str | None
    #: The file name its first line gives, or None.
    file_name: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip()
        marker = NOT_RUN.search(before[before.rfind("<!--") :]) if "<!--" in before else None
        # The marker must be the last thing before the fence.
        not_run = marker.group(1) if marker and before.endswith("-->") else None
        code = textwrap.dedent(match.group(2))
        name = FILE_NAME.match(code)
        found.append(Block(page, line, code, not_run, name.group(1) if name else None))
    return found


BLOCKS = [block for page in PAGES for block in blocks_of(page)]


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """A block may configure structlog (docs/middleware.md does): not for the next one."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def test_the_harness_finds_the_blocks() -> None:
    assert len(BLOCKS) > 20
    assert {block.page.name for block in BLOCKS} >= {"README.md", "errors.md", "memory.md"}
    assert all(block.not_run is None or block.not_run.strip() for block in BLOCKS)


def test_a_marker_needs_a_reason_and_must_be_right_before_the_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- not run: needs a key -->\n```python\nx = 1\n```\n"
        "<!-- not run: stale -->\n\nText between.\n\n```python\ny = 2\n```\n"
        '```python\n"""tool.py — a module."""\n```\n'
        "- a list item:\n\n  ```py\n  if True:\n      z = 3\n  ```\n"
    )
    first, second, third, fourth = blocks_of(page)
    assert (first.not_run, first.line) == ("needs a key", 2)
    assert second.not_run is None
    assert third.file_name == "tool.py"
    assert fourth.code == "if True:\n    z = 3\n"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: block.where)
def test_the_block_runs(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if block.not_run is not None:
        pytest.skip(f"not run: {block.not_run}")
    if "McpToolsProvider(" in block.code:
        pytest.importorskip("mcp")
    # The files the page names are there for its blocks to import, as for a reader
    # who saved them next to each other.
    for other in blocks_of(block.page):
        if other.file_name is not None:
            (tmp_path / other.file_name).write_text(other.code, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    if block.file_name is not None and block.file_name.startswith("test_"):
        run_test_file(block, tmp_path)
        return
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if block.file_name and n == block.file_name[:-3]]:
        monkeypatch.delitem(sys.modules, name)
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(block.code, block.where, "exec"), {"__name__": "__main__"})


def run_test_file(block: Block, folder: Path) -> None:
    """A test file of the docs passes under pytest (both anyio backends, as raf's own)."""
    conftest = (
        "import pytest\n\n"
        "@pytest.fixture(params=['asyncio', 'trio'])\n"
        "def anyio_backend(request):\n"
        "    return request.param\n\n"
        # raf's pytest plugin, enabled as docs/testing.md says.
        "pytest_plugins = ['raf.testing.plugin']\n"
    )
    (folder / "conftest.py").write_text(conftest)
    done = subprocess.run(
        # (-p no:raf: an install of raf from before the plugin was opt-in has an entry point;
        # -p no:langsmith_plugin, as in pyproject.toml: ~0.8 s of CPU a pytest, for nothing)
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:raf"]
        + ["-p", "no:langsmith_plugin", block.file_name or ""],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(folder), str(ROOT)])},
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.where}:\n{done.stdout}\n{done.stderr}"
    assert " passed" in done.stdout


def test_a_module_the_docs_name_does_nothing_on_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe saved as a file (``notebook.py``) and imported, by a test for example,
    defines things and runs no demo: the demo is under ``if __name__ == "__main__"``."""
    modules = [b for b in BLOCKS if b.file_name and not b.file_name.startswith("test_")]
    assert modules
    monkeypatch.chdir(tmp_path)
    for block in modules:
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(block.code, block.where, "exec"), {"__name__": block.file_name[:-3]})
        assert output.getvalue() == "", f"{block.where} runs something on import"


def test_the_readme_real_model_example_runs_on_a_fresh_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's real-model script, as written, in an empty folder, against a loopback
    server that speaks the OpenAI protocol (its key and URL from the environment)."""
    from tests._harness.openai_server import OpenAIServer

    [block] = [b for b in BLOCKS if b.page.name == "README.md" and "OpenAIChatClient" in b.code]
    server = OpenAIServer()
    try:
        server.answer(content="Your notes folder is empty.")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.chdir(tmp_path)
        output = io.StringIO()
        with contextlib.redirect_stdout(output):
            exec(compile(block.code, block.where, "exec"), {"__name__": "__main__"})
    finally:
        server.close()
    # The answer, after LoggingMiddleware's events (structlog prints them on stdout).
    assert output.getvalue().endswith("\nYour notes folder is empty.\n")
    assert (tmp_path / "notes").is_dir()
    assert (tmp_path / "chat.db").is_file()
    [request] = server.requests
    assert request.body["messages"][-1] == {"role": "user", "content": "What is in my notes?"}
