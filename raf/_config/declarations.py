"""Providers declared as data: ContextProviderDecl, the kind registry, and TOML loading."""

from __future__ import annotations

import importlib
import os
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager, suppress
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import attrs

from raf._config.models import (
    ClearToolResultsOptions,
    CompressionOptions,
    KnowledgeOptions,
    LongTermMemoryOptions,
    McpOptions,
    MemoryOptions,
    SkillsOptions,
    TokenBudgetOptions,
    TruncationOptions,
    WorkspaceOptions,
    check_file,
    check_options,
    unknown_options_error,
)
from raf._config.types import given
from raf._providers.clearing import ClearToolResults
from raf._providers.compression import (
    DEFAULT_SUMMARY_PROMPT,
    CompressionProvider,
    SummaryStrategy,
    TokenBudgetStrategy,
    TruncationStrategy,
)
from raf._providers.knowledge import KnowledgeProvider
from raf._providers.mcp import McpToolsProvider
from raf._providers.memory import LongTermMemory
from raf._providers.skills import AgentSkillsProvider
from raf._providers.workspace import WorkspaceContextProvider
from raf._sessions.history import HistoryProvider
from raf._sessions.stores import is_postgres_url, is_redis_url
from raf.errors import AgentError, ConfigError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "PROVIDER_KINDS",
    "ContextProviderDecl",
    "ProviderOptions",
    "build_provider",
    "build_providers",
    "load_provider_decls",
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


class ProviderOptions:
    """A declaration's options, as a factory reads them.

    A kind reads them all at once with :meth:`parse`, against the pydantic
    model of its options (a built-in kind's is in ``raf._config.models``; a
    kind of your own brings its own). A wrong, missing or unknown option is
    a :class:`ConfigError` naming the kind, the option and what was
    expected, and :func:`build_provider` refuses options when the factory
    read none.
    ``chat_client`` is the client passed to :func:`build_provider`, for
    kinds that need a model.
    """

    def __init__(
        self, decl: ContextProviderDecl, chat_client: Any = None, *, what: str = "provider"
    ) -> None:
        self.decl = decl
        self.kind = decl.kind
        self.name = decl.name
        self.chat_client = chat_client
        #: What is being built, for error messages ("provider", "chat_stack").
        self.what = what
        #: The options :meth:`parse` read.
        self.read: set[str] = set()

    @property
    def where(self) -> str:
        """How an error message names the declaration: ``provider kind 'x' (name 'y')``."""
        named = f" (name {self.name!r})" if self.name else ""
        return f"{self.what} kind {self.kind!r}{named}"

    def parse(self, model: Any) -> Any:
        """All the options, validated as ``model`` (a pydantic model with ``extra="forbid"``).

        >>> from pydantic import BaseModel, ConfigDict
        >>> class Zone(BaseModel):
        ...     model_config = ConfigDict(extra="forbid")
        ...     zone: str = "UTC"
        >>> ProviderOptions(ContextProviderDecl("clock", options={"zone": 1})).parse(Zone)
        Traceback (most recent call last):
        raf.errors.ConfigError: provider kind 'clock': option 'zone' must be a valid string, got 1
        """
        parsed = check_options(model, self.decl.options, self.where)
        self.read.update(self.decl.options)
        return parsed

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """``path`` as a Path; a relative one joins the declaration's ``base_dir``."""
        resolved = Path(path).expanduser()
        if not resolved.is_absolute() and self.decl.base_dir is not None:
            resolved = self.decl.base_dir / resolved
        return resolved

    def unread(self) -> list[str]:
        """The options no :meth:`parse` read, sorted."""
        return sorted(set(self.decl.options) - self.read)


#: A factory builds one provider from its declaration's options.
ProviderFactory = Callable[[ProviderOptions], Any]


def _memory(o: ProviderOptions) -> Any:
    options = o.parse(MemoryOptions)
    return HistoryProvider(
        inject=options.inject,
        persist_partial=options.persist_partial,
        max_messages=options.max_messages,
        max_tokens=options.max_tokens,
        name=o.name,
        **given(options, "step", "cold_after"),
    )


def _compression(o: ProviderOptions) -> Any:
    options = o.parse(CompressionOptions)
    strategy = build_strategy(options, o.chat_client, o.where)
    return CompressionProvider(strategy, max_messages=options.max_messages, name=o.name)


def build_strategy(options: Any, chat_client: Any, where: str) -> Any:
    """The compression strategy of checked ``options`` (one of :data:`CompressionOptions`);
    only the options the file sets are given, the rest keep the class's defaults.
    ``where`` starts an error's line."""
    window = given(options, "step", "cold_after")
    if isinstance(options, TruncationOptions):
        return TruncationStrategy(options.keep_last, **window)
    if isinstance(options, TokenBudgetOptions):
        return TokenBudgetStrategy(options.max_tokens, **window)
    if isinstance(options, ClearToolResultsOptions):
        return ClearToolResults(
            **given(options, "keep_last", "clear_at_least", "exclude", "cold_after")
        )
    if chat_client is None:
        raise ConfigError(
            f"{where}: strategy 'summary' needs a chat client to write its summaries; "
            "pass chat_client="
        )
    return SummaryStrategy(
        chat_client,
        options.keep_last,
        DEFAULT_SUMMARY_PROMPT if options.prompt is None else options.prompt,
        on_failure=options.on_failure,
        **window,
    )


def _skills(o: ProviderOptions) -> Any:
    options = o.parse(SkillsOptions)
    return AgentSkillsProvider(
        o.resolve(options.root),
        max_bytes=options.max_bytes,
        tool_prefix=options.tool_prefix,
        name=o.name,
    )


def _workspace(o: ProviderOptions) -> Any:
    options = o.parse(WorkspaceOptions)
    return WorkspaceContextProvider(
        o.resolve(options.root),
        writable=options.writable,
        max_bytes=options.max_bytes,
        tool_prefix=options.tool_prefix,
        name=o.name,
    )


def _knowledge(o: ProviderOptions) -> Any:
    options = o.parse(KnowledgeOptions)
    root, top_k, volatile = o.resolve(options.root), options.top_k, options.volatile
    return KnowledgeProvider.folder(root, top_k=top_k, name=o.name, volatile=volatile)


def _wiki(o: ProviderOptions) -> Any:
    options = o.parse(KnowledgeOptions)
    root, top_k, volatile = o.resolve(options.root), options.top_k, options.volatile
    return KnowledgeProvider.wiki(root, top_k=top_k, name=o.name, volatile=volatile)


def _mcp(o: ProviderOptions) -> Any:
    options = o.parse(McpOptions)
    return McpToolsProvider(
        options.command,
        list(options.args),
        env=None if options.env is None else dict(options.env),
        cwd=None if options.cwd is None else o.resolve(options.cwd),
        tool_prefix=options.tool_prefix,
        timeout=options.timeout,
        max_tools=options.max_tools,
        name=o.name,
    )


def _long_term_memory(o: ProviderOptions) -> Any:
    options = o.parse(LongTermMemoryOptions)
    url = is_redis_url(options.store) or is_postgres_url(options.store)
    return LongTermMemory(
        options.store if url else o.resolve(options.store),
        namespace=options.namespace,
        top_k=options.top_k,
        extract_every=options.extract_every,
        extractor=o.chat_client,
        tools=options.tools,
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
    "long_term_memory": _long_term_memory,
}


def register_provider_kind(
    kind: str,
    factory: ProviderFactory,
    *,
    registry: MutableMapping[str, ProviderFactory] | None = None,
    replace: bool = False,
) -> None:
    """Make ``kind`` buildable: ``factory(options)`` returns the provider.

    The factory reads its options with :meth:`ProviderOptions.parse` and a
    pydantic model, so a wrong, missing or unknown option gets a clear
    error; options given to a factory that reads none are refused. Registering a taken kind needs
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
    entries = getattr(check_file({key: data.get(key, [])}, source), key)
    return [
        ContextProviderDecl(entry.kind, entry.name, entry.model_extra or {}, base_dir=base_dir)
        for entry in entries
    ]


def load_provider_decls(path: str | os.PathLike[str]) -> list[ContextProviderDecl]:
    """The ``[[providers]]`` of a TOML file; relative paths resolve against its folder.

    The file is read as :func:`read_config` reads it (at most
    :data:`MAX_CONFIG_BYTES`; any problem is a :class:`ConfigError`).
    """
    file = Path(path)
    return parse_provider_decls(read_config(file), base_dir=file.resolve().parent, source=str(file))


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML document at ``path``: at most :data:`MAX_CONFIG_BYTES`, or a ConfigError.

    A file too large (``/dev/zero``), not UTF-8, not TOML or nested too
    deeply to parse is one line that names the file.
    """
    file = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO that has no writer must not wait for one.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            mode = os.fstat(fd).st_mode
            if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISDIR(mode):
                kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO or socket"
                raise ConfigError(f"{file}: not a config file: {kind}, not a regular file")
            raw = handle.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{file}: cannot be read: no such config file") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{file}: cannot read the config file: {reason}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{file}: not a config file: larger than {MAX_CONFIG_BYTES // 1024} KiB")
    import tomllib  # here: `import raf` does not import it

    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{file}: not a usable config: arrays or tables nested too deeply"
        ) from None


#: A config is a few kilobytes; anything past this is not one (``/dev/zero``, a log file).
MAX_CONFIG_BYTES = 1024 * 1024


#: The entry-point group in which installed packages offer provider kinds.
ENTRY_POINT_GROUP = "raf.providers"


def _installed_kinds() -> dict[str, EntryPoint]:
    # Asked each time a kind is not in the registry, never at import: scanning
    # the installed distributions costs milliseconds that `import raf` must not pay.
    from importlib.metadata import entry_points  # here: `import raf` does not import it

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
    except SystemExit as exc:
        # A module that exits on import (a script's sys.exit) must not end raf silently.
        raise ConfigError(
            f"{what} {spec!r}: cannot import {module_name!r}: it called sys.exit({exc.code!r}) "
            "while being imported (a script, not a module of tools?)"
        ) from exc
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
        raise unknown_options_error(options.where, unread, sorted(options.read))
    return built
