"""The file tools hold their folder while another thread swaps a folder inside it for a symlink out.

A thread flips ``root/sub`` between a real folder and a symlink to a folder
outside the root, as fast as it can, while the tools read, list and write
through ``sub`` for a bounded time. No call may return an outside file's
text or an outside folder's entries, and nothing may appear outside.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from raf import AgentSkillsProvider, WorkspaceContextProvider
from raf.errors import PathError

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # each race runs for RACE_SECONDS

#: How long each race runs: on a loaded 2-core machine some 700 calls, most meeting the swap
#: (refused), so the unsafe code loses within it many times.
RACE_SECONDS = 0.5
#: A race in which no call has succeeded yet goes on, up to this long: on a machine loaded
#: enough, 0.5 s may pass before the first call gets through the swapping.
RACE_LIMIT = 15.0
WORKERS = 4


@pytest.fixture
def far(tmp_path: Path) -> Path:
    """The outside folder the symlink points to: its names and text must never come back."""
    folder = tmp_path / "far"
    folder.mkdir()
    (folder / "data.txt").write_text("FAR AWAY secret")
    (folder / "far-marker.txt").write_text("FAR AWAY marker")
    return folder


def fill(sub: Path) -> None:
    sub.mkdir(parents=True)
    (sub / "data.txt").write_text("near")
    (sub / "near-marker.txt").write_text("near")


@contextlib.contextmanager
def swapping(sub: Path, far: Path) -> Iterator[list[int]]:
    """Flip ``sub`` between what it is (a folder or a file) and a symlink to ``far`` in a thread.

    ``write_file`` creates missing folders and files, so it may make a new
    ``sub`` in the moment the name is free; that is moved aside (it stays in
    the root) and the flip goes on.
    """
    parked = sub.with_name(sub.name + ".parked")
    stop = threading.Event()
    flips = [0]
    strays = itertools.count()

    def put(make: Callable[[], None]) -> None:
        while True:
            try:
                make()
                return
            except OSError:  # a folder write_file just created: set it aside, inside the root
                os.rename(sub, sub.with_name(f"{sub.name}.stray-{next(strays)}"))

    def flip() -> None:
        while not stop.is_set():
            os.rename(sub, parked)
            put(lambda: os.symlink(far, sub))
            os.unlink(sub)
            put(lambda: os.rename(parked, sub))
            flips[0] += 1

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    try:
        yield flips
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()


async def race(call: Callable[[int], Awaitable[Any]]) -> list[str]:
    """Call ``call(n)`` from several tasks for ``RACE_SECONDS`` (longer, up to ``RACE_LIMIT``,
    until one call succeeds); what the calls returned.

    A refusal (``PathError``) is a fine outcome of a call that met the swap.
    """
    results: list[str] = []
    start = time.monotonic()
    deadline, limit = start + RACE_SECONDS, start + RACE_LIMIT

    async def worker(number: int) -> None:
        count = 0
        while (now := time.monotonic()) < deadline or (not results and now < limit):
            with contextlib.suppress(PathError):
                results.append(str(await call(number * 1_000_000 + count)))
            count += 1

    async with anyio.create_task_group() as group:
        for number in range(WORKERS):
            group.start_soon(worker, number)
    return results


def tool(provider: Any, name: str) -> Any:
    return next(t for t in provider.tools if t.name == name)


def assert_far_untouched(far: Path) -> None:
    assert sorted(os.listdir(far)) == ["data.txt", "far-marker.txt"]
    assert (far / "data.txt").read_text() == "FAR AWAY secret"


async def test_workspace_reads_never_leave_the_root_under_a_swap(tmp_path: Path, far: Path) -> None:
    root = tmp_path / "ws"
    fill(root / "sub")
    read_file = tool(WorkspaceContextProvider(root), "read_file")
    with swapping(root / "sub", far) as flips:
        results = await race(lambda n: read_file.invoke({"path": "sub/data.txt"}))
    assert flips[0] > 0
    assert results, "no read succeeded at all"
    assert [r for r in results if r != "near"] == []
    assert_far_untouched(far)


async def test_workspace_listings_never_leave_the_root_under_a_swap(
    tmp_path: Path, far: Path
) -> None:
    root = tmp_path / "ws"
    fill(root / "sub")
    list_files = tool(WorkspaceContextProvider(root), "list_files")
    with swapping(root / "sub", far) as flips:
        results = await race(lambda n: list_files.invoke({"path": "sub"}))
    assert flips[0] > 0
    assert results, "no listing succeeded at all"
    assert [r for r in results if "far-marker" in r] == []


async def test_workspace_writes_never_leave_the_root_under_a_swap(
    tmp_path: Path, far: Path
) -> None:
    root = tmp_path / "ws"
    fill(root / "sub")
    write_file = tool(WorkspaceContextProvider(root), "write_file")
    with swapping(root / "sub", far) as flips:
        results = await race(
            lambda n: write_file.invoke({"path": f"sub/new-{n}.txt", "content": "written"})
        )
    assert flips[0] > 0
    assert results, "no write succeeded at all"
    assert_far_untouched(far)
    # every write that said it succeeded is inside the root, and no temporary file is left
    inside = [path.name for path in root.rglob("*") if path.is_file()]
    assert len([name for name in inside if name.startswith("new-")]) == len(results)
    assert not [name for name in inside if name.endswith(".tmp")]


@pytest.mark.parametrize(("swapped", "path"), [("pdf/sub", "sub/data.txt"), ("pdf", "data.txt")])
async def test_skill_resources_never_leave_the_skills_root_under_a_swap(
    tmp_path: Path, far: Path, swapped: str, path: str
) -> None:
    """The swapped folder is one inside a skill, or the skill's own folder."""
    root = tmp_path / "skills"
    fill(root / "pdf" / "sub")
    for folder in (root / "pdf", root / "pdf" / "sub"):
        (folder / "data.txt").write_text("near")
    (root / "pdf" / "SKILL.md").write_text("---\nname: pdf\ndescription: d\n---\nbody")
    provider = AgentSkillsProvider(root)
    read = tool(provider, "read_skill_resource")
    load = tool(provider, "load_skill")
    await provider.skills()  # discovered before the swapping starts
    with swapping(root / swapped, far) as flips:
        results = await race(lambda n: read.invoke({"skill": "pdf", "path": path}))
        listings = await race(lambda n: load.invoke({"name": "pdf"}))
    assert flips[0] > 0
    assert results, "no read succeeded at all"
    assert [r for r in results if r != "near"] == []
    assert listings, "no load_skill succeeded at all"
    assert [r for r in listings if "far-marker" in r] == []


async def test_a_file_swapped_for_a_symlink_out_is_never_read_or_written_through(
    tmp_path: Path, far: Path
) -> None:
    root = tmp_path / "ws"
    fill(root / "sub")
    provider = WorkspaceContextProvider(root)
    read_file, write_file = tool(provider, "read_file"), tool(provider, "write_file")
    with swapping(root / "sub" / "data.txt", far / "data.txt") as flips:
        reads = await race(lambda n: read_file.invoke({"path": "sub/data.txt"}))
        writes = await race(
            lambda n: write_file.invoke({"path": "sub/data.txt", "content": "near"})
        )
    assert flips[0] > 0
    assert reads, "no read succeeded at all"
    assert writes, "no write succeeded at all"
    assert [r for r in reads if r != "near"] == []
    assert_far_untouched(far)
