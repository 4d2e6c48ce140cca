"""Providers declared as data: ContextProviderDecl, the kind registry, and TOML loading."""

from __future__ import annotations

import importlib
import math
import os
import sys
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager, suppress
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar, cast

import attrs

from raf.errors import AgentError, ConfigError

__all__ = [
    "CHAT_STACK_KINDS",
    "ENTRY_POINT_GROUP",
    "MAX_CONFIG_BYTES",
    "PROVIDER_KINDS",
    "ContextProviderDecl",
    "ProviderFactory",
    "ProviderOptions",
    "build_provider",
    "build_chat_middleware",
    "build_providers",
    "import_object",
    "load_provider_decls",
    "parse_chat_stack_decls",
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

    def __init__(
        self, decl: ContextProviderDecl, chat_client: Any = None, *, what: str = "provider"
    ) -> None:
        self.decl = decl
        self.kind = decl.kind
        self.name = decl.name
        self.chat_client = chat_client
        #: What is being built, for error messages ("provider", "chat_stack middleware").
        self.what = what
        #: The options a getter asked for.
        self.read: set[str] = set()

    def _error(self, option: str, expected: str, got: object = _NO_DEFAULT) -> ConfigError:
        where = f"{self.what} kind {self.kind!r}" + (f" (name {self.name!r})" if self.name else "")
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

    def number(self, option: str, default: Any = _NO_DEFAULT, *, allow_zero: bool = False) -> Any:
        """A positive number (or zero, with ``allow_zero``)."""
        expected = "a number >= 0" if allow_zero else "a positive number"
        value = self._get(option, default, expected)
        if value is not default and (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not (value >= 0 if allow_zero else value > 0)
        ):
            raise self._error(option, expected, value)
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
    from raf.builtin.history import HistoryProvider

    return HistoryProvider(inject=o.flag("inject", True), name=o.name)


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
        o.path("root"),
        max_bytes=o.integer("max_bytes", DEFAULT_MAX_BYTES),
        tool_prefix=o.text("tool_prefix", "", allow_empty=True),
        name=o.name,
    )


def _workspace(o: ProviderOptions) -> Any:
    from raf.builtin.workspace import DEFAULT_MAX_BYTES, WorkspaceContextProvider

    return WorkspaceContextProvider(
        o.path("root"),
        writable=o.flag("writable", True),
        max_bytes=o.integer("max_bytes", DEFAULT_MAX_BYTES),
        tool_prefix=o.text("tool_prefix", "", allow_empty=True),
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

    A kind is looked up in ``registry`` (default :data:`PROVIDER_KINDS`),
    then, when it has the form ``"package.module:factory"``, imported, then
    among the kinds installed packages offer in the ``raf.providers``
    entry-point group. An unknown kind, a wrong, missing or unknown option:
    :class:`ConfigError` saying which. ``decl.name`` becomes the provider's ``name``.
    ``chat_client`` is handed to factories that need a model (the
    ``summary`` compression strategy).
    """
    kinds = PROVIDER_KINDS if registry is None else registry
    factory = kinds.get(decl.kind)
    if factory is None:
        factory = _factory_elsewhere(decl.kind, kinds, decl.base_dir)
    options = ProviderOptions(decl, chat_client)
    provider = _built(factory, options, f"provider kind {decl.kind!r}")
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
    return _parse_decls(data, "providers", base_dir, source)


def _parse_decls(
    data: Mapping[str, Any], key: str, base_dir: Path | None, source: str
) -> list[ContextProviderDecl]:
    tables = data.get(key, [])
    if not isinstance(tables, list):
        raise ConfigError(f"{source}: {key!r} must be an array of tables ([[{key}]])")
    decls: list[ContextProviderDecl] = []
    for index, table in enumerate(tables):
        where = f"{source}: {key}[{index}]"
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
    """The ``[[providers]]`` of a TOML file; relative paths resolve against its folder.

    The file is at most :data:`MAX_CONFIG_BYTES`; one larger, or nested too
    deeply to parse, is a :class:`ConfigError` like any other bad file.
    """
    file = Path(path)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{file}: cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{file}: not a config file: larger than {MAX_CONFIG_BYTES // 1024} KiB")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{file}: not a usable config: nested too deeply") from None
    return parse_provider_decls(data, base_dir=file.resolve().parent, source=str(file))


#: A config is a few kilobytes; anything past this is not one (``/dev/zero``, a log file).
MAX_CONFIG_BYTES = 1024 * 1024


#: The entry-point group in which installed packages offer provider kinds.
ENTRY_POINT_GROUP = "raf.providers"


def _installed_kinds() -> dict[str, EntryPoint]:
    # Asked each time a kind is not in the registry, never at import: scanning
    # the installed distributions costs milliseconds that `import raf` must not pay.
    return {point.name: point for point in entry_points(group=ENTRY_POINT_GROUP)}


def _factory_elsewhere(
    kind: str, kinds: Mapping[str, ProviderFactory], base_dir: Path | None
) -> ProviderFactory:
    """The factory of a kind that is not in the registry: an import path or an entry point."""
    if ":" in kind:
        factory = import_object(kind, base_dir=base_dir, what="provider kind")
        if not callable(factory):
            raise ConfigError(
                f"provider kind {kind!r}: {type(factory).__name__} is not callable; "
                "it must be a factory: options -> provider"
            )
        return cast(ProviderFactory, factory)
    installed = _installed_kinds()
    point = installed.get(kind)
    if point is None:
        known = ", ".join(sorted({*kinds, *installed})) or "none"
        raise ConfigError(
            f"unknown provider kind {kind!r}; known kinds: {known} "
            "(or an import path 'package.module:factory')"
        )
    try:
        factory = point.load()
    except Exception as exc:
        raise ConfigError(
            f"provider kind {kind!r}: its entry point {point.value!r} "
            f"(group {ENTRY_POINT_GROUP!r}) cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise ConfigError(
            f"provider kind {kind!r}: its entry point {point.value!r} is not callable"
        )
    return cast(ProviderFactory, factory)


@contextmanager
def _importable_from(folder: Path | None) -> Iterator[None]:
    """``folder`` on ``sys.path`` for the time of an import (a config's own modules)."""
    entry = None if folder is None else os.fspath(folder)
    if entry is None or entry in sys.path:
        yield
        return
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with suppress(ValueError):
            sys.path.remove(entry)


def import_object(spec: str, *, base_dir: Path | None = None, what: str = "import path") -> Any:
    """The object ``"package.module:name"`` names (``name`` may be dotted).

    The module is imported from the installed packages, or from ``base_dir``
    (a config file's folder). Any failure is a :class:`ConfigError` that
    names ``what`` and the import path.

    >>> import_object("raf.errors:ConfigError") is ConfigError
    True
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute or ":" in attribute:
        raise ConfigError(f"{what} {spec!r}: an import path has the form 'package.module:name'")
    try:
        with _importable_from(base_dir):
            found: Any = importlib.import_module(module_name)
    except Exception as exc:
        # Whatever the module raises on import (ImportError, SyntaxError, its own
        # errors) is a problem of the config's import path, told in one line.
        raise ConfigError(
            f"{what} {spec!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigError(
                f"{what} {spec!r}: {module_name!r} has no attribute {attribute!r}"
            ) from None
    return found


def _retry(o: ProviderOptions) -> Any:
    from raf.middleware.retry import RetryMiddleware

    retry_on = o.text_list("retry_on", None)
    types: tuple[type[BaseException], ...] | None = None
    if retry_on is not None:
        found = []
        for spec in retry_on:
            error = import_object(spec, base_dir=o.decl.base_dir, what="retry_on")
            if not (isinstance(error, type) and issubclass(error, BaseException)):
                raise o._error("retry_on", "a list of exception classes", spec)
            found.append(error)
        types = tuple(found)
    return RetryMiddleware(
        attempts=o.integer("attempts", 3),
        retry_on=types,
        wait_initial=o.number("wait_initial", 0.5, allow_zero=True),
        wait_max=o.number("wait_max", 8.0, allow_zero=True),
    )


def _logging(o: ProviderOptions) -> Any:
    from raf.middleware.logging import LoggingMiddleware

    return LoggingMiddleware()


#: The kinds of ``[[chat_stack]]`` entries: middleware around each model call.
CHAT_STACK_KINDS: dict[str, ProviderFactory] = {"retry": _retry, "logging": _logging}


def parse_chat_stack_decls(
    data: Mapping[str, Any], *, base_dir: Path | None = None, source: str = "config"
) -> list[ContextProviderDecl]:
    """The ``[[chat_stack]]`` of parsed TOML as declarations (``kind`` and options).

    >>> [decl] = parse_chat_stack_decls({"chat_stack": [{"kind": "retry", "attempts": 5}]})
    >>> build_chat_middleware(decl)
    RetryMiddleware(attempts=5, retry_on=None, wait_initial=0.5, wait_max=8.0)
    """
    return _parse_decls(data, "chat_stack", base_dir, source)


def build_chat_middleware(decl: ContextProviderDecl) -> Any:
    """The chat-stack middleware ``decl`` declares: ``retry``, ``logging``, or an import path.

    ``retry`` takes :class:`raf.RetryMiddleware`'s options (``attempts``,
    ``wait_initial``, ``wait_max``, ``retry_on`` as a list of import paths of
    exception classes); ``logging`` takes none. A kind of the form
    ``"package.module:factory"`` is a factory like a provider kind's, which
    returns the middleware.
    """
    factory = CHAT_STACK_KINDS.get(decl.kind)
    if factory is None:
        if ":" not in decl.kind:
            known = ", ".join(sorted(CHAT_STACK_KINDS))
            raise ConfigError(
                f"unknown chat_stack kind {decl.kind!r}; known kinds: {known} "
                "(or an import path 'package.module:factory')"
            )
        factory = import_object(decl.kind, base_dir=decl.base_dir, what="chat_stack kind")
        if not callable(factory):
            raise ConfigError(f"chat_stack kind {decl.kind!r} is not callable")
    options = ProviderOptions(decl, what="chat_stack")
    middleware = _built(factory, options, f"chat_stack kind {decl.kind!r}")
    if not callable(middleware):
        raise ConfigError(
            f"chat_stack kind {decl.kind!r}: the factory returned {type(middleware).__name__}, "
            "not middleware (async (request, call_next))"
        )
    return middleware


def _built(factory: Callable[[ProviderOptions], Any], options: ProviderOptions, what: str) -> Any:
    """``factory(options)``; whatever goes wrong, and any option it did not read, is one
    ConfigError that starts with ``what``."""
    try:
        built = factory(options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: {exc}") from exc
    except AgentError:
        raise
    except Exception as exc:
        # A factory of your own (by import path, from a package) that fails in any
        # other way is still a problem of the declaration: say which, in one line.
        raise ConfigError(f"{what}: the factory failed: {type(exc).__name__}: {exc}") from exc
    unread = options.unread()
    if unread:
        used = ", ".join(sorted(options.read)) or "none"
        raise ConfigError(
            f"{what}: unknown option(s) {', '.join(map(repr, unread))} (options read here: {used})"
        )
    return built
