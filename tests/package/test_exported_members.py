"""One public surface: ``raf`` holds the names an agent is written with, four small public
modules the rest, each name defined once; nothing else is public, and nothing moved is lost."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import raf

#: The public modules beside raf itself: each re-exports from private modules, and each
#: name it exports says it is theirs (``__module__``).
PUBLIC_MODULES = ("raf.compression", "raf.config", "raf.errors", "raf.observe")
#: The public subpackages: every other module of raf is private.
PUBLIC_SUBPACKAGES = {"testing", "otel", "durable", "serve"}
#: Public, but loaded on first use and left out of __all__ (each needs an extra its module
#: imports).
OPTIONAL = {"GeminiChatClient", "PostgresSessionStore", "RedisSessionStore"}
#: raf.__all__ before the public modules (0.1.0): each name is still at the top, or
#: raf.<name> says where it went.
BEFORE = (
    "A2AAgentTool",
    "Agent",
    "AgentError",
    "AgentLike",
    "AgentResponse",
    "AgentRunOptions",
    "AgentSkillsProvider",
    "AgentStream",
    "AnthropicChatClient",
    "ApprovalError",
    "AuthenticationError",
    "BadRequestError",
    "CallNext",
    "ChatClient",
    "ChatClientError",
    "ChatConnectionError",
    "ChatMessage",
    "ChatOptions",
    "ChatProtocolError",
    "ChatRequest",
    "ChatTimeoutError",
    "ClearToolResults",
    "CompressionError",
    "CompressionProvider",
    "CompressionStrategy",
    "ConfigError",
    "ContextLedger",
    "ContextProvider",
    "ContextProviderDecl",
    "ContextProviderLike",
    "ContextResult",
    "ContextResultError",
    "Decision",
    "DurableError",
    "EchoChatClient",
    "FallbackMiddleware",
    "FolderRetriever",
    "FunctionTool",
    "GuardrailCheck",
    "GuardrailContext",
    "GuardrailError",
    "HistoryProvider",
    "InMemoryHistoryProvider",
    "InMemorySession",
    "IncompleteResponseError",
    "InputGuardrail",
    "Invocation",
    "KnowledgeProvider",
    "LedgerEntry",
    "LedgerPart",
    "LoggingMiddleware",
    "McpError",
    "McpToolsProvider",
    "MermaidObserver",
    "Middleware",
    "Observer",
    "OfflineError",
    "OpenAIChatClient",
    "OpenAIResponsesClient",
    "OutputError",
    "OutputGuardrail",
    "OutputRefusedError",
    "OutputValidationError",
    "PROVIDER_KINDS",
    "Passage",
    "PathError",
    "PendingCall",
    "ProviderError",
    "ProviderGroup",
    "ProviderOptions",
    "ProviderStage",
    "REQUEST_HASH_LIMIT",
    "RateLimitError",
    "Reasoning",
    "RequestHash",
    "Retriever",
    "RetryMiddleware",
    "ScriptedChatClient",
    "ServerError",
    "Session",
    "SessionStoreError",
    "SqliteSessionStore",
    "StageEvent",
    "StreamClosedError",
    "StreamingChatClient",
    "SummaryStrategy",
    "TokenBudgetStrategy",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolConflictError",
    "ToolError",
    "ToolGuardrail",
    "ToolLoopError",
    "ToolRequest",
    "ToolSchemaError",
    "TraceObserver",
    "TruncationStrategy",
    "Update",
    "Usage",
    "Verdict",
    "WikiRetriever",
    "WorkspaceContextProvider",
    "approximate_tokens",
    "build_provider",
    "build_providers",
    "check_tool_arguments",
    "check_tool_pairing",
    "check_tool_schema",
    "compose",
    "load_provider_decls",
    "merge",
    "message_units",
    "parallel",
    "pii_redactor",
    "register_provider_kind",
    "request_hash",
    "tool",
)
#: Names removed outright (an alias), and the name to write instead.
REMOVED = {"InMemoryHistoryProvider": "HistoryProvider"}

INIT = Path(raf.__file__)


def _public_module(name: str) -> ModuleType:
    return importlib.import_module(name)


def _homes() -> dict[str, str]:
    """Every public name, and the public module a user imports it from."""
    homes = dict.fromkeys((*raf.__all__, *OPTIONAL), "raf")
    for module in PUBLIC_MODULES:
        for name in _public_module(module).__all__:
            homes.setdefault(name, module)
    return homes


def test_all_is_exactly_the_sorted_public_names() -> None:
    assert raf.__all__ == sorted(raf.__all__)
    assert len(set(raf.__all__)) == len(raf.__all__)
    for name in raf.__all__:
        assert hasattr(raf, name), name
    public = {name for name in vars(raf) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(raf, name))}
    assert public - modules == set(raf.__all__)


def test_the_top_holds_about_sixty_names() -> None:
    # The design's figure (the names a user writes in an agent), not a target: a name
    # added here belongs in an agent, or in one of the public modules. The long-running
    # round's design spells sixteen more as raf.X (limits, budgets, memory, replay...).
    assert 55 <= len(raf.__all__) <= 90, len(raf.__all__)


@pytest.mark.parametrize("module", [m for m in PUBLIC_MODULES if m != "raf.errors"])
def test_each_public_module_lists_exactly_its_sorted_names(module: str) -> None:
    public = _public_module(module)
    assert public.__all__ == sorted(public.__all__)
    assert len(set(public.__all__)) == len(public.__all__)
    names = {name for name, value in vars(public).items() if not name.startswith("_")}
    assert names == set(public.__all__)  # re-exports only: nothing of its own


def test_no_name_is_exported_by_two_public_modules_but_the_common_errors() -> None:
    # The common errors are raf.errors' and also at the top; nothing else is in two places,
    # and no public name is another's alias.
    seen: dict[str, list[str]] = {}
    for module in ("raf", *PUBLIC_MODULES):
        for name in _public_module(module).__all__:
            seen.setdefault(name, []).append(module)
    twice = {name: where for name, where in seen.items() if len(where) > 1}
    assert all(where == ["raf", "raf.errors"] for where in twice.values()), twice
    values = [getattr(_public_module(seen[name][0]), name) for name in seen]
    objects = [value for value in values if isinstance(value, type) or callable(value)]
    assert len({id(value) for value in objects}) == len(objects)  # no alias


def _runtime_definitions(tree: ast.Module) -> list[str]:
    """The names raf/__init__.py binds when it runs: its imports and its table of late
    names (what the type checkers' block imports is checked apart)."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raf"):
            names += [alias.asname or alias.name for alias in node.names]
        late = isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["_LATE"]
        if late:
            assert isinstance(node.value, ast.Dict)
            names += [key.value for key in node.value.keys]  # type: ignore[union-attr]
    return [name for name in names if not name.startswith("_")]


def test_every_name_is_defined_once_in_init() -> None:
    defined = _runtime_definitions(ast.parse(INIT.read_text(encoding="utf-8")))
    twice = sorted({name for name in defined if defined.count(name) > 1})
    assert twice == []
    assert set(defined) == set(raf.__all__) | OPTIONAL
    # The source lists each name once in __all__ and nowhere else but its definition.
    source = INIT.read_text(encoding="utf-8")
    for name in raf.__all__:
        assert source.count(f'"{name}"') == (2 if name in raf._LATE else 1), name


def test_type_checkers_see_exactly_the_late_names() -> None:
    # The TYPE_CHECKING block star-imports each late module: its __all__ must be what
    # _LATE takes from it, or a type checker would accept a name that raf does not have.
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    seen: set[str] = set()
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        assert node.module
        if node.names[0].name == "*":
            seen |= set(importlib.import_module(node.module).__all__)
        elif node.module != "raf":
            seen |= {alias.asname or alias.name for alias in node.names}
    assert seen == set(raf._LATE)
    for name, module in raf._LATE.items():
        assert name in importlib.import_module(module).__all__, name


def _private_modules() -> list[ModuleType]:
    """Every module of the package but the public ones and the public subpackages."""
    modules = []
    for info in pkgutil.walk_packages(raf.__path__, "raf."):
        if info.name.split(".")[1] in PUBLIC_SUBPACKAGES or info.name == "raf.__main__":
            continue
        if info.name in PUBLIC_MODULES:
            continue
        modules.append(importlib.import_module(info.name))
    return modules


def test_every_module_but_the_public_ones_is_private() -> None:
    for module in _private_modules():
        assert any(part.startswith("_") for part in module.__name__.split(".")[1:]), module
    found = {info.name for info in pkgutil.iter_modules(raf.__path__, "raf.")}
    public = {name for name in found if not name.split(".")[1].startswith("_")}
    assert public == {*PUBLIC_MODULES, *(f"raf.{name}" for name in PUBLIC_SUBPACKAGES)}


def test_each_private_module_lists_only_public_names() -> None:
    # A private module's __all__ says what it gives the public surface, nothing else:
    # its helpers are its own, and may move.
    public = set(_homes())
    for module in _private_modules():
        exported = set(getattr(module, "__all__", ()))
        assert exported <= public, (module.__name__, sorted(exported - public))


def test_every_public_name_comes_from_a_private_module_and_says_its_home() -> None:
    owners = {name for module in _private_modules() for name in getattr(module, "__all__", ())}
    homes = _homes()
    assert set(homes) <= owners | set(importlib.import_module("raf.errors").__all__)
    for name, home in homes.items():
        value = getattr(_public_module(home), name)
        if isinstance(value, type) or inspect.isfunction(value):
            assert value.__module__ == home, name


def test_every_error_class_is_in_raf_errors_and_the_common_ones_at_the_top() -> None:
    errors = importlib.import_module("raf.errors")
    classes = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, Exception) and not name.startswith("_")
    }
    assert classes == set(errors.__all__)
    at_top = {name for name in raf.__all__ if name in classes}
    assert at_top == {
        "AgentError",
        "BudgetExceeded",
        "ChatClientError",
        "ContextOverflowError",
        "GuardrailError",
        "OutputError",
        "ProviderError",
        "StreamClosedError",
        "ToolError",
        "UsageLimitExceeded",
    }
    for name in at_top:
        assert getattr(raf, name) is getattr(errors, name)


@pytest.mark.parametrize("name", sorted(set(BEFORE) - set(raf.__all__)))
def test_a_name_that_left_the_top_says_where_it_lives_now(name: str) -> None:
    with pytest.raises(AttributeError) as caught:
        getattr(raf, name)
    message = str(caught.value)
    assert caught.value.name == name
    if name in REMOVED:
        assert message.startswith(f"raf.{name} was removed"), message
        assert f"raf.{REMOVED[name]}" in message
        assert hasattr(raf, REMOVED[name])
        return
    home = raf._MOVED[name]
    assert message == f"raf.{name} moved to {home}.{name} (from {home} import {name})"
    assert name in _public_module(home).__all__  # and it is there
    scope: dict[str, object] = {}
    with pytest.raises(ImportError, match=name):
        exec(f"from raf import {name}", scope)


def test_the_table_of_moves_is_exactly_what_left() -> None:
    moved = set(BEFORE) - set(raf.__all__) - set(REMOVED)
    assert set(raf._MOVED) == moved
    assert set(raf._REMOVED) == set(REMOVED)


def test_an_unknown_name_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"^module 'raf' has no attribute 'Nothing'$"):
        raf.Nothing  # noqa: B018


def test_internal_helpers_are_not_exported() -> None:
    for module in ("raf", *PUBLIC_MODULES):
        exported = set(_public_module(module).__all__)
        assert not exported & {"EMPTY_RESULT", "Messages", "PostStageFailures", "say_home"}


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


def test_the_public_modules_load_on_first_use_as_attributes_of_raf() -> None:
    # raf.observe.TraceObserver after a bare `import raf`, as the moved names' errors say.
    code = (
        "import raf, sys; "
        "before = sorted(m for m in ('raf.observe', 'raf.config', 'raf.compression') "
        "if m in sys.modules); "
        "print(before, raf.observe.TraceObserver.__module__, raf.config.__name__, "
        "raf.compression.TruncationStrategy.__module__, 'observe' in dir(raf))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "raf.observe", "raf.config", "raf.compression", "True"]


#: Modules `import raf` leaves out besides those of raf's table of late names (raf._LATE):
#: the public modules and what only they use, and structured output. The standard
#: library's sqlite3 (the SQLite store), hashlib (OpenSSL: the request and approval hashes
#: import it when they first hash) and pathlib (the stores' and the built-ins' paths) with
#: them.
LAZY_TOO = (
    "raf._agent.linear_schema",
    "raf._cli",
    "raf._config.declarations",
    "raf._config.file",
    "raf._config.guardrails",
    "raf._config.models",
    "raf._config.stack_options",
    "raf._config.types",
    "raf._observers.ledger",
    "raf._observers.mermaid",
    "raf._observers.otel_details",
    "raf._observers.tracing",
    "raf._sessions.stores",
    "raf._sessions.sqlite_file",
    "raf._sessions.sqlite_connection",
    "raf._sessions.redis_connection",
    "raf.compression",
    "raf.config",
    "raf.observe",
    "sqlite3",
    "hashlib",
    "pathlib",
)


def _lazy_modules() -> set[str]:
    modules = {*raf._LATE.values(), *LAZY_TOO}
    for package in ("raf._providers", "raf._middleware", "raf._clients"):
        path = importlib.import_module(package).__path__
        modules |= {info.name for info in pkgutil.iter_modules(path, package + ".")}
    return modules


def test_import_raf_loads_only_the_core() -> None:
    # The built-in providers, the stores, the clients and the middleware load when one of
    # their names is first used (raf.__getattr__); the config, the observers and the
    # compression strategies with their public modules.
    lazy = sorted(_lazy_modules())
    code = f"import raf, sys; print(sorted(m for m in {lazy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_late_name_is_public_and_listed_by_dir() -> None:
    assert set(raf._LATE) <= set(raf.__all__) | OPTIONAL
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


@pytest.mark.parametrize("module", sorted(set(raf._LATE.values())))
def test_each_late_name_loads_its_module_on_first_use(module: str) -> None:
    names = sorted(name for name, owner in raf._LATE.items() if owner == module)
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
