"""AgentSkillsProvider: folders with a SKILL.md the model can discover and load on demand."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import anyio
import anyio.to_thread
import attrs

from raf.builtin._paths import read_confined_text
from raf.context import ContextResult
from raf.errors import ConfigError, PathError
from raf.messages import ChatMessage
from raf.options import AgentRunOptions
from raf.providers import ContextProvider
from raf.sessions.base import Session
from raf.tools import FunctionTool, tool

if TYPE_CHECKING:
    from raf.context import AgentLike

__all__ = ["AgentSkillsProvider", "Skill", "parse_skill_file"]

SKILL_FILE = "SKILL.md"
DEFAULT_MAX_BYTES = 1_000_000
_RESOURCE_LISTING = 50
_COMMENT = re.compile(r"(?:^|\s+)#.*$")


@attrs.frozen(slots=True)
class Skill:
    """One skill: its name and description (from the front matter), body and folder."""

    name: str
    description: str
    body: str
    folder: Path = attrs.field(repr=False)


def parse_skill_file(text: str, source: str) -> tuple[dict[str, str], str]:
    """Split a SKILL.md into its front matter fields and its body.

    The front matter is the block between a first line ``---`` and the next
    ``---``; each entry is ``key: value`` (values may be quoted; `` #`` after
    a plain value starts a comment; indented lines continue the previous
    value; nested blocks under a key with no value are skipped). Anything
    else is a :class:`ConfigError` naming ``source`` and the line.

    >>> text = "---\\nname: pdf\\ndescription: 'PDF forms'\\n---\\nUse it."
    >>> fields, body = parse_skill_file(text, "x")
    >>> fields["description"], body
    ('PDF forms', 'Use it.')
    """
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ConfigError(f"{source}: the file must start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ConfigError(f"{source}: the front matter has no closing '---' line") from None
    fields: dict[str, str] = {}
    key: str | None = None
    mode = "plain"  # how indented lines continue the value: plain, folded, literal, nested
    for number in range(1, end):
        line = lines[number]
        if line[:1] in (" ", "\t") and line.strip():
            if key is None:
                raise ConfigError(f"{source}: line {number + 1}: indented line without a key")
            if mode == "literal":
                fields[key] = f"{fields[key]}\n{line.strip()}" if fields[key] else line.strip()
            elif mode != "nested":
                fields[key] = f"{fields[key]} {line.strip()}".strip()
            continue
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not name or " " in name:
            raise ConfigError(
                f"{source}: line {number + 1}: expected 'key: value' in the front matter, "
                f"got {line.strip()!r}"
            )
        if name in fields:
            raise ConfigError(f"{source}: line {number + 1}: {name!r} is given twice")
        key = name
        value = value.strip()
        if value[:1] not in ("'", '"'):
            # As in YAML, " #" starts a comment after a plain value ("C#" stays).
            value = _COMMENT.sub("", value)
        if value in ("", ">", ">-", ">+", "|", "|-", "|+"):
            mode = {"": "nested", "|": "literal"}.get(value[:1], "folded")
            fields[name] = ""
        elif name in ("name", "description"):
            mode = "plain"
            fields[name] = _unquote(value, source, number + 1)
        else:
            mode = "plain"
            fields[name] = value  # other keys (license, allowed-tools, ...) are kept raw
    for required in ("name", "description"):
        if not fields.get(required):
            raise ConfigError(f"{source}: the front matter needs a non-empty {required!r}")
    return fields, "\n".join(lines[end + 1 :]).strip("\n")


def _unquote(value: str, source: str, line: int) -> str:
    if value[:1] == '"':
        try:
            text = json.loads(value)
        except ValueError:
            raise ConfigError(f"{source}: line {line}: badly quoted value {value}") from None
        if not isinstance(text, str):  # pragma: no cover - a '"' start always decodes to str
            raise ConfigError(f"{source}: line {line}: badly quoted value {value}")
        return text
    if value[:1] == "'":
        if len(value) < 2 or value[-1] != "'":
            raise ConfigError(f"{source}: line {line}: badly quoted value {value}")
        return value[1:-1].replace("''", "'")
    if value[:1] in ("[", "{", "&", "*", "!"):
        raise ConfigError(f"{source}: line {line}: this value must be text, got {value!r}")
    return value


class AgentSkillsProvider(ContextProvider):
    """Skills: each folder under ``root`` holding a ``SKILL.md`` is one skill.

    The instructions list every skill's name and description; the model
    calls ``load_skill(name)`` for a skill's instructions (the body of its
    ``SKILL.md``, with a list of the folder's other files) and
    ``read_skill_resource(skill, path)`` for one of those files. Reads stay
    inside the skill's folder. Skills are discovered on first use and
    cached; :meth:`refresh` looks again. Malformed front matter is a
    :class:`ConfigError` naming the file.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     [t.name for t in AgentSkillsProvider(folder).tools]
    ['load_skill', 'read_skill_resource']
    """

    kind = "skills"

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        name: str | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ConfigError(f"skills root {str(root)!r} is not a directory")
        self.max_bytes = max_bytes
        self._skills: dict[str, Skill] | None = None
        self._lock = anyio.Lock()
        self.tools: tuple[FunctionTool, ...] = self._make_tools()

    async def skills(self) -> dict[str, Skill]:
        """The skills by name (discovered on the first call)."""
        if self._skills is None:
            async with self._lock:
                if self._skills is None:
                    self._skills = await anyio.to_thread.run_sync(self._discover)
        return self._skills

    async def refresh(self) -> dict[str, Skill]:
        """Discover the skills again (after folders were added or edited)."""
        async with self._lock:
            self._skills = await anyio.to_thread.run_sync(self._discover)
        return self._skills

    async def on_invoking(
        self,
        agent: AgentLike | None,
        session: Session,
        messages: Sequence[ChatMessage],
        options: AgentRunOptions,
    ) -> ContextResult:
        """Instructions listing the skills, and the two skill tools."""
        skills = await self.skills()
        if not skills:
            return ContextResult()
        listing = "\n".join(
            f"- {s.name}: {' '.join(s.description.split())}" for s in skills.values()
        )
        instructions = (
            "You have skills: packaged instructions for particular tasks. When a task "
            "matches a skill, call load_skill with its name before you start, and "
            "read_skill_resource for files it refers to.\n"
            f"Available skills:\n{listing}"
        )
        return ContextResult(instructions=instructions, tools=self.tools)

    def _discover(self) -> dict[str, Skill]:
        found: dict[str, Skill] = {}
        for folder in sorted(self.root.iterdir()):
            skill_file = folder / SKILL_FILE
            if not folder.is_dir() or not skill_file.is_file():
                continue
            try:
                text = skill_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{skill_file}: cannot be read: {exc}") from None
            fields, body = parse_skill_file(text, str(skill_file))
            skill = Skill(fields["name"], fields["description"], body, folder.resolve())
            if skill.name in found:
                other = found[skill.name].folder / SKILL_FILE
                raise ConfigError(f"{skill_file}: skill name {skill.name!r} is taken by {other}")
            found[skill.name] = skill
        return found

    async def _skill(self, name: str) -> Skill:
        skills = await self.skills()
        skill = skills.get(name)
        if skill is None:
            known = ", ".join(repr(n) for n in skills) or "none"
            raise PathError(f"there is no skill named {name!r} (skills: {known})")
        return skill

    def _make_tools(self) -> tuple[FunctionTool, ...]:
        provider = self

        @tool(name="load_skill")
        async def load_skill(name: Annotated[str, "the skill's name, as listed"]) -> str:
            """Load a skill's instructions."""
            skill = await provider._skill(name)
            files = await anyio.to_thread.run_sync(_resource_listing, skill.folder)
            if not files:
                return skill.body
            return (
                f"{skill.body}\n\nFiles of this skill (read them with read_skill_resource):\n"
                + "\n".join(files)
            )

        @tool(name="read_skill_resource")
        async def read_skill_resource(
            skill: Annotated[str, "the skill's name"],
            path: Annotated[str, "a file path relative to the skill's folder"],
        ) -> str:
            """Read a file that belongs to a skill."""
            found = await provider._skill(skill)
            return await anyio.to_thread.run_sync(
                lambda: read_confined_text(
                    found.folder, path, where=f"skill {skill!r}", max_bytes=provider.max_bytes
                )
            )

        return (load_skill, read_skill_resource)


def _resource_listing(folder: Path) -> list[str]:
    files: list[str] = []
    for directory, subfolders, names in os.walk(folder):
        subfolders.sort()
        for name in sorted(names):
            relative = (Path(directory) / name).relative_to(folder).as_posix()
            if relative != SKILL_FILE:
                files.append(relative)
    if len(files) > _RESOURCE_LISTING:
        return [*files[:_RESOURCE_LISTING], f"... and {len(files) - _RESOURCE_LISTING} more"]
    return files
