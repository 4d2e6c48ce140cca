"""WorkspaceContextProvider through real Agent runs: the model calls the file tools."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from raf import Agent, ScriptedChatClient, ToolCall, WorkspaceContextProvider
from raf.errors import ConfigError
from tests._harness.scripting import call_tools

pytestmark = pytest.mark.anyio


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "notes.md").write_text("# Notes\nbuy milk\n")
    (folder / "src").mkdir()
    (folder / "src" / "main.py").write_text("print('hi')\n")
    (folder / "link_out.txt").symlink_to(outside / "secret.txt")
    (folder / "dir_out").symlink_to(outside, target_is_directory=True)
    (folder / "link_in.md").symlink_to(folder / "notes.md")
    return folder


def assert_no_leak(text: str, *folders: Path) -> None:
    for folder in folders:
        assert str(folder) not in text
    assert "top secret" not in text


def names_under(folder: Path) -> list[str]:
    return [name for _, _, names in os.walk(folder) for name in names]


async def test_instructions_describe_the_workspace(root: Path) -> None:
    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=[WorkspaceContextProvider(root)]).run("hi")
    system = client.requests[0].messages[0]
    assert system.role == "system"
    assert "'ws'" in (system.content or "")
    assert "notes.md" in (system.content or "")
    assert "src/" in (system.content or "")
    assert str(root) not in (system.content or "")
    names = [t.name for t in client.requests[0].options.tools]
    assert names == ["read_file", "write_file", "list_files"]


async def test_read_list_and_write(root: Path) -> None:
    results = await call_tools(
        WorkspaceContextProvider(root),
        ("read_file", {"path": "notes.md"}),
        ("list_files", {"path": "src"}),
        ("write_file", {"path": "out/new.txt", "content": "héllo"}),
        ("list_files", {}),
        ("read_file", {"path": "link_in.md"}),
    )
    assert results[0] == "# Notes\nbuy milk\n"
    assert results[1] == "main.py"
    assert results[2] == "wrote 6 bytes to out/new.txt"
    assert (root / "out" / "new.txt").read_text(encoding="utf-8") == "héllo"
    assert results[3].splitlines()[:3] == ["dir_out", "link_in.md", "link_out.txt"]
    assert "out/" in results[3].splitlines()
    assert results[4] == "# Notes\nbuy milk\n"


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("read_file", {"path": "../outside/secret.txt"}, "uses '..'"),
        ("read_file", {"path": "src/../../outside/secret.txt"}, "uses '..'"),
        ("read_file", {"path": "link_out.txt"}, "leads outside the workspace"),
        ("read_file", {"path": "dir_out/secret.txt"}, "leads outside the workspace"),
        ("read_file", {"path": "notes.md\x00.txt"}, "NUL byte"),
        ("read_file", {"path": ""}, "empty"),
        ("read_file", {"path": "missing.md"}, "there is no file 'missing.md'"),
        ("read_file", {"path": "src"}, "is a folder"),
        ("list_files", {"path": "dir_out"}, "leads outside the workspace"),
        ("list_files", {"path": ".."}, "uses '..'"),
        ("list_files", {"path": "notes.md"}, "is a file"),
        ("write_file", {"path": "../evil.txt", "content": "x"}, "uses '..'"),
        ("write_file", {"path": "dir_out/evil.txt", "content": "x"}, "leads outside"),
        ("write_file", {"path": "link_out.txt", "content": "x"}, "leads outside"),
        ("write_file", {"path": "src", "content": "x"}, "is a folder"),
        ("write_file", {"path": ".", "content": "x"}, "is the workspace itself"),
        ("write_file", {"path": "a\x00b", "content": "x"}, "NUL byte"),
        ("read_file", {"path": "a\ud800.txt"}, "lone surrogate"),
        ("read_file", {"path": "src/\udcff"}, "lone surrogate"),
        ("list_files", {"path": "\udfff"}, "lone surrogate"),
        ("write_file", {"path": "new\ud800.txt", "content": "x"}, "lone surrogate"),
    ],
)
async def test_escapes_and_bad_paths_are_refused(
    root: Path, outside: Path, tool: str, arguments: dict[str, object], expected: str
) -> None:
    [result] = await call_tools(WorkspaceContextProvider(root), (tool, arguments))
    assert result.startswith(f"Error: tool {tool!r} failed: PathError: ")
    assert expected in result
    assert_no_leak(result, root, outside)
    assert (outside / "secret.txt").read_text() == "top secret"
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_absolute_paths_are_refused(root: Path, outside: Path) -> None:
    results = await call_tools(
        WorkspaceContextProvider(root),
        ("read_file", {"path": str(outside / "secret.txt")}),
        ("read_file", {"path": str(root / "notes.md")}),
        ("list_files", {"path": "/"}),
        ("write_file", {"path": str(outside / "evil.txt"), "content": "x"}),
        ("read_file", {"path": "C:\\Windows\\win.ini"}),
    )
    for result in results:
        assert "is absolute" in result, result
        assert "top secret" not in result
    assert not (outside / "evil.txt").exists()


async def test_dangling_symlink_out_is_not_written_through(root: Path, outside: Path) -> None:
    (root / "dangling.txt").symlink_to(outside / "created-by-model.txt")
    [result] = await call_tools(
        WorkspaceContextProvider(root), ("write_file", {"path": "dangling.txt", "content": "x"})
    )
    assert "leads outside" in result
    assert not (outside / "created-by-model.txt").exists()


async def test_size_limits(root: Path) -> None:
    (root / "big.txt").write_text("x" * 101)
    results = await call_tools(
        WorkspaceContextProvider(root, max_bytes=100),
        ("read_file", {"path": "big.txt"}),
        ("write_file", {"path": "huge.txt", "content": "é" * 51}),
        ("write_file", {"path": "fits.txt", "content": "y" * 100}),
    )
    assert "big.txt' is 101 bytes, more than the limit of 100 bytes" in results[0]
    assert "is 102 bytes, more than the limit of 100 bytes" in results[1]
    assert not (root / "huge.txt").exists()
    assert results[2] == "wrote 100 bytes to fits.txt"


async def test_binary_and_symlink_loop_are_clear_errors(root: Path) -> None:
    (root / "image.bin").write_bytes(b"\xff\xfe\x00\x01")
    (root / "loop").symlink_to(root / "loop")
    results = await call_tools(
        WorkspaceContextProvider(root),
        ("read_file", {"path": "image.bin"}),
        ("read_file", {"path": "loop"}),
    )
    assert "'image.bin' is not UTF-8 text" in results[0]
    assert results[1].startswith("Error: tool 'read_file' failed: PathError: ")
    assert str(root) not in results[1]


async def test_write_is_atomic_and_keeps_the_mode(root: Path) -> None:
    target = root / "script.sh"
    target.write_text("old")
    target.chmod(0o755)
    before = target.stat().st_ino
    [result] = await call_tools(
        WorkspaceContextProvider(root), ("write_file", {"path": "script.sh", "content": "new"})
    )
    assert result == "wrote 3 bytes to script.sh"
    assert target.read_text() == "new"
    assert target.stat().st_ino != before  # replaced by rename, not rewritten in place
    assert target.stat().st_mode & 0o777 == 0o755
    assert not [name for name in os.listdir(root) if name.endswith(".tmp")]


async def test_read_only_workspace_offers_no_write_tool(root: Path) -> None:
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(
                ToolCall("c", "write_file", '{"path": "x", "content": ""}')
            ),
            "done",
        ]
    )
    response = await Agent(client, stack=[WorkspaceContextProvider(root, writable=False)]).run("go")
    assert [t.name for t in client.requests[0].options.tools] == ["read_file", "list_files"]
    assert "read-only" in (client.requests[0].messages[0].content or "")
    assert response.messages[1].content.startswith("Error: there is no tool named 'write_file'")  # type: ignore[union-attr]
    assert not (root / "x").exists()


async def test_unreadable_file_error_names_no_absolute_path(root: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    locked = root / "locked.txt"
    locked.write_text("x")
    locked.chmod(0)
    try:
        [result] = await call_tools(
            WorkspaceContextProvider(root), ("read_file", {"path": "locked.txt"})
        )
    finally:
        locked.chmod(0o600)
    assert "cannot read 'locked.txt': Permission denied" in result
    assert str(root) not in result


def test_root_must_be_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        WorkspaceContextProvider(tmp_path / "nope")
    with pytest.raises(ValueError, match="max_bytes"):
        WorkspaceContextProvider(tmp_path, max_bytes=0)


async def test_many_entries_are_cut_in_listing(root: Path) -> None:
    many = root / "many"
    many.mkdir()
    for i in range(205):
        (many / f"f{i:03}.txt").write_text("")
    [result] = await call_tools(WorkspaceContextProvider(root), ("list_files", {"path": "many"}))
    lines = result.splitlines()
    assert len(lines) == 201
    assert lines[-1] == "... and 5 more"


async def test_a_fifo_is_not_read(root: Path) -> None:
    os.mkfifo(root / "pipe")
    [result] = await call_tools(WorkspaceContextProvider(root), ("read_file", {"path": "pipe"}))
    assert "'pipe' is not a regular file" in result


async def test_os_errors_are_reduced_to_their_reason(root: Path) -> None:
    [result] = await call_tools(
        WorkspaceContextProvider(root),
        ("write_file", {"path": "notes.md/inside.txt", "content": "x"}),
    )
    assert result.startswith("Error: tool 'write_file' failed: PathError: cannot write ")
    assert "'notes.md/inside.txt'" in result
    assert str(root) not in result


async def test_a_hard_link_is_not_read(root: Path, outside: Path) -> None:
    os.link(outside / "secret.txt", root / "hard.txt")
    results = await call_tools(
        WorkspaceContextProvider(root),
        ("read_file", {"path": "hard.txt"}),
        ("write_file", {"path": "hard.txt", "content": "mine"}),
        ("read_file", {"path": "hard.txt"}),
    )
    assert results[0] == (
        "Error: tool 'read_file' failed: PathError: 'hard.txt' has 2 hard links; a file with "
        "more than one is not read, since another link to it may lie outside the folder"
    )
    # a write replaces the name inside the workspace; the outside file keeps its text
    assert results[1:] == ["wrote 4 bytes to hard.txt", "mine"]
    assert (outside / "secret.txt").read_text() == "top secret"


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("write_file", {"path": "a" * 300, "content": "x"}),
        ("write_file", {"path": "src/" + "a" * 300, "content": "x"}),
        ("read_file", {"path": "a" * 300}),
        ("read_file", {"path": "/".join(["d" * 200] * 30)}),
        ("list_files", {"path": "a" * 300}),
        ("list_files", {"path": "src/" + "a" * 300 + "/x"}),
        ("write_file", {"path": "notes.md/x", "content": "x"}),
        ("list_files", {"path": "notes.md/x"}),
        ("read_file", {"path": "notes.md/x"}),
    ],
)
async def test_os_errors_name_only_the_path_the_model_gave(
    root: Path, outside: Path, tool: str, arguments: dict[str, str]
) -> None:
    [result] = await call_tools(WorkspaceContextProvider(root), (tool, arguments))
    assert result.startswith(f"Error: tool {tool!r} failed: PathError: "), result
    assert str(root.parent) not in result
    assert "/tmp" not in result
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert not [name for name in names_under(root) if name.endswith(".tmp")]


async def test_a_name_of_the_longest_allowed_length_is_written(root: Path) -> None:
    name = "n" * 255  # the temporary file's name must not be longer than this one
    results = await call_tools(
        WorkspaceContextProvider(root),
        ("write_file", {"path": name, "content": "long"}),
        ("read_file", {"path": name}),
    )
    assert results == [f"wrote 4 bytes to {name}", "long"]


async def test_symlinks_are_followed_while_they_stay_beneath_the_root(
    root: Path, outside: Path
) -> None:
    (root / "src" / "up.md").symlink_to("../notes.md")
    (root / "src" / "sideways").symlink_to("../src", target_is_directory=True)
    (root / "src" / "climb.txt").symlink_to("../../outside/secret.txt")
    (root / "src" / "chain.md").symlink_to("up.md")
    (root / "abs_in").symlink_to(root / "src", target_is_directory=True)
    (root / "zero.md").symlink_to("/dev/zero")
    results = await call_tools(
        WorkspaceContextProvider(root),
        ("read_file", {"path": "src/up.md"}),
        ("read_file", {"path": "src/chain.md"}),
        ("list_files", {"path": "src/sideways/sideways"}),
        ("read_file", {"path": "abs_in/main.py"}),
        ("write_file", {"path": "abs_in/made.txt", "content": "here"}),
        ("read_file", {"path": "src/climb.txt"}),
        ("read_file", {"path": "zero.md"}),
        ("write_file", {"path": "zero.md", "content": "x"}),
    )
    assert results[:2] == ["# Notes\nbuy milk\n"] * 2
    assert "main.py" in results[2].splitlines()
    assert results[3] == "print('hi')\n"
    assert results[4] == "wrote 4 bytes to src/made.txt"  # the path beneath the root
    assert (root / "src" / "made.txt").read_text() == "here"
    for refused in results[5:]:
        assert "leads outside the workspace" in refused
        assert_no_leak(refused, root, outside)


async def test_two_workspaces_in_one_agent_with_tool_prefixes(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "f.txt").write_text("in a")
    (tmp_path / "b" / "f.txt").write_text("in b")
    first = WorkspaceContextProvider(tmp_path / "a", tool_prefix="a_")
    second = WorkspaceContextProvider(tmp_path / "b", tool_prefix="b_", writable=False)
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(
                ToolCall("1", "a_read_file", '{"path": "f.txt"}'),
                ToolCall("2", "b_read_file", '{"path": "f.txt"}'),
            ),
            "done",
        ]
    )
    response = await Agent(client, stack=[first, second]).run("go")
    assert [t.name for t in client.requests[0].options.tools] == [
        "a_read_file",
        "a_write_file",
        "a_list_files",
        "b_read_file",
        "b_list_files",
    ]
    system = client.requests[0].messages[0].content or ""
    assert "with the tools a_read_file, a_write_file, a_list_files;" in system
    assert "with the tools b_read_file, b_list_files;" in system
    assert [m.content for m in response.messages if m.role == "tool"] == ["in a", "in b"]
    with pytest.raises(TypeError, match="tool_prefix"):
        WorkspaceContextProvider(tmp_path, tool_prefix=None)  # type: ignore[arg-type]


async def test_symlinks_back_to_the_root_are_folders(root: Path) -> None:
    (root / "self").symlink_to(root, target_is_directory=True)
    (root / "dot").symlink_to(".", target_is_directory=True)
    (root / "src" / "up").symlink_to("..", target_is_directory=True)
    results = await call_tools(
        WorkspaceContextProvider(root),
        ("read_file", {"path": "self"}),
        ("read_file", {"path": "dot"}),
        ("read_file", {"path": "src/up"}),
        ("write_file", {"path": "self", "content": "x"}),
        ("read_file", {"path": "src/up/src/up/self/dot/notes.md"}),
        ("list_files", {"path": "src/up"}),
    )
    for result in results[:4]:
        assert result.endswith("is a folder, not a file"), result
    assert results[4] == "# Notes\nbuy milk\n"
    assert "notes.md" in results[5].splitlines()
    assert (root / "self").is_symlink()


async def test_absolute_symlinks_may_spell_the_root_as_it_was_given(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "notes.md").write_text("hello")
    spelled = tmp_path / "spelled"
    spelled.symlink_to(real, target_is_directory=True)
    (real / "via-given.md").symlink_to(spelled / "notes.md")
    (real / "via-real.md").symlink_to(real / "notes.md")
    results = await call_tools(
        WorkspaceContextProvider(spelled),
        ("read_file", {"path": "via-given.md"}),
        ("read_file", {"path": "via-real.md"}),
    )
    assert results == ["hello", "hello"]
