"""One public surface: everything users need is importable from ``raf``, nothing else is."""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from types import ModuleType

import pytest

import raf

#: The public subpackages: every other module of raf is private.
PUBLIC_SUBPACKAGES = {"testing", "otel", "durable", "serve"}
#: Public, but loaded on first use and left out of __all__ (each needs an extra its module
#: imports).
OPTIONAL = {"GeminiChatClient", "PostgresSessionStore", "RedisSessionStore"}


def test_all_is_exactly_the_sorted_public_names() -> None:
    assert raf.__all__ == sorted(raf.__all__)
    assert len(set(raf.__all__)) == len(raf.__all__)
    for name in raf.__all__:
        assert hasattr(raf, name), name
    public = {name for name in vars(raf) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(raf, name))}
    assert public - modules == set(raf.__all__)


def _private_modules() -> list[ModuleType]:
    """Every module of the package but the public subpackages (raf.testing, raf.otel)."""
    modules = []
    for info in pkgutil.walk_packages(raf.__path__, "raf."):
        if info.name.split(".")[1] in PUBLIC_SUBPACKAGES or info.name == "raf.__main__":
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def test_every_module_but_the_public_subpackages_is_private() -> None:
    for module in _private_modules():
        assert any(part.startswith("_") for part in module.__name__.split(".")[1:]), module


def test_each_private_module_lists_only_public_names() -> None:
    # A private module's __all__ says what it gives the public surface, nothing else:
    # its helpers are its own, and may move.
    public = set(raf.__all__) | OPTIONAL
    for module in _private_modules():
        exported = set(getattr(module, "__all__", ()))
        assert exported <= public, (module.__name__, sorted(exported - public))


def test_every_public_name_comes_from_a_private_module_and_says_raf() -> None:
    owners = {name for module in _private_modules() for name in getattr(module, "__all__", ())}
    assert set(raf.__all__) <= owners
    for name in (*raf.__all__, *OPTIONAL):
        value = getattr(raf, name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == "raf", name


def test_every_error_class_is_exported() -> None:
    errors = importlib.import_module("raf.errors")
    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and not name.startswith("_")
    }
    assert classes == set(errors.__all__)
    assert classes <= set(raf.__all__)


def test_internal_helpers_are_not_exported() -> None:
    assert "EMPTY_RESULT" not in raf.__all__
    assert "Messages" not in raf.__all__
    assert "PostStageFailures" not in raf.__all__


def test_import_raf_imports_no_optional_extra() -> None:
    code = (
        "import sys, raf; "
        "print(sorted(m for m in ('hypothesis', 'coredis', 'opentelemetry', 'mcp') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_raf_imports_no_sdk_stack() -> None:
    # The OpenAI clients, @tool's schemas and the tool checks import these when first
    # used; an offline agent (Echo, Scripted, a plain Tool) never pays for them.
    heavy = ("openai", "httpx", "httpx2", "pydantic", "pydantic_core", "jsonschema")
    code = f"import raf, sys; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_raf_imports_no_logging_or_config_stack() -> None:
    # raf logs through a logger made on first use (raf._log); the config's and the skills'
    # readers import their parsers where they read.
    heavy = ("structlog", "yaml", "tenacity", "tomllib", "asyncio")
    code = f"import raf, sys; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_openai_clients_load_on_first_use() -> None:
    code = (
        "import raf, sys; "
        "before = 'raf._clients.openai' in sys.modules; "
        "chat, responses = raf.OpenAIChatClient, raf.OpenAIResponsesClient; "
        "print(before, chat.__module__, responses.__module__, 'OpenAIChatClient' in vars(raf))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "raf", "raf", "True"]


#: Modules `import raf` leaves out besides those of raf's lazy table (raf._LAZY): what only
#: they use, and structured output. The standard library's sqlite3 (the SQLite store),
#: hashlib (OpenSSL: the request and approval hashes import it when they first hash) and
#: pathlib (the stores' and the built-ins' paths) with them.
LAZY_TOO = (
    "raf._cli",
    "raf._config.file",
    "raf._config.models",
    "raf._sessions.stores",
    "raf._sessions.sqlite_file",
    "raf._sessions.sqlite_connection",
    "raf._sessions.redis_connection",
    "sqlite3",
    "hashlib",
    "pathlib",
)


def _lazy_modules() -> set[str]:
    modules = {*raf._LAZY.values(), *LAZY_TOO}
    for package in ("raf._providers", "raf._middleware", "raf._clients"):
        path = importlib.import_module(package).__path__
        modules |= {info.name for info in pkgutil.iter_modules(path, package + ".")}
    return modules


def test_import_raf_loads_only_the_core() -> None:
    # The built-in providers, the stores, the clients, the config, the observers and the
    # middleware load when one of their names is first used (raf.__getattr__).
    lazy = sorted(_lazy_modules())
    code = f"import raf, sys; print(sorted(m for m in {lazy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_lazy_name_is_public_and_listed_by_dir() -> None:
    assert set(raf._LAZY) <= set(raf.__all__) | OPTIONAL
    code = "import raf; print(' '.join(dir(raf)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    listed = set(out.stdout.split())
    assert set(raf.__all__) | OPTIONAL <= listed


#: Run in a fresh interpreter: argv[1] is a lazily-loaded module, argv[2:] its names.
_FIRST_USE = """
import importlib, json, sys
import raf
module, names = sys.argv[1], sys.argv[2:]
seen = {"before": module in sys.modules}
first = getattr(raf, names[0])
seen["after"] = module in sys.modules
defined = importlib.import_module(module)
for name in names:
    value, scope = getattr(raf, name), {}
    exec(f"from raf import {name} as value", scope)
    seen[name] = {
        "same": value is getattr(defined, name) and scope["value"] is value,
        "module": getattr(value, "__module__", None) if callable(value) else None,
        "in_vars": name in vars(raf),
    }
print(json.dumps(seen))
"""


@pytest.mark.parametrize("module", sorted(set(raf._LAZY.values())))
def test_each_lazy_name_loads_its_module_on_first_use(module: str) -> None:
    names = sorted(name for name, owner in raf._LAZY.items() if owner == module)
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_USE, module, *names],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(out.stdout)
    assert (seen["before"], seen["after"]) == (False, True)
    for name in names:
        assert seen[name]["same"], name  # raf.X and `from raf import X`: the module's own
        assert seen[name]["in_vars"] == (name in raf.__all__), name
        if seen[name]["module"] is not None:
            assert seen[name]["module"] == "raf", name
