"""AgentSkillsProvider through real Agent runs: discovery, load_skill, read_skill_resource."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from raf import Agent, AgentSkillsProvider, ScriptedChatClient, ToolCall
from raf.errors import ConfigError
from tests._harness.scripting import call_tools

pytestmark = pytest.mark.anyio

PDF_SKILL = """---
name: pdf-forms
description: "Fill in PDF forms: find the fields, then write them"
license: MIT
metadata:
  owner: docs team
---
# Filling PDF forms

1. Read `reference/fields.md`.
"""


def skills_root(root: Path, text: str) -> Path:
    """A skills root whose one folder, ``demo``, holds a SKILL.md with ``text``."""
    (root / "demo").mkdir(parents=True)
    (root / "demo" / "SKILL.md").write_text(text, encoding="utf-8")
    return root


async def load_one(root: Path, text: str) -> Any:
    """The skill a SKILL.md with ``text`` is read as."""
    [skill] = (await AgentSkillsProvider(skills_root(root, text)).skills()).values()
    return skill


async def skipped_because(root: Path, text: str) -> str:
    """Why a SKILL.md with ``text`` is skipped (the ``skill.skipped`` warning's reason)."""
    with capture_logs() as logs:
        assert await AgentSkillsProvider(skills_root(root, text)).skills() == {}
    [event] = [e for e in logs if e["event"] == "skill.skipped"]
    assert event["log_level"] == "warning"
    return str(event["reason"])


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    folder = tmp_path / "skills"
    (folder / "pdf").mkdir(parents=True)
    (folder / "pdf" / "SKILL.md").write_text(PDF_SKILL)
    (folder / "pdf" / "reference").mkdir()
    (folder / "pdf" / "reference" / "fields.md").write_text("Field list: name, date.")
    (folder / "pdf" / "escape.txt").symlink_to(outside / "secret.txt")
    (folder / "pdf" / "out").symlink_to(outside, target_is_directory=True)
    (folder / "commits").mkdir()
    (folder / "commits" / "SKILL.md").write_text(
        "---\nname: commit-messages\ndescription: Write good commit messages\n---\nBe brief."
    )
    (folder / "not-a-skill").mkdir()
    (folder / "README.md").write_text("not a skill either")
    return folder


async def test_instructions_list_every_skill(root: Path) -> None:
    client = ScriptedChatClient(["ok"])
    await Agent(client, stack=[AgentSkillsProvider(root)]).run("hi")
    system = client.requests[0].messages[0].content or ""
    assert "- commit-messages: Write good commit messages" in system
    assert "- pdf-forms: Fill in PDF forms: find the fields, then write them" in system
    assert "not-a-skill" not in system
    tools = [t.name for t in client.requests[0].options.tools]
    assert tools == ["load_skill", "read_skill_resource"]


async def test_model_loads_a_skill_and_reads_its_resource(root: Path) -> None:
    results = await call_tools(
        AgentSkillsProvider(root),
        ("load_skill", {"name": "pdf-forms"}),
        ("read_skill_resource", {"skill": "pdf-forms", "path": "reference/fields.md"}),
    )
    assert results[0].startswith("# Filling PDF forms\n\n1. Read `reference/fields.md`.")
    assert "reference/fields.md" in results[0].split("Files of this skill")[1]
    assert results[1] == "Field list: name, date."


async def test_unknown_skill_lists_the_known_ones(root: Path) -> None:
    [result] = await call_tools(AgentSkillsProvider(root), ("load_skill", {"name": "excel"}))
    assert "there is no skill named 'excel' (skills: 'commit-messages', 'pdf-forms')" in result


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("../commits/SKILL.md", "uses '..'"),
        ("escape.txt", "leads outside the skills folder"),
        ("out/secret.txt", "leads outside the skills folder"),
        ("/etc/passwd", "is absolute"),
        ("fields\x00.md", "NUL byte"),
        ("fields\ud800.md", "lone surrogate"),
        ("reference", "is a folder"),
        ("nope.md", "there is no file 'nope.md' in skill 'pdf-forms'"),
    ],
)
async def test_resource_reads_stay_in_the_skill_folder(
    root: Path, outside: Path, path: str, expected: str
) -> None:
    [result] = await call_tools(
        AgentSkillsProvider(root), ("read_skill_resource", {"skill": "pdf-forms", "path": path})
    )
    assert result.startswith("Error: tool 'read_skill_resource' failed: PathError:")
    assert expected in result
    assert "top secret" not in result
    assert str(root) not in result
    assert str(outside) not in result


async def test_resource_size_limit(root: Path) -> None:
    (root / "pdf" / "big.txt").write_text("x" * 500)
    [result] = await call_tools(
        AgentSkillsProvider(root, max_bytes=300),
        ("read_skill_resource", {"skill": "pdf-forms", "path": "big.txt"}),
    )
    assert "more than the limit of 300 bytes" in result


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\ndescription: y\n", "must start with a '---'"),
        ("---\nname: x\ndescription: y\n", "no closing '---'"),
        ("---\nname x\ndescription: y\n---\n", "line 3: the front matter is not valid YAML"),
        ("---\nname: x\n---\n", "needs a non-empty 'description'"),
        ("---\nname: ''\ndescription: y\n---\n", "needs a non-empty 'name'"),
        ("---\nname: '  '\ndescription: y\n---\n", "needs a non-empty 'name'"),
        ('---\nname: "x\ndescription: y\n---\n', "not valid YAML: found unexpected end"),
        ("---\nname: x\nname: z\ndescription: y\n---\n", "line 3: 'name' is given twice"),
        ("---\nname: x\ndescription: |-\n---\n", "needs a non-empty 'description'"),
        ("---\nname: [x]\ndescription: y\n---\n", "'name' must be text, got list"),
        ("---\nname: 12\ndescription: y\n---\n", "'name' must be text, got int"),
        ("---\n- name: x\n---\n", "must be 'key: value' lines (a YAML mapping), got list"),
        ("---\njust words\n---\n", "must be 'key: value' lines (a YAML mapping), got str"),
        ("---\n---\n", "needs a non-empty 'name'"),
        # Nested deeper than Python's recursion limit (5,000 cost 1.1 s of parsing, as 1,500 does).
        ("---\nname: x\ndescription: " + "[" * sys.getrecursionlimit() + "\n---\n", "SKILL.md: "),
        ("---\nname: !!python/object:os.system x\ndescription: y\n---\n", "not valid YAML"),
    ],
)
async def test_malformed_front_matter_is_a_clear_error(
    tmp_path: Path, text: str, expected: str
) -> None:
    reason = await skipped_because(tmp_path, text)
    assert reason.startswith("demo/SKILL.md")
    assert expected in reason


async def test_front_matter_values(tmp_path: Path) -> None:
    """Other keys (YAML lists, mappings) are allowed beside the name and description."""
    skill = await load_one(
        tmp_path,
        "\ufeff---\nname: 'it''s'\n# comment\ndescription: one\n  two\n"
        "allowed-tools: [Read, Write]\nmetadata:\n  owner: docs\n---\n\nBody\n",
    )
    assert (skill.name, skill.description, skill.body) == ("it's", "one two", "Body")


async def test_block_values(tmp_path: Path) -> None:
    folded = await load_one(tmp_path / "a", "---\nname: x\ndescription: >\n  one\n  two\n---\n")
    literal = await load_one(tmp_path / "b", "---\nname: x\ndescription: |\n  one\n  two\n---\n")
    assert folded.description == "one two"
    assert literal.description == "one\ntwo"


async def test_valid_yaml_is_read_as_yaml(tmp_path: Path) -> None:
    """Quoted values with a comment after them, flow and block styles: what YAML says."""
    skill = await load_one(
        tmp_path,
        '---\nname: "pdf"  # id\ndescription: >-\n  Fill in\n  forms\n'
        "license: 'MIT'  # see LICENSE\ntags: {a: 1}\n---\nbody",
    )
    assert (skill.name, skill.description, skill.body) == ("pdf", "Fill in forms", "body")


async def test_a_bad_skill_is_skipped_with_a_warning_and_the_others_load(root: Path) -> None:
    (root / "broken").mkdir()
    (root / "broken" / "SKILL.md").write_text("no front matter")
    (root / "latin").mkdir()
    (root / "latin" / "SKILL.md").write_bytes(b"---\nname: caf\xe9\ndescription: d\n---\n")
    client = ScriptedChatClient(["ok"])
    agent = Agent(client, stack=[AgentSkillsProvider(root, name="skills")])
    with capture_logs() as logs:
        await agent.run("hi")
    system = client.requests[0].messages[0].content or ""
    assert "- pdf-forms:" in system
    assert "- commit-messages:" in system
    skipped = {Path(e["file"]).parent.name: e for e in logs if e["event"] == "skill.skipped"}
    assert sorted(skipped) == ["broken", "latin"]
    assert skipped["broken"]["log_level"] == "warning"
    assert skipped["broken"]["file"] == str(root / "broken" / "SKILL.md")
    assert "must start with a '---' front matter line" in skipped["broken"]["reason"]
    assert "is not UTF-8 text" in skipped["latin"]["reason"]


async def test_a_second_skill_with_a_taken_name_is_skipped(root: Path) -> None:
    (root / "pdf2").mkdir()
    (root / "pdf2" / "SKILL.md").write_text(PDF_SKILL.replace("Filling", "Other"))
    with capture_logs() as logs:
        skills = await AgentSkillsProvider(root).skills()
    assert skills["pdf-forms"].body.startswith("# Filling PDF forms")
    assert skills["pdf-forms"].folder == root / "pdf"
    [event] = [e for e in logs if e["event"] == "skill.skipped"]
    assert event["file"] == str(root / "pdf2" / "SKILL.md")
    assert "the skill name 'pdf-forms' is taken by" in event["reason"]


async def test_refresh_sees_new_skills_and_empty_root_adds_nothing(tmp_path: Path) -> None:
    provider = AgentSkillsProvider(tmp_path)
    result = await provider.on_invoking(None, None, (), None)  # type: ignore[arg-type]
    assert result.instructions is None
    assert result.tools == ()
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "SKILL.md").write_text("---\nname: new\ndescription: d\n---\nB")
    assert list(await provider.skills()) == []  # cached until refreshed
    assert list(await provider.refresh()) == ["new"]


def test_root_must_be_a_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        AgentSkillsProvider(tmp_path / "missing")


async def test_a_comment_after_a_plain_value_is_not_part_of_it(tmp_path: Path) -> None:
    text = (
        "---\nname: pdf-forms  # the folder's name\n"
        "description: Fill in C# forms # TODO: say more\n"
        "license: MIT # see LICENSE\n---\nbody"
    )
    skill = await load_one(tmp_path / "a", text)
    assert skill.name == "pdf-forms"
    assert skill.description == "Fill in C# forms"
    quoted = await load_one(tmp_path / "b", "---\nname: 'a # b'\ndescription: \"c # d\"\n---\n")
    assert (quoted.name, quoted.description) == ("a # b", "c # d")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A folder outside the skills root that looks like a skill, with a private file."""
    folder = tmp_path / "home"
    folder.mkdir()
    (folder / "SKILL.md").write_text("---\nname: home\ndescription: my home\n---\nsecret body")
    (folder / ".ssh").mkdir()
    (folder / ".ssh" / "id_rsa").write_text("PRIVATE KEY")
    return folder


async def test_a_symlinked_skill_folder_leading_outside_is_skipped(root: Path, home: Path) -> None:
    (root / "proj").symlink_to("../home", target_is_directory=True)
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(
                ToolCall("1", "load_skill", '{"name": "home"}'),
                ToolCall("2", "read_skill_resource", '{"skill": "home", "path": ".ssh/id_rsa"}'),
            ),
            "done",
        ]
    )
    with capture_logs() as logs:
        response = await Agent(client, stack=[AgentSkillsProvider(root)]).run("hi")
    system = client.requests[0].messages[0].content or ""
    assert "home" not in system
    for message in response.messages:
        assert "PRIVATE KEY" not in (message.content or "")
        assert "secret body" not in (message.content or "")
    [event] = [e for e in logs if e["event"] == "skill.skipped"]
    assert event["file"] == str(root / "proj" / "SKILL.md")
    assert "leads outside the skills folder" in event["reason"]


async def test_reads_are_confined_to_the_skills_root_not_the_skill_folder(
    root: Path, outside: Path
) -> None:
    (root / "alias").symlink_to("commits", target_is_directory=True)
    (root / "pdf" / "shared.md").symlink_to("../commits/SKILL.md")
    with capture_logs() as logs:
        results = await call_tools(
            AgentSkillsProvider(root),
            ("read_skill_resource", {"skill": "pdf-forms", "path": "shared.md"}),
            ("read_skill_resource", {"skill": "pdf-forms", "path": "escape.txt"}),
        )
    # a symlink to a sibling skill stays beneath the skills root: it is read
    assert results[0].startswith("---\nname: commit-messages")
    assert "leads outside the skills folder" in results[1]
    assert "top secret" not in results[1]
    # a symlink to another skill's folder is that skill again: its name is taken
    [event] = [e for e in logs if e["event"] == "skill.skipped"]
    assert event["file"] == str(root / "commits" / "SKILL.md")
    assert "'commit-messages' is taken by" in event["reason"]


async def test_a_hard_linked_resource_is_not_read(root: Path, outside: Path) -> None:
    os.link(outside / "secret.txt", root / "pdf" / "hard.txt")
    [result] = await call_tools(
        AgentSkillsProvider(root),
        ("read_skill_resource", {"skill": "pdf-forms", "path": "hard.txt"}),
    )
    assert "'hard.txt' has 2 hard links" in result
    assert "top secret" not in result


@pytest.mark.parametrize(
    "path", ["a" * 300, "reference/" + "a" * 300, "SKILL.md/x", "/".join(["d" * 200] * 30)]
)
async def test_resource_errors_name_only_the_path_the_model_gave(root: Path, path: str) -> None:
    [result] = await call_tools(
        AgentSkillsProvider(root), ("read_skill_resource", {"skill": "pdf-forms", "path": path})
    )
    assert result.startswith("Error: tool 'read_skill_resource' failed: PathError: "), result
    assert str(root.parent) not in result
    assert "/tmp" not in result


async def test_the_resource_listing_does_not_follow_symlinks_out(root: Path) -> None:
    [result] = await call_tools(AgentSkillsProvider(root), ("load_skill", {"name": "pdf-forms"}))
    files = result.split("Files of this skill (read them with read_skill_resource):\n")[1]
    assert files.splitlines() == ["escape.txt", "reference/fields.md"]


async def test_two_skill_roots_in_one_agent_with_tool_prefixes(root: Path, tmp_path: Path) -> None:
    other = tmp_path / "team-skills"
    (other / "deploy").mkdir(parents=True)
    (other / "deploy" / "SKILL.md").write_text("---\nname: deploy\ndescription: Ship it\n---\nGo.")
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(
                ToolCall("1", "load_skill", '{"name": "commit-messages"}'),
                ToolCall("2", "team_load_skill", '{"name": "deploy"}'),
            ),
            "done",
        ]
    )
    stack = [AgentSkillsProvider(root), AgentSkillsProvider(other, tool_prefix="team_")]
    response = await Agent(client, stack=stack).run("hi")
    assert [t.name for t in client.requests[0].options.tools] == [
        "load_skill",
        "read_skill_resource",
        "team_load_skill",
        "team_read_skill_resource",
    ]
    system = client.requests[0].messages[0].content or ""
    assert "call team_load_skill with its name" in system
    assert "team_read_skill_resource for files" in system
    assert [m.content for m in response.messages if m.role == "tool"] == ["Be brief.", "Go."]
