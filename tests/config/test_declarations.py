"""Providers declared as data: declarations, the registry, TOML loading."""

from __future__ import annotations

import os
import re
import threading
import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest
from pydantic import BaseModel, ConfigDict

from raf import (
    Agent,
    AgentError,
    AgentSkillsProvider,
    ClearToolResults,
    CompressionProvider,
    ContextProvider,
    HistoryProvider,
    InMemorySession,
    KnowledgeProvider,
    LoggingMiddleware,
    RetryMiddleware,
    ScriptedChatClient,
    ToolCall,
    WorkspaceContextProvider,
)
from raf._config.declarations import (
    ENTRY_POINT_GROUP,
    import_object,
    parse_provider_decls,
    read_config,
)
from raf._config.file import (
    build_chat_middleware,
    load_agent,
    load_config,
    parse_chat_stack_decls,
)
from raf.compression import SummaryStrategy, TokenBudgetStrategy, TruncationStrategy
from raf.config import (
    PROVIDER_KINDS,
    ContextProviderDecl,
    ProviderOptions,
    build_provider,
    build_providers,
    load_provider_decls,
    register_provider_kind,
)
from raf.errors import ConfigError, RateLimitError

pytestmark = pytest.mark.anyio

CONFIG = """
[agent]
name = "helper"

[[providers]]
kind = "memory"
name = "history"

[[providers]]
kind = "compression"
strategy = "token_budget"
max_tokens = 2000

[[providers]]
kind = "workspace"
root = "ws"
writable = false
max_bytes = 5000

[[providers]]
kind = "skills"
root = "skills"

[[providers]]
kind = "knowledge"
name = "docs"
root = "docs"
top_k = 2

[[providers]]
kind = "wiki"
root = "/ABSOLUTE/wiki"
volatile = false
"""


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    for name in ("ws", "skills", "docs", "wiki"):
        (folder / name).mkdir(parents=True)
    (folder / "ws" / "hello.txt").write_text("hello from the workspace")
    text = CONFIG.replace("/ABSOLUTE/wiki", str(folder / "wiki"))
    (folder / "raf.toml").write_text(text)
    return folder


def test_declaration_is_frozen_data() -> None:
    decl = ContextProviderDecl("memory")
    assert decl == ContextProviderDecl("memory", None, {})
    assert decl.options == {}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        decl.kind = "skills"  # type: ignore[misc]
    options = {"root": "."}
    decl = ContextProviderDecl("workspace", options=options)
    options["root"] = "/"
    assert decl.options == {"root": "."}
    with pytest.raises(TypeError):
        decl.options["root"] = "/"  # type: ignore[index]
    with pytest.raises(TypeError, match="kind"):
        ContextProviderDecl("")


def test_every_builtin_kind_is_registered() -> None:
    assert set(PROVIDER_KINDS) >= {
        "memory",
        "compression",
        "skills",
        "workspace",
        "knowledge",
        "wiki",
        "mcp",
        "long_term_memory",
    }


def test_load_and_build_from_toml(config_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(config_dir.parent)  # relative roots must not depend on the cwd
    decls = load_provider_decls(config_dir / "raf.toml")
    assert [d.kind for d in decls] == [
        "memory",
        "compression",
        "workspace",
        "skills",
        "knowledge",
        "wiki",
    ]
    assert decls[4].name == "docs"
    assert dict(decls[4].options) == {"root": "docs", "top_k": 2}
    providers = build_providers(decls)
    history, compression, workspace, skills, knowledge, wiki = providers
    assert isinstance(history, HistoryProvider)
    assert history.name == "history"
    assert isinstance(compression, CompressionProvider)
    assert isinstance(compression.strategy, TokenBudgetStrategy)
    assert compression.strategy.max_tokens == 2000
    assert isinstance(workspace, WorkspaceContextProvider)
    assert workspace.root == (config_dir / "ws").resolve()
    assert (workspace.writable, workspace.max_bytes) == (False, 5000)
    assert isinstance(skills, AgentSkillsProvider)
    assert skills.root == (config_dir / "skills").resolve()
    assert isinstance(knowledge, KnowledgeProvider)
    assert (knowledge.name, knowledge.kind, knowledge.top_k) == ("docs", "knowledge", 2)
    assert wiki.kind == "wiki"
    assert wiki.name == "KnowledgeProvider"
    assert (knowledge.volatile, wiki.volatile) == (True, False)


async def test_declared_providers_run(config_dir: Path) -> None:
    providers = build_providers(load_provider_decls(config_dir / "raf.toml"))
    client = ScriptedChatClient(
        [
            ScriptedChatClient.tool_turn(ToolCall("1", "read_file", '{"path": "hello.txt"}')),
            "It says hello.",
        ]
    )
    session = InMemorySession()
    response = await Agent(client, stack=providers).run("what is in hello.txt?", session=session)
    assert response.messages[1].content == "hello from the workspace"
    assert len(await session.get_messages()) == 4


def test_unknown_kind_lists_the_known_ones() -> None:
    with pytest.raises(AgentError) as caught:
        build_provider(ContextProviderDecl("memroy"))
    assert isinstance(caught.value, ConfigError)
    message = str(caught.value)
    assert "unknown provider kind 'memroy'" in message
    known = "compression, knowledge, long_term_memory, mcp, memory, skills, wiki, workspace"
    assert known in message


@pytest.mark.parametrize(
    ("kind", "options", "expected"),
    [
        ("workspace", {}, "provider kind 'workspace': option 'root' is required: a path"),
        ("workspace", {"root": 3}, "option 'root' must be a path (a non-empty string), got 3"),
        ("workspace", {"root": ".", "writable": "no"}, "option 'writable' must be true or false"),
        ("workspace", {"root": ".", "max_bytes": 0}, "option 'max_bytes' must be an integer >= 1"),
        ("workspace", {"root": ".", "rot": "."}, "unknown option(s) 'rot'"),
        ("knowledge", {"root": ".", "top_k": True}, "option 'top_k' must be an integer >= 1"),
        ("compression", {"strategy": "zip"}, "option 'strategy' must be one of 'truncation'"),
        ("compression", {"strategy": "token_budget"}, "option 'max_tokens' is required"),
        ("compression", {"keep_last": "all"}, "option 'keep_last' must be an integer"),
        ("compression", {"max_tokens": 10}, "unknown option(s) 'max_tokens'"),
        ("compression", {"strategy": "summary"}, "strategy 'summary' needs a chat client"),
        ("memory", {"inject": 1}, "option 'inject' must be true or false, got 1"),
        ("mcp", {}, "provider kind 'mcp': option 'command' is required"),
        ("mcp", {"command": "x", "env": {"A": 1}}, "option 'env' must be a table of strings"),
        ("skills", {"root": "missing-folder"}, "skills root"),
    ],
)
def test_wrong_or_missing_options_name_kind_option_and_expectation(
    tmp_path: Path, kind: str, options: dict[str, Any], expected: str
) -> None:
    decl = ContextProviderDecl(kind, options=options, base_dir=tmp_path)
    with pytest.raises(ConfigError) as caught:
        build_provider(decl)
    assert expected in str(caught.value)


def test_error_names_the_declared_name() -> None:
    with pytest.raises(ConfigError, match=r"provider kind 'workspace' \(name 'files'\)"):
        build_provider(ContextProviderDecl("workspace", "files"))


def test_summary_strategy_from_data_uses_the_given_client() -> None:
    client = ScriptedChatClient()
    decl = ContextProviderDecl(
        "compression", options={"strategy": "summary", "keep_last": 4, "on_failure": "raise"}
    )
    provider = build_provider(decl, chat_client=client)
    assert isinstance(provider.strategy, SummaryStrategy)
    assert provider.strategy.chat_client is client
    assert (provider.strategy.keep_last, provider.strategy.on_failure) == (4, "raise")
    default = build_provider(ContextProviderDecl("compression"))
    assert isinstance(default.strategy, TruncationStrategy)


class ClockOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    zone: str = "UTC"


class Clock(ContextProvider):
    kind = "clock"

    def __init__(self, zone: str) -> None:
        self.zone = zone


def test_register_a_kind_in_a_private_registry() -> None:
    registry = dict(PROVIDER_KINDS)
    register_provider_kind("clock", lambda o: Clock(o.parse(ClockOptions).zone), registry=registry)
    clock = build_provider(ContextProviderDecl("clock", "tick", {"zone": "CET"}), registry)
    assert (clock.name, clock.zone) == ("tick", "CET")
    assert "clock" not in PROVIDER_KINDS
    with pytest.raises(ConfigError, match="unknown provider kind 'clock'"):
        build_provider(ContextProviderDecl("clock"))
    with pytest.raises(ValueError, match="already registered"):
        register_provider_kind("clock", lambda o: Clock("UTC"), registry=registry)
    register_provider_kind("clock", lambda o: Clock("UTC"), registry=registry, replace=True)


def test_register_in_the_default_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("raf._config.declarations.PROVIDER_KINDS", dict(PROVIDER_KINDS))
    import raf._config.declarations

    def make(options: ProviderOptions) -> Clock:
        return Clock(options.parse(ClockOptions).zone)

    register_provider_kind("clock", make)
    assert "clock" in raf._config.declarations.PROVIDER_KINDS
    assert build_provider(ContextProviderDecl("clock", options={"zone": "UTC"})).zone == "UTC"


def test_a_factory_type_error_becomes_a_config_error() -> None:
    def broken(options: ProviderOptions) -> object:
        raise TypeError("zone must be a str")

    with pytest.raises(ConfigError, match="provider kind 'clock': zone must be a str"):
        build_provider(ContextProviderDecl("clock"), {"clock": broken})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("providers = 3", "'providers' must be an array of tables"),
        ("providers = [1]", "providers[0] must be a table"),
        ("[[providers]]\nname = 'x'", "providers[0]: 'kind' is required"),
        ("[[providers]]\nkind = 'memory'\nname = 3", "providers[0]: 'name' must be a non-empty"),
        ("[[providers]\nkind = 'memory'", "not valid TOML"),
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_provider_decls(path)
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


def test_missing_file_and_no_providers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load_provider_decls(tmp_path / "missing.toml")
    (tmp_path / "empty.toml").write_text("[agent]\nname = 'x'\n")
    assert load_provider_decls(tmp_path / "empty.toml") == []
    assert parse_provider_decls({}) == []


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "raf.toml"
    path.write_bytes(b"[[providers]]\nkind = '\xff'\n")
    with pytest.raises(ConfigError, match="not valid TOML: not UTF-8"):
        load_provider_decls(path)


def test_a_kind_by_import_path(tmp_path: Path) -> None:
    (tmp_path / "clock_kinds.py").write_text(
        "from tests.config.test_declarations import Clock, ClockOptions\n"
        "def clock(options):\n"
        "    return Clock(options.parse(ClockOptions).zone)\n"
        "not_a_factory = 3\n"
    )
    decl = ContextProviderDecl("clock_kinds:clock", "tick", {"zone": "CET"}, base_dir=tmp_path)
    clock = build_provider(decl)
    assert (type(clock).__name__, clock.name, clock.zone) == ("Clock", "tick", "CET")
    with pytest.raises(ConfigError, match="'clock_kinds:not_a_factory': int is not callable"):
        build_provider(ContextProviderDecl("clock_kinds:not_a_factory", base_dir=tmp_path))
    with pytest.raises(ConfigError, match="unknown option"):
        build_provider(
            ContextProviderDecl("clock_kinds:clock", options={"x": 1}, base_dir=tmp_path)
        )


def test_import_object_names_what_went_wrong(tmp_path: Path) -> None:
    (tmp_path / "broken_on_import.py").write_text("raise RuntimeError('no config here')\n")
    assert import_object("raf.errors:ConfigError.__name__") == "ConfigError"
    cases = {
        "raf.errors": "an import path has the form 'package.module:name'",
        "raf.errors:": "an import path has the form",
        "raf.errors:Nope": "'raf.errors' has no attribute 'Nope'",
        "broken_on_import:x": "cannot import 'broken_on_import': RuntimeError: no config here",
    }
    for spec, message in cases.items():
        with pytest.raises(ConfigError) as caught:
            import_object(spec, base_dir=tmp_path, what="tool")
        assert str(caught.value).startswith(f"tool {spec!r}: ")
        assert message in str(caught.value)
    assert str(tmp_path) not in __import__("sys").path  # the folder was on sys.path only to import


def test_kinds_from_installed_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    (site / "tz_kinds-1.0.dist-info").mkdir(parents=True)
    (site / "tz_kinds.py").write_text(
        "from tests.config.test_declarations import Clock\n"
        "def clock(options):\n    return Clock('UTC')\n"
    )
    (site / "tz_kinds-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tz-kinds\nVersion: 1.0\n"
    )
    (site / "tz_kinds-1.0.dist-info" / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ntzclock = tz_kinds:clock\nbad = tz_kinds:nothing\n"
    )
    with pytest.raises(ConfigError) as caught:
        build_provider(ContextProviderDecl("tzclock"))
    known = "compression, knowledge, long_term_memory, mcp, memory, skills, wiki, workspace"
    assert f"known kinds: {known} (" in str(caught.value)
    monkeypatch.syspath_prepend(str(site))
    assert build_provider(ContextProviderDecl("tzclock", "tz")).name == "tz"
    with pytest.raises(ConfigError) as caught:
        build_provider(ContextProviderDecl("nope"))
    known = "bad, compression, knowledge, long_term_memory, mcp, memory, skills, tzclock, wiki"
    assert f"known kinds: {known}" in str(caught.value)
    with pytest.raises(ConfigError, match="its entry point 'tz_kinds:nothing'"):
        build_provider(ContextProviderDecl("bad"))
    # A kind of the registry wins over one of the same name from a package.
    assert build_provider(ContextProviderDecl("memory")).kind == "memory"


def test_chat_stack_declarations() -> None:
    data = {
        "chat_stack": [
            {
                "kind": "retry",
                "attempts": 5,
                "wait_initial": 0,
                "wait_max": 1.5,
                "retry_on": ["raf.errors:RateLimitError"],
            },
            {"kind": "logging"},
        ]
    }
    retry, logging = (build_chat_middleware(d) for d in parse_chat_stack_decls(data))
    assert isinstance(retry, RetryMiddleware)
    assert (retry.attempts, retry.wait_initial, retry.wait_max) == (5, 0, 1.5)
    assert retry.retry_on == (RateLimitError,)
    assert isinstance(logging, LoggingMiddleware)
    for decl, message in [
        ({"kind": "retry", "wait_max": -1}, "chat_stack kind 'retry': option 'wait_max' must be"),
        ({"kind": "retry", "retry_on": "x"}, "option 'retry_on' must be a list of strings"),
        ({"kind": "retry", "retry_on": ["raf.errors:nope"]}, "has no attribute 'nope'"),
        ({"kind": "retry", "attempts": True}, "option 'attempts' must be an integer >= 1"),
        ({"kind": "logging", "level": "info"}, "unknown option(s) 'level'"),
    ]:
        [parsed] = parse_chat_stack_decls({"chat_stack": [decl]})
        with pytest.raises(ConfigError) as caught:
            build_chat_middleware(parsed)
        assert message in str(caught.value)


def test_the_error_texts_of_declaring_providers_md_are_what_the_code_says(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "declaring-providers.md").read_text()
    errors = page.split("## Errors", 1)[1].split("\n## ", 1)[0]
    shown = re.findall(r"`((?:unknown|provider kind)[^`]*)`", errors)
    (tmp_path / "docs").mkdir()
    produced = set()
    for decl in [
        ContextProviderDecl("memroy"),
        ContextProviderDecl("workspace"),
        ContextProviderDecl("knowledge", "handbook", {"root": "docs", "top_k": 0}),
        ContextProviderDecl("workspace", options={"root": ".", "rot": "."}),
    ]:
        with pytest.raises(ConfigError) as caught:
            build_provider(attrs.evolve(decl, base_dir=tmp_path))
        produced.add(str(caught.value))
    assert len(shown) == 4
    assert set(shown) == produced


def test_a_factory_that_fails_otherwise_is_a_config_error_too() -> None:
    def broken(options: ProviderOptions) -> object:
        raise KeyError("zone")

    with pytest.raises(ConfigError, match="provider kind 'clock': the factory failed: KeyError"):
        build_provider(ContextProviderDecl("clock"), {"clock": broken})


def test_a_huge_or_deeply_nested_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="/dev/zero: not a config file: larger than 1024 KiB"):
        load_provider_decls("/dev/zero")
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_provider_decls(deep)


def test_workspace_and_skills_take_a_tool_prefix(tmp_path: Path) -> None:
    from raf.config import ContextProviderDecl, build_provider

    (tmp_path / "ws").mkdir()
    (tmp_path / "skills").mkdir()
    workspace = build_provider(
        ContextProviderDecl(
            "workspace", options={"root": str(tmp_path / "ws"), "tool_prefix": "notes_"}
        )
    )
    skills = build_provider(
        ContextProviderDecl(
            "skills", options={"root": str(tmp_path / "skills"), "tool_prefix": "s_"}
        )
    )
    assert workspace.tool_prefix == "notes_"  # type: ignore[attr-defined]
    assert skills.tool_prefix == "s_"  # type: ignore[attr-defined]


@pytest.mark.parametrize("flag", [True, False])
async def test_a_declared_memory_takes_persist_partial(flag: bool) -> None:
    text = f"[[providers]]\nkind = 'memory'\npersist_partial = {str(flag).lower()}\n"
    (provider,) = build_providers(parse_provider_decls(tomllib.loads(text)))
    assert isinstance(provider, HistoryProvider)
    assert provider.persist_partial is flag
    session = InMemorySession()
    agent = Agent(ScriptedChatClient([["Once ", "upon"]]), stack=[provider])
    async with agent.stream("story", session=session) as stream:
        async for _ in stream:
            break  # the consumer leaves after the first update
    stored = [m.content for m in await session.get_messages()]
    assert stored == (["story", "Once "] if flag else [])


def test_persist_partial_must_be_a_boolean() -> None:
    with pytest.raises(ConfigError, match="persist_partial"):
        build_providers(
            parse_provider_decls({"providers": [{"kind": "memory", "persist_partial": 1}]})
        )


# The config file's loaders (moved from tests/cli: they test these functions, not the command) --


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_relative_roots_are_resolved_against_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ws").mkdir()
    path = write_config(tmp_path, "[[providers]]\nkind = 'workspace'\nroot = 'ws'\nname = 'files'")
    monkeypatch.chdir("/")
    agent = load_agent(path)
    [provider] = agent.providers
    assert provider.name == "files"


@pytest.mark.parametrize("client", ["openai", "openai-responses", "anthropic", "gemini"])
def test_the_model_table_names_both_timeouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    monkeypatch.setenv("SUPPORT_BOT_KEY", "sk")
    path = write_config(
        tmp_path,
        f"""
[agent]
name = "support"

[model]
client = "{client}"
model = "test-model"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "SUPPORT_BOT_KEY"
timeout = 5
idle_timeout = 7.5
""",
    )
    model: Any = load_agent(path).chat_client
    assert (model.timeout, model.idle_timeout) == (5, 7.5)


def test_a_config_that_is_a_fifo_with_no_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "agent.toml"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_config(fifo)
        except BaseException as exc:  # what the reading thread ended with, for the test
            outcome.append(exc)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # it hangs in open(): let it go before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert not reader.is_alive()
    [error] = outcome
    assert isinstance(error, ConfigError)
    assert "not a regular file" in str(error)


def test_a_tools_module_that_exits_on_import_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "quitter.py").write_text("import sys\nsys.exit(0)\n")
    path = write_config(tmp_path, '[agent]\nname = "a"\ntools = ["quitter:tool"]\n')
    with pytest.raises(ConfigError, match=r"cannot import 'quitter'.*exit.*0"):
        load_agent(path)


def test_the_support_example_loads_its_tools_and_options() -> None:
    loaded = load_config(Path(__file__).resolve().parents[2] / "examples" / "support.toml")
    assert [t.name for t in loaded.agent.tools] == ["order_status", "today"]
    assert (loaded.options.temperature, loaded.options.max_tokens) == (0.2, 500)


# The windows' step and cold_after; the clear_tool_results strategy (issue 42) ------------------


def built(kind: str, chat_client: Any = None, **options: Any) -> Any:
    return build_provider(ContextProviderDecl(kind, options=options), chat_client=chat_client)


def test_a_declared_memory_takes_step_and_cold_after() -> None:
    declared = built("memory", max_tokens=3000, step=1500, cold_after=60)
    assert vars(declared) == vars(HistoryProvider(max_tokens=3000, step=1500, cold_after=60.0))
    # false: never cut early (TOML has no null); not set: the class's defaults.
    assert built("memory", max_messages=40, cold_after=False).cold_after is None
    assert vars(built("memory", max_messages=40)) == vars(HistoryProvider(max_messages=40))


@pytest.mark.parametrize(
    ("options", "made"),
    [
        (
            {"keep_last": 30, "step": 10, "cold_after": 0},
            TruncationStrategy(30, step=10, cold_after=0),
        ),
        (
            {"strategy": "token_budget", "max_tokens": 3000, "step": 1500, "cold_after": False},
            TokenBudgetStrategy(3000, step=1500, cold_after=None),
        ),
        ({"strategy": "token_budget", "max_tokens": 3000}, TokenBudgetStrategy(3000)),
        (
            {"strategy": "clear_tool_results", "keep_last": 0, "clear_at_least": 6000},
            ClearToolResults(keep_last=0, clear_at_least=6000),
        ),
        (
            {"strategy": "clear_tool_results", "exclude": ["read_file"], "cold_after": 120},
            ClearToolResults(exclude=("read_file",), cold_after=120.0),
        ),
        ({"strategy": "clear_tool_results"}, ClearToolResults()),
    ],
)
def test_a_declared_strategy_is_what_the_python_api_makes(
    options: dict[str, Any], made: Any
) -> None:
    strategy = built("compression", **options).strategy
    assert type(strategy) is type(made)
    assert vars(strategy) == vars(made)


def test_a_declared_summary_takes_step_and_cold_after() -> None:
    client = ScriptedChatClient()
    options = {"strategy": "summary", "keep_last": 10, "step": 5, "cold_after": 30}
    strategy = built("compression", client, **options).strategy
    assert vars(strategy) == vars(SummaryStrategy(client, 10, step=5, cold_after=30.0))


@pytest.mark.parametrize(
    ("kind", "options", "expected"),
    [
        (
            "memory",
            {"cold_after": -1},
            "option 'cold_after' must be a number of seconds >= 0, or "
            "false (never cut early), got -1",
        ),
        ("memory", {"cold_after": True}, "option 'cold_after' must be a number of seconds"),
        ("memory", {"step": 0}, "option 'step' must be an integer >= 1, got 0"),
        # What the class itself refuses: still one line that names the kind.
        (
            "memory",
            {"step": 3},
            "provider kind 'memory': step is in its bound's unit: give it "
            "with one bound, not no bound",
        ),
        (
            "memory",
            {"max_messages": 4, "step": 9},
            "provider kind 'memory': step must be an int from 1 to the bound (4), got 9",
        ),
        ("compression", {"keep_last": 5, "step": 6}, "provider kind 'compression': step must be"),
        (
            "compression",
            {"strategy": "clear_tool_results", "keep_last": -1},
            "provider kind 'compression': option 'keep_last' must be an integer >= 0, got -1",
        ),
        (
            "compression",
            {"strategy": "clear_tool_results", "clear_at_least": 1.5},
            "option 'clear_at_least' must be an integer >= 0, got 1.5",
        ),
        (
            "compression",
            {"strategy": "clear_tool_results", "exclude": "read_file"},
            "option 'exclude' must be a list of strings, got 'read_file'",
        ),
        (
            "compression",
            {"strategy": "clear_tool_results", "step": 2},
            "unknown option(s) 'step' (known options: clear_at_least, cold_after, exclude, "
            "keep_last, max_messages, strategy)",
        ),
    ],
)
def test_wrong_window_and_clearing_options_are_config_errors(
    kind: str, options: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        built(kind, **options)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)
