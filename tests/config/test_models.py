"""The config's pydantic models: the shipped JSON Schema, and the one-line errors they make."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict

from raf._cli import main
from raf._config.file import build_chat_middleware, build_tool_middleware
from raf._config.models import BUILTIN_PROVIDER_OPTIONS, _models, config_schema, schema_text
from raf._config.stack_options import (
    BUILTIN_CHAT_STACK_OPTIONS,
    BUILTIN_TOOL_STACK_OPTIONS,
    BudgetOptions,
)
from raf.config import PROVIDER_KINDS, ContextProviderDecl, build_provider
from raf.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "raf" / "config.schema.json"


def test_the_shipped_schema_is_what_the_models_generate() -> None:
    assert SHIPPED.read_text(encoding="utf-8") == schema_text(), (
        "raf/config.schema.json is stale: python -m raf._config.models > raf/config.schema.json"
    )
    jsonschema.Draft202012Validator.check_schema(config_schema())


def test_raf_schema_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    out, err = capsys.readouterr()
    assert (json.loads(out), err) == (config_schema(), "")


def _toml(text: str) -> dict[str, Any]:
    return tomllib.loads(text)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.toml")), ids=lambda p: p.name)
def test_the_examples_follow_the_schema(path: Path) -> None:
    jsonschema.validate(_toml(path.read_text()), config_schema())


@pytest.mark.parametrize(
    "text",
    [
        "[agent]\nnam = 'x'",
        "[model]\nclient = 'gpt'",
        "[model]\nmax_tokens = 0",
        "[[providers]]\nkind = 'workspace'\nroot = '.'\nrot = '.'",
        "[[providers]]\nkind = 'workspace'",
        "[[providers]]\nkind = 'memory'\ninject = 1",
        "[[providers]]\nkind = 'compression'\nstrategy = 'token_budget'",
        "[[providers]]\nkind = 'compression'\nmax_tokens = 10",
        "[[chat_stack]]\nkind = 'retry'\nattempts = 'many'",
        "[[chat_stack]]\nkind = 'logging'\nlevel = 1",
        "[agents]\nname = 'x'",
        "[[providers]]\nkind = 'memory'\ncold_after = true",
        "[[providers]]\nkind = 'memory'\ncold_after = -1",
        "[[providers]]\nkind = 'compression'\nstrategy = 'clear_tool_results'\nkeep_last = -1",
        "[[providers]]\nkind = 'compression'\nstrategy = 'clear_tool_results'\nexclude = 'x'",
        "[[chat_stack]]\nkind = 'compaction'",
        "[[chat_stack]]\nkind = 'usage_limits'\nmax_requests = -1",
        "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = []",
        "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = [{usd = 1, per = 'week'}]",
        "[[tool_stack]]\nkind = 'tool_output_limit'",
        "[[tool_stack]]\nkind = 'tool_output_limit'\nmax_chars = 1000\nkeep = 'tail'",
    ],
)
def test_the_schema_flags_what_the_command_refuses(tmp_path: Path, text: str) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_toml(text), config_schema())
    path = tmp_path / "agent.toml"
    path.write_text(text)
    assert main(["run", str(path), "hi"]) == 2


def test_the_schema_leaves_a_kind_of_your_own_its_options() -> None:
    data = _toml("[[providers]]\nkind = 'house:motto'\nmotto = 'hi'\nloud = true\n")
    jsonschema.validate(data, config_schema())
    data = _toml("[[providers]]\nkind = 'compression'\nstrategy = 'summary'\nkeep_last = 4\n")
    jsonschema.validate(data, config_schema())
    data = _toml("[[tool_stack]]\nkind = 'house:cap'\nmost = 3\n")
    jsonschema.validate(data, config_schema())


def test_the_schema_takes_what_the_command_takes() -> None:
    data = _toml(
        "[[providers]]\nkind = 'memory'\nmax_tokens = 3000\nstep = 1500\ncold_after = false\n"
        "[[providers]]\nkind = 'compression'\nstrategy = 'clear_tool_results'\ncold_after = 0\n"
        "[[chat_stack]]\nkind = 'compaction'\nthreshold_tokens = 9\n"
        "fallback = {strategy = 'summary', keep_last = 4}\n"
        "[[chat_stack]]\nkind = 'usage_limits'\nmax_cost = '0.10'\nmax_requests = 0\n"
        "[[chat_stack]]\nkind = 'spend_limits'\nstore = 'spend.db'\n"
        "budgets = [{usd = 5, per = 'day', scope = 'key'}, {usd = 0.5, per = 'hour'}]\n"
        "[[tool_stack]]\nkind = 'tool_output_limit'\nmax_chars = 6000\nspill = false\n"
    )
    jsonschema.validate(data, config_schema())


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "[[providers]]\nkind = 'memory'\ninjct = true",
            "providers[0]: provider kind 'memory': unknown option(s) 'injct' "
            "(known options: cold_after, inject, max_messages, max_tokens, persist_partial, step)",
        ),
        (
            "[[providers]]\nkind = 'memory'\nname = 'history'\ninject = 'yes'",
            "providers[0]: provider kind 'memory' (name 'history'): option 'inject' must be "
            "true or false, got 'yes'",
        ),
        (
            "[[providers]]\nkind = 'mcp'\ncommand = 'x'\ntimeout = 'slow'",
            "option 'timeout' must be a positive number, got 'slow'",
        ),
        (
            "[[providers]]\nkind = 'compression'\nstrategy = 'summary'\non_failure = 'ignore'",
            "option 'on_failure' must be one of 'truncate', 'raise', got 'ignore'",
        ),
        (
            "[[providers]]\nkind = 'compression'\nstrategy = 3",
            "option 'strategy' must be one of 'truncation', 'token_budget', 'summary', "
            "'clear_tool_results', got 3",
        ),
        (
            "[[providers]]\nkind = 'compression'\nstrategy = 'token_budget'\nmax_tokens = 9\n"
            "keep_last = 2",
            "unknown option(s) 'keep_last' (known options: cold_after, max_messages, max_tokens, "
            "step, strategy)",
        ),
        (
            "[[chat_stack]]\nkind = 'retry'\nwait_max = 'long'",
            "chat_stack[0]: chat_stack kind 'retry': option 'wait_max' must be a number >= 0",
        ),
        ("[agent]\nname = 3", "[agent] name must be a string, got 3"),
        ("[agent]\ntools = ['a:b', 3]", "[agent] tools must be a list of import paths"),
        ("[agent]\nnam = 'x'\nmodl = 1", "[agent] has unknown keys ['modl', 'nam']"),
        ("[model]\ntemperature = true", "[model] temperature must be a number >= 0, got True"),
        ("[model]\nmax_tokens = 1.5", "[model] max_tokens must be an integer >= 1, got 1.5"),
        ("[model]\nmax_tokens = '300'", "[model] max_tokens must be an integer >= 1, got '300'"),
        ("[model]\nclient = 3", '[model] client must be "echo" or "openai"'),
        ("model = 3", "[model] must be a table"),
        ("[modle]\nclient = 'echo'", "unknown top-level table [modle]; did you mean [model]?"),
    ],
)
def test_mistakes_the_models_find_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, message: str
) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(config)
    assert main(["run", str(path), "hi"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"raf: {path}: ")
    assert message in err
    assert err.count("\n") == 1
    assert "validation error" not in err  # never pydantic's own report


JUNK: list[Any] = ["", "x", 0, -1, 1.5, float("inf"), True, [], [1], {}, {"a": 1}]


@pytest.mark.parametrize("kind", sorted(BUILTIN_PROVIDER_OPTIONS))
def test_no_value_of_any_option_gets_past_as_anything_but_a_config_error(
    tmp_path: Path, kind: str
) -> None:
    fields = {
        name for model in _models(BUILTIN_PROVIDER_OPTIONS[kind]) for name in model.model_fields
    }
    for field in sorted(fields):
        for value in JUNK:
            options = {"root": str(tmp_path), "command": "x", field: value}
            decl = ContextProviderDecl(kind, options=options, base_dir=tmp_path)
            try:
                build_provider(decl)
            except ConfigError as exc:
                refused = str(exc)
            else:
                continue
            assert "\n" not in refused
            assert refused.startswith(f"provider kind {kind!r}")


@pytest.mark.parametrize(
    ("kind", "build", "options"),
    [
        *[
            (kind, build_chat_middleware, model)
            for kind, model in BUILTIN_CHAT_STACK_OPTIONS.items()
        ],
        *[
            (kind, build_tool_middleware, model)
            for kind, model in BUILTIN_TOOL_STACK_OPTIONS.items()
        ],
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_no_value_of_a_stack_option_gets_past_as_anything_but_a_config_error(
    kind: str, build: Any, options: Any
) -> None:
    what = "tool_stack" if build is build_tool_middleware else "chat_stack"
    tried = [(field, value) for field in sorted(options.model_fields) for value in JUNK]
    if kind == "spend_limits":  # and each option of a budget
        tried += [
            ("budgets", [{"usd": 1, "per": "day", field: value}])
            for field in sorted(BudgetOptions.model_fields)
            for value in JUNK
        ]
    for field, value in tried:
        budgets = [{"usd": 1, "per": "day"}]
        given = {"threshold_tokens": 9, "max_chars": 1000, "budgets": budgets, field: value}
        try:
            build(ContextProviderDecl(kind, options=given))
        except ConfigError as exc:
            refused = str(exc)
        else:
            continue
        assert "\n" not in refused
        assert refused.startswith(f"{what} kind {kind!r}")


def test_retry_on_must_name_exception_classes() -> None:
    decl = ContextProviderDecl("retry", options={"retry_on": ["raf.errors:ConfigError", 3]})
    with pytest.raises(ConfigError, match=r"option 'retry_on' must be a list of strings, got \["):
        build_chat_middleware(decl)


class Zone(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    zone: str = "UTC"
    hours: int = 0


def test_a_kind_of_your_own_can_parse_its_options_with_a_model() -> None:
    registry = {**PROVIDER_KINDS, "zone": lambda o: o.parse(Zone)}
    parsed = build_provider(ContextProviderDecl("zone", options={"zone": "CET"}), registry)
    assert parsed == Zone(zone="CET")
    for options, message in [
        ({"zone": 1}, "provider kind 'zone': option 'zone' must be a valid string, got 1"),
        ({"hours": "2"}, "option 'hours' must be a valid integer, got '2'"),
        (
            {"zon": "CET"},
            "provider kind 'zone': unknown option(s) 'zon' (known options: hours, zone)",
        ),
    ]:
        with pytest.raises(ConfigError) as caught:
            build_provider(ContextProviderDecl("zone", options=options), registry)
        assert message in str(caught.value)


def test_a_wrong_option_says_what_it_must_be() -> None:
    # Was test_getters_and_models_refuse_the_same_way: the typed getters are gone, every
    # option is read by a pydantic model.
    decl = ContextProviderDecl("knowledge", options={"root": ".", "top_k": 0})
    with pytest.raises(ConfigError) as caught:
        build_provider(decl)
    assert (
        str(caught.value)
        == "provider kind 'knowledge': option 'top_k' must be an integer >= 1, got 0"
    )


def test_import_raf_does_not_import_the_models() -> None:
    code = (
        "import sys, raf\n"
        "raf.Agent(raf.EchoChatClient())\n"
        "print('raf._config.models' in sys.modules, 'pydantic' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    # The config's names (raf.config.build_provider...) load the models on first use, as the
    # other lazy names of raf load their modules.
    assert done.stdout == "False False\n"


@pytest.mark.parametrize(
    "page", ["cli.md", "declaring-providers.md", "long-running.md", "costs.md"]
)
def test_the_configs_in_the_docs_follow_the_schema(page: str) -> None:
    text = (ROOT / "docs" / page).read_text()
    blocks = [block.split("```", 1)[0] for block in text.split("```toml\n")[1:]]
    configs = [block for block in blocks if "[project" not in block]  # not pyproject.toml
    assert configs
    for block in configs:
        jsonschema.validate(_toml(block), config_schema())
