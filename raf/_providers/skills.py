"""AgentSkillsProvider: folders with a SKILL.md the model can discover and load on demand."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.to_thread
import attrs
import yaml

from raf._agent.tools import FunctionTool, tool
from raf._log import log as _log
from raf._onion.compose import ContextProvider
from raf._providers._front_matter import DuplicateKey, FrontMatterLoader
from raf._providers._paths import Sandbox, checked_root, shown
from raf._sessions.base import Session
from raf._values.context import ContextResult
from raf._values.messages import ChatMessage
from raf._values.options import AgentRunOptions
from raf.errors import ConfigError, PathError

if TYPE_CHECKING:
    from raf._values.context import AgentLike

__all__ = ["AgentSkillsProvider"]

SKILL_FILE = "SKILL.md"
DEFAULT_MAX_BYTES = 1_000_000
_RESOURCE_LISTING = 50


@attrs.frozen(slots=True)
class Skill:
    """One skill: its name and description (from the front matter), body and folder.

    ``folder`` is the skill's folder as listed in the skills root; it may be
    a symlink to another folder beneath that root.
    """

    name: str
    description: str
    body: str
    folder: Path = attrs.field(repr=False)


def parse_skill_file(text: str, source: str) -> tuple[dict[str, Any], str]:
    """Split a SKILL.md into its front matter (a YAML mapping) and its body.

    The front matter is the block between a first line ``---`` and the next
    ``---``, read with ``yaml.safe_load`` rules; it must be a mapping with
    a non-empty text ``name`` and ``description`` (both stripped), and may
    hold any other keys (``license``, ``allowed-tools``, ``metadata``, ...)
    as YAML values. Anything else is a :class:`ConfigError` naming
    ``source`` and, for YAML errors, the line in the file.

    >>> text = "---\\nname: pdf  # the id\\ndescription: 'PDF forms'\\n---\\nUse it."
    >>> fields, body = parse_skill_file(text, "x")
    >>> fields["name"], fields["description"], body
    ('pdf', 'PDF forms', 'Use it.')
    """
    lines = text.removeprefix("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ConfigError(f"{source}: the file must start with a '---' front matter line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ConfigError(f"{source}: the front matter has no closing '---' line") from None
    try:
        fields = yaml.load("\n".join(lines[1:end]), Loader=FrontMatterLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 2}: " if mark is not None else ""  # +2: the '---' line, 1-based
        problem = getattr(exc, "problem", None) or str(exc)
        if not isinstance(exc, DuplicateKey):
            problem = f"the front matter is not valid YAML: {problem}"
        raise ConfigError(f"{source}: {where}{problem}") from None
    except RecursionError:
        raise ConfigError(f"{source}: the front matter is nested too deeply") from None
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        raise ConfigError(
            f"{source}: the front matter must be 'key: value' lines (a YAML mapping), "
            f"got {type(fields).__name__}"
        )
    for required in ("name", "description"):
        value = fields.get(required)
        if value is not None and not isinstance(value, str):
            raise ConfigError(
                f"{source}: {required!r} must be text, got {type(value).__name__} {value!r}"[:300]
            )
        if not value or not value.strip():
            raise ConfigError(f"{source}: the front matter needs a non-empty {required!r}")
        fields[required] = value.strip()
    return {str(k): v for k, v in fields.items()}, "\n".join(lines[end + 1 :]).strip("\n")


class AgentSkillsProvider(ContextProvider):
    """Skills: each folder under ``root`` holding a ``SKILL.md`` is one skill.

    The instructions list every skill's name and description; the model
    calls ``load_skill(name)`` for a skill's instructions (the body of its
    ``SKILL.md``, with a list of the folder's other files) and
    ``read_skill_resource(skill, path)`` for one of those files (both names
    preceded by ``tool_prefix``). Every read is confined to ``root`` — not
    to the skill's folder as symlinks resolve it — and walked from an open
    descriptor of ``root``, as the workspace's. Skills are discovered on
    first use and cached; :meth:`refresh` looks again. A ``SKILL.md`` that
    cannot be read or parsed, or whose name another skill has taken, is
    skipped with a warning (structlog logger ``raf``, event
    ``skill.skipped``, with ``file`` and ``reason``); the others still load.

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
        tool_prefix: str = "",
        name: str | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        self.root = checked_root("AgentSkillsProvider", "skills root", root, max_bytes, tool_prefix)
        self.max_bytes = max_bytes
        self.tool_prefix = tool_prefix
        self._sandbox = Sandbox(self.root, "the skills folder", given=root)
        self._skills: dict[str, Skill] | None = None
        self._lock = anyio.Lock()
        self.tools: tuple[FunctionTool, ...] = self._make_tools()

    async def skills(self) -> dict[str, Skill]:
        """The skills by name (discovered on the first call)."""
        if self._skills is None:
            async with self._lock:
                if self._skills is None:
                    self._skills = await anyio.to_thread.run_sync(
                        self._discover, abandon_on_cancel=True
                    )
        return self._skills

    async def refresh(self) -> dict[str, Skill]:
        """Discover the skills again (after folders were added or edited)."""
        async with self._lock:
            self._skills = await anyio.to_thread.run_sync(self._discover, abandon_on_cancel=True)
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
        load, read = (t.name for t in self.tools)
        instructions = (
            "You have skills: packaged instructions for particular tasks. When a task "
            f"matches a skill, call {load} with its name before you start, and "
            f"{read} for files it refers to.\n"
            f"Available skills:\n{listing}"
        )
        return ContextResult(instructions=instructions, tools=self.tools)

    # The methods below run in a worker thread.

    def _discover(self) -> dict[str, Skill]:
        found: dict[str, Skill] = {}
        for entry in self._sandbox.listing((), label="'.'", where="the skills folder"):
            name = entry.removesuffix("/")
            skill_file = self.root / name / SKILL_FILE
            try:
                skill = self._load(name)
            except (PathError, ConfigError) as exc:
                _log.warning("skill.skipped", file=str(skill_file), reason=str(exc))
                continue
            if skill is None:
                continue
            if skill.name in found:
                other = found[skill.name].folder / SKILL_FILE
                _log.warning(
                    "skill.skipped",
                    file=str(skill_file),
                    reason=f"the skill name {skill.name!r} is taken by {other}",
                )
                continue
            found[skill.name] = skill
        return found

    def _load(self, name: str) -> Skill | None:
        """The skill in the entry ``name`` of the root; ``None`` when it holds no SKILL.md."""
        label = shown(f"{name}/{SKILL_FILE}")
        try:
            folder = self._sandbox.open_folder(
                (name,), label=label, where="the skills folder", verb="read"
            )
        except PathError:
            # Not a folder: a file, or a symlink to one. A symlink to a folder
            # outside the root is a skill folder the sandbox refuses: say so.
            # (isdir follows symlinks, but only looks: it reads nothing.)
            if not os.path.isdir(self.root / name):
                return None
            raise
        try:
            os.stat(SKILL_FILE, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise PathError(f"{label} cannot be read: {exc.strerror}") from None
        finally:
            os.close(folder)
        _, data = self._sandbox.read(
            (name, SKILL_FILE), label=label, where="the skills folder", max_bytes=self.max_bytes
        )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise PathError(f"{label} is not UTF-8 text") from None
        fields, body = parse_skill_file(text, f"{name}/{SKILL_FILE}")
        return Skill(fields["name"], fields["description"], body, self.root / name)

    def _resources(self, skill: Skill) -> list[str]:
        """The files of a skill's folder but its SKILL.md, walked beneath the root."""
        folder = self._sandbox.open_folder(
            (skill.folder.name,), label=repr(skill.name), where="the skills folder", verb="list"
        )
        files: list[str] = []
        try:
            # fwalk from the open folder: it never descends through a symlink.
            for directory, subfolders, names, _ in os.fwalk(
                ".", dir_fd=folder, follow_symlinks=False
            ):
                subfolders.sort()
                prefix = directory.removeprefix(".").removeprefix("/")
                for name in sorted(names):
                    relative = f"{prefix}/{name}" if prefix else name
                    if relative != SKILL_FILE:
                        files.append(relative)
        finally:
            os.close(folder)
        if len(files) > _RESOURCE_LISTING:
            return [*files[:_RESOURCE_LISTING], f"... and {len(files) - _RESOURCE_LISTING} more"]
        return files

    def _read_resource(self, skill: Skill, path: str) -> str:
        where = f"skill {skill.name!r}"
        names = self._sandbox.split(path, where)
        label = shown(path)
        _, data = self._sandbox.read(
            (skill.folder.name, *names), label=label, where=where, max_bytes=self.max_bytes
        )
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise PathError(f"{label} is not UTF-8 text") from None

    async def _skill(self, name: str) -> Skill:
        skills = await self.skills()
        skill = skills.get(name)
        if skill is None:
            known = ", ".join(repr(n) for n in skills) or "none"
            raise PathError(f"there is no skill named {shown(str(name))} (skills: {known})")
        return skill

    def _make_tools(self) -> tuple[FunctionTool, ...]:
        provider = self
        read_name = f"{self.tool_prefix}read_skill_resource"

        @tool(name=f"{self.tool_prefix}load_skill")
        async def load_skill(name: Annotated[str, "the skill's name, as listed"]) -> str:
            """Load a skill's instructions."""
            skill = await provider._skill(name)
            files = await anyio.to_thread.run_sync(
                provider._resources, skill, abandon_on_cancel=True
            )
            if not files:
                return skill.body
            return (
                f"{skill.body}\n\nFiles of this skill (read them with {read_name}):\n"
                + "\n".join(files)
            )

        @tool(name=read_name)
        async def read_skill_resource(
            skill: Annotated[str, "the skill's name"],
            path: Annotated[str, "a file path relative to the skill's folder"],
        ) -> str:
            """Read a file that belongs to a skill."""
            found = await provider._skill(skill)
            return await anyio.to_thread.run_sync(
                provider._read_resource, found, path, abandon_on_cancel=True
            )

        return (load_skill, read_skill_resource)
