"""Providers declared as data: ContextProviderDecl, the kind registry, and TOML loading."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import attrs

from raf.errors import ConfigError

__all__ = [
    "PROVIDER_KINDS",
    "ContextProviderDecl",
    "ProviderFactory",
    "ProviderOptions",
    "build_provider",
    "build_providers",
    "load_provider_decls",
    "parse_provider_decls",
    "register_provider_kind",
]

T = TypeVar("T")


def _frozen_options(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(
            f"ContextProviderDecl.options must be a mapping, got {type(value).__name__}"
        )
    return MappingProxyType(dict(value))


def _check_kind(_: object, __: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"ContextProviderDecl.kind must be a non-empty str, got {value!r}")


def _check_name(_: object, __: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"ContextProviderDecl.name must be a non-empty str or None, got {value!r}")


@attrs.frozen(slots=True)
class ContextProviderDecl:
    """A provider described as data: its ``kind``, an optional ``name``, its ``options``.

    ``base_dir`` is the folder relative path options are resolved against
    (the config file's folder when loaded from a file; the current
    directory when ``None``).

    >>> decl = ContextProviderDecl("memory", name="history")
    >>> build_provider(decl).name
    'history'
    """

    kind: str = attrs.field(validator=_check_kind)
    name: str | None = attrs.field(default=None, validator=_check_name)
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_options, hash=False)
    base_dir: Path | None = attrs.field(default=None, kw_only=True)


_NO_DEFAULT: Any = object()


class ProviderOptions:
    """A declaration's options, as a factory reads them.

    Each getter checks the type and raises a :class:`ConfigError` naming the
    kind, the option and what was expected; :func:`build_provider` then
    refuses options no getter asked for. ``chat_client`` is the client
    passed to :func:`build_provider`, for kinds that need a model.
    """

    def __init__(self, decl: ContextProviderDecl, chat_client: Any = None) -> None:
        self.decl = decl
        self.kind = decl.kind
        self.name = decl.name
        self.chat_client = chat_client
        #: The options a getter asked for.
        self.read: set[str] = set()

    def _error(self, option: str, expected: str, got: object = _NO_DEFAULT) -> ConfigError:
        where = f"provider kind {self.kind!r}" + (f" (name {self.name!r})" if self.name else "")
        if got is _NO_DEFAULT:
            return ConfigError(f"{where}: option {option!r} is required: {expected}")
        return ConfigError(f"{where}: option {option!r} must be {expected}, got {got!r}")

    def _get(self, option: str, default: Any, expected: str) -> Any:
        self.read.add(option)
        if option in self.decl.options:
            return self.decl.options[option]
        if default is _NO_DEFAULT:
            raise self._error(option, expected)
        return default

    def text(self, option: str, default: Any = _NO_DEFAULT, *, allow_empty: bool = False) -> Any:
        """A string (non-empty unless ``allow_empty``)."""
        expected = "a string" if allow_empty else "a non-empty string"
        value = self._get(option, default, expected)
        if value is not default and (not isinstance(value, str) or not (value or allow_empty)):
            raise self._error(option, expected, value)
        return value

    def integer(self, option: str, default: Any = _NO_DEFAULT, *, minimum: int = 1) -> Any:
        """An integer of at least ``minimum``."""
        expected = f"an integer >= {minimum}"
        value = self._get(option, default, expected)
        if value is not default and (
            not isinstance(value, int) or isinstance(value, bool) or value < minimum
        ):
            raise self._error(option, expected, value)
        return value

    def number(self, option: str, default: Any = _NO_DEFAULT) -> Any:
        """A positive number."""
        value = self._get(option, default, "a positive number")
        if value is not default and (
            not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0
        ):
            raise self._error(option, "a positive number", value)
        return value

    def flag(self, option: str, default: Any = _NO_DEFAULT) -> Any:
        """``true`` or ``false``."""
        value = self._get(option, default, "true or false")
        if value is not default and not isinstance(value, bool):
            raise self._error(option, "true or false", value)
        return value

    def choice(self, option: str, choices: Sequence[str], default: Any = _NO_DEFAULT) -> Any:
        """One of ``choices``."""
        expected = "one of " + ", ".join(repr(c) for c in choices)
        value = self._get(option, default, expected)
        if value is not default and value not in choices:
            raise self._error(option, expected, value)
        return value

    def text_list(self, option: str, default: Any = _NO_DEFAULT) -> Any:
        """A list of strings."""
        value = self._get(option, default, "a list of strings")
        if value is not default and (
            not isinstance(value, list) or not all(isinstance(v, str) for v in value)
        ):
            raise self._error(option, "a list of strings", value)
        return value

    def text_table(self, option: str, default: Any = _NO_DEFAULT) -> Any:
        """A table of string values."""
        value = self._get(option, default, "a table of strings")
        if value is not default and (
            not isinstance(value, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        ):
            raise self._error(option, "a table of strings", value)
        return value

    def path(self, option: str, default: Any = _NO_DEFAULT) -> Any:
        """A path; a relative one is resolved against the declaration's ``base_dir``."""
        value = self._get(option, default, "a path (a string)")
        if value is default:
            return value
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise self._error(option, "a path (a non-empty string)", value)
        path = Path(value).expanduser()
        if not path.is_absolute() and self.decl.base_dir is not None:
            path = self.decl.base_dir / path
        return path

    def unread(self) -> list[str]:
        """The options no getter asked for, sorted."""
        return sorted(set(self.decl.options) - self.read)


#: A factory builds one provider from its declaration's options.
ProviderFactory = Callable[[ProviderOptions], Any]


def _memory(o: ProviderOptions) -> Any:
    from raf.builtin.history import InMemoryHistoryProvider

    return InMemoryHistoryProvider(inject=o.flag("inject", True), name=o.name)


def _compression(o: ProviderOptions) -> Any:
    from raf.builtin.compression import (
        DEFAULT_SUMMARY_PROMPT,
        CompressionProvider,
        SummaryStrategy,
        TokenBudgetStrategy,
        TruncationStrategy,
    )

    strategy_name = o.choice("strategy", ("truncation", "token_budget", "summary"), "truncation")
    strategy: Any
    if strategy_name == "truncation":
        strategy = TruncationStrategy(o.integer("keep_last", 20))
    elif strategy_name == "token_budget":
        strategy = TokenBudgetStrategy(o.integer("max_tokens"))
    else:
        if o.chat_client is None:
            raise ConfigError(
                "provider kind 'compression': strategy 'summary' needs a chat client; "
                "pass chat_client= to build_provider"
            )
        strategy = SummaryStrategy(
            o.chat_client,
            o.integer("keep_last", 20),
            o.text("prompt", DEFAULT_SUMMARY_PROMPT),
            on_failure=o.choice("on_failure", ("truncate", "raise"), "truncate"),
        )
    return CompressionProvider(strategy, name=o.name)


def _skills(o: ProviderOptions) -> Any:
    from raf.builtin.skills import DEFAULT_MAX_BYTES, AgentSkillsProvider

    return AgentSkillsProvider(
        o.path("root"), max_bytes=o.integer("max_bytes", DEFAULT_MAX_BYTES), name=o.name
    )


def _workspace(o: ProviderOptions) -> Any:
    from raf.builtin.workspace import DEFAULT_MAX_BYTES, WorkspaceContextProvider

    return WorkspaceContextProvider(
        o.path("root"),
        writable=o.flag("writable", True),
        max_bytes=o.integer("max_bytes", DEFAULT_MAX_BYTES),
        name=o.name,
    )


def _knowledge(o: ProviderOptions) -> Any:
    from raf.builtin.knowledge import KnowledgeProvider

    return KnowledgeProvider.folder(o.path("root"), top_k=o.integer("top_k", 3), name=o.name)


def _wiki(o: ProviderOptions) -> Any:
    from raf.builtin.knowledge import KnowledgeProvider

    return KnowledgeProvider.wiki(o.path("root"), top_k=o.integer("top_k", 3), name=o.name)


def _mcp(o: ProviderOptions) -> Any:
    from raf.builtin.mcp import McpToolsProvider

    return McpToolsProvider(
        o.text("command"),
        o.text_list("args", []),
        env=o.text_table("env", None),
        cwd=o.path("cwd", None),
        tool_prefix=o.text("tool_prefix", "", allow_empty=True),
        timeout=o.number("timeout", 60.0),
        name=o.name,
    )


#: The built-in kinds; :func:`register_provider_kind` adds to it.
PROVIDER_KINDS: dict[str, ProviderFactory] = {
    "memory": _memory,
    "compression": _compression,
    "skills": _skills,
    "workspace": _workspace,
    "knowledge": _knowledge,
    "wiki": _wiki,
    "mcp": _mcp,
}


def register_provider_kind(
    kind: str,
    factory: ProviderFactory,
    *,
    registry: MutableMapping[str, ProviderFactory] | None = None,
    replace: bool = False,
) -> None:
    """Make ``kind`` buildable: ``factory(options)`` returns the provider.

    The factory reads its options with the :class:`ProviderOptions` getters,
    so a wrong or missing option gets a clear error, and an option it never
    asks for is refused as unknown. Registering a taken kind needs
    ``replace=True``.

    >>> from raf import ContextProvider
    >>> class Clock(ContextProvider):
    ...     kind = "clock"
    >>> registry = dict(PROVIDER_KINDS)
    >>> register_provider_kind("clock", lambda options: Clock(), registry=registry)
    >>> build_provider(ContextProviderDecl("clock"), registry).kind
    'clock'
    """
    target = PROVIDER_KINDS if registry is None else registry
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"kind must be a non-empty str, got {kind!r}")
    if not callable(factory):
        raise TypeError(f"the factory of kind {kind!r} must be callable, got {factory!r}")
    if kind in target and not replace:
        raise ValueError(f"provider kind {kind!r} is already registered; pass replace=True")
    target[kind] = factory


def build_provider(
    decl: ContextProviderDecl,
    registry: Mapping[str, ProviderFactory] | None = None,
    *,
    chat_client: Any = None,
) -> Any:
    """Build the provider ``decl`` declares, with the factory of its kind.

    An unknown kind, a wrong, missing or unknown option: :class:`ConfigError`
    saying which. ``decl.name`` becomes the provider's ``name``.
    ``chat_client`` is handed to factories that need a model (the
    ``summary`` compression strategy).
    """
    kinds = PROVIDER_KINDS if registry is None else registry
    factory = kinds.get(decl.kind)
    if factory is None:
        known = ", ".join(sorted(kinds)) or "none"
        raise ConfigError(f"unknown provider kind {decl.kind!r}; known kinds: {known}")
    options = ProviderOptions(decl, chat_client)
    try:
        provider = factory(options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"provider kind {decl.kind!r}: {exc}") from exc
    unread = options.unread()
    if unread:
        used = ", ".join(sorted(options.read)) or "none"
        raise ConfigError(
            f"provider kind {decl.kind!r}: unknown option(s) {', '.join(map(repr, unread))} "
            f"(options read here: {used})"
        )
    if decl.name is not None and getattr(provider, "name", None) != decl.name:
        try:
            provider.name = decl.name
        except AttributeError:
            raise ConfigError(
                f"provider kind {decl.kind!r}: the provider's name cannot be set to {decl.name!r}"
            ) from None
    return provider


def build_providers(
    decls: Iterable[ContextProviderDecl],
    registry: Mapping[str, ProviderFactory] | None = None,
    *,
    chat_client: Any = None,
) -> list[Any]:
    """Build each declaration in order (see :func:`build_provider`)."""
    return [build_provider(d, registry, chat_client=chat_client) for d in decls]


def parse_provider_decls(
    data: Mapping[str, Any], *, base_dir: Path | None = None, source: str = "config"
) -> list[ContextProviderDecl]:
    """The ``[[providers]]`` of parsed TOML (or any mapping) as declarations.

    Each table needs ``kind``; ``name`` is optional; every other key is an
    option of the kind. ``source`` names the file in error messages.

    >>> [decl] = parse_provider_decls({"providers": [{"kind": "workspace", "root": "."}]})
    >>> decl.kind, dict(decl.options)
    ('workspace', {'root': '.'})
    """
    tables = data.get("providers", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{source}: 'providers' must be an array of tables ([[providers]])")
    decls: list[ContextProviderDecl] = []
    for index, table in enumerate(tables):
        where = f"{source}: providers[{index}]"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table")
        options = dict(table)
        kind = options.pop("kind", None)
        name = options.pop("name", None)
        if not isinstance(kind, str) or not kind:
            raise ConfigError(f"{where}: 'kind' is required and must be a non-empty string")
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"{where}: 'name' must be a non-empty string")
        decls.append(ContextProviderDecl(kind, name, options, base_dir=base_dir))
    return decls


def load_provider_decls(path: str | os.PathLike[str]) -> list[ContextProviderDecl]:
    """The ``[[providers]]`` of a TOML file; relative paths resolve against its folder."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"{file}: cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    return parse_provider_decls(data, base_dir=file.resolve().parent, source=str(file))
