"""The config file's stacks: the ``[[chat_stack]]`` kinds compaction, usage_limits and
spend_limits, and the ``[[tool_stack]]`` table, built as the Python API builds them."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from raf import (
    Budget,
    CompactionMiddleware,
    EchoChatClient,
    SpendLimits,
    ToolGuardrail,
    ToolOutputLimit,
    UsageLimits,
)
from raf._cli import main
from raf._config.file import build_chat_middleware, build_tool_middleware, load_config
from raf.compression import SummaryStrategy, TokenBudgetStrategy
from raf.config import ContextProviderDecl
from raf.errors import ConfigError


def chat(kind: str, **options: Any) -> Any:
    return build_chat_middleware(ContextProviderDecl(kind, options=options))


def tool(kind: str, **options: Any) -> Any:
    return build_tool_middleware(ContextProviderDecl(kind, options=options))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_compaction_is_what_the_python_api_makes() -> None:
    declared = chat("compaction", threshold_tokens=100_000)
    assert repr(declared) == repr(CompactionMiddleware(100_000))
    fallback = {"strategy": "token_budget", "max_tokens": 2000, "step": 1000, "cold_after": 0}
    declared = chat("compaction", threshold_tokens=8000, native=False, fallback=fallback)
    made = CompactionMiddleware(
        8000, fallback=TokenBudgetStrategy(2000, step=1000, cold_after=0), native=False
    )
    assert repr(declared) == repr(made)
    assert vars(declared.fallback) == vars(made.fallback)


def test_a_summary_fallback_writes_with_the_configs_model(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[[chat_stack]]\nkind = 'compaction'\nthreshold_tokens = 8000\n"
        "fallback = {strategy = 'summary', keep_last = 6}\n",
    )
    agent = load_config(path).agent
    [compaction] = agent.chat_stack
    assert isinstance(compaction.fallback, SummaryStrategy)
    assert compaction.fallback.chat_client is agent.chat_client
    assert compaction.fallback.keep_last == 6


def test_usage_limits_are_what_the_python_api_makes() -> None:
    declared = chat("usage_limits", max_requests=8, max_cost="0.005", max_output_tokens=0)
    made = UsageLimits(max_requests=8, max_cost="0.005", max_output_tokens=0)
    assert repr(declared) == repr(made)
    assert chat("usage_limits", max_cost=0.15).max_cost == Decimal("0.15")
    assert chat("usage_limits", max_cost=2).max_cost == Decimal(2)
    assert repr(chat("usage_limits")) == repr(UsageLimits())


def test_spend_limits_are_what_the_python_api_makes() -> None:
    budgets = [
        {"usd": 5, "per": "day", "scope": "key"},
        {"usd": "0.50", "per": "hour", "name": "hourly"},
    ]
    declared = chat("spend_limits", budgets=budgets)
    made = SpendLimits([Budget(5, "day", "key"), Budget("0.50", "hour", name="hourly")])
    assert (declared.budgets, declared.store) == (made.budgets, None)
    assert repr(declared) == repr(made)


@pytest.mark.parametrize(
    ("store", "expected"),
    [
        ("spend.db", "{folder}/spend.db"),
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("postgresql://raf@db/raf", "postgresql://raf@db/raf"),
    ],
)
def test_a_spend_store_path_starts_at_the_configs_folder(
    tmp_path: Path, store: str, expected: str
) -> None:
    path = write(
        tmp_path,
        f"[[chat_stack]]\nkind = 'spend_limits'\nstore = '{store}'\n"
        "budgets = [{usd = 1, per = 'day'}]\n",
    )
    [limits] = load_config(path).agent.chat_stack
    assert str(limits.store) == expected.format(folder=tmp_path)


def test_tool_output_limit_is_what_the_python_api_makes() -> None:
    assert tool("tool_output_limit", max_chars=4000) == ToolOutputLimit(4000)
    declared = tool("tool_output_limit", max_chars=4000, keep="head", spill=False, preview_chars=9)
    assert declared == ToolOutputLimit(4000, keep="head", spill=False, preview_chars=9)


TOOL_STACK = """
[[guardrails]]
kind = "tool"
check = "pii_redactor"

[[tool_stack]]
kind = "tool_output_limit"
max_chars = 6000

[[tool_stack]]
kind = "house_tools:counting"
"""

HOUSE_TOOLS = """
def counting(options):
    async def middleware(request, call_next):
        return await call_next(request)
    return middleware
"""


def test_the_tool_stack_goes_first_then_the_tool_guardrails(tmp_path: Path) -> None:
    (tmp_path / "house_tools.py").write_text(HOUSE_TOOLS)
    stack = load_config(write(tmp_path, TOOL_STACK)).agent.tool_stack
    assert stack[0] == ToolOutputLimit(6000)  # outermost: what is kept is what the rest made
    assert callable(stack[1])
    assert not isinstance(stack[1], ToolOutputLimit)
    assert isinstance(stack[2], ToolGuardrail)


def test_a_config_with_every_new_kind_runs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[[providers]]\nkind = 'memory'\ninject = false\n\n"
        "[[providers]]\nkind = 'compression'\nstrategy = 'clear_tool_results'\n\n"
        "[[chat_stack]]\nkind = 'compaction'\nthreshold_tokens = 8000\n"
        "fallback = {strategy = 'truncation', keep_last = 10}\n\n"
        "[[chat_stack]]\nkind = 'usage_limits'\nmax_requests = 3\n\n"
        "[[tool_stack]]\nkind = 'tool_output_limit'\nmax_chars = 4000\n",
    )
    loaded = load_config(path)
    assert isinstance(loaded.agent.chat_client, EchoChatClient)
    assert main(["run", str(path), "hello", "--db", str(tmp_path / "s.db")]) == 0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            "[[chat_stack]]\nkind = 'compaction'",
            "chat_stack[0]: chat_stack kind 'compaction': option 'threshold_tokens' is "
            "required: an integer >= 1",
        ),
        (
            "[[chat_stack]]\nkind = 'compaction'\nthreshold_tokens = 9\nfallback = 'summary'",
            "option 'fallback' must be a table: a compression strategy (strategy = ..., and its "
            "options), got 'summary'",
        ),
        (
            "[[chat_stack]]\nkind = 'compaction'\nthreshold_tokens = 9\n"
            "fallback = {strategy = 'truncation', keep_last = 0}",
            "chat_stack kind 'compaction': option 'fallback': option 'keep_last' must be an "
            "integer >= 1, got 0",
        ),
        (
            "[[chat_stack]]\nkind = 'compaction'\nthreshold_tokens = 9\n"
            "fallback = {strategy = 'truncation', max_messages = 50}",
            "option 'fallback': max_messages bounds what a compression provider loads",
        ),
        (
            "[[chat_stack]]\nkind = 'usage_limits'\nmax_requests = -1",
            "chat_stack kind 'usage_limits': option 'max_requests' must be an integer >= 0, got -1",
        ),
        (
            "[[chat_stack]]\nkind = 'usage_limits'\nmax_cost = 'a lot'",
            "chat_stack kind 'usage_limits': UsageLimits: max_cost must be a number of USD, "
            "got 'a lot'",
        ),
        (
            "[[chat_stack]]\nkind = 'usage_limits'\nmax_cost = true",
            "option 'max_cost' must be a number of USD >= 0, or a decimal string ('0.50'), "
            "got True",
        ),
        (
            "[[chat_stack]]\nkind = 'usage_limits'\nmax_reqests = 3",
            "chat_stack kind 'usage_limits': unknown option(s) 'max_reqests' (known options: "
            "max_cost, max_input_tokens, max_output_tokens, max_request_input_tokens, "
            "max_requests, max_total_tokens)",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'",
            "chat_stack kind 'spend_limits': option 'budgets' is required: a list of one or "
            "more tables",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = []",
            "option 'budgets' must be a list of one or more tables ({usd = ..., per = ..., "
            "scope = ..., name = ...}), got []",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = [{usd = 1, per = 'week'}]",
            "chat_stack kind 'spend_limits': budgets[0]: option 'per' must be one of 'minute', "
            "'hour', 'day', 'month', got 'week'",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = [{usd = 1, per = 'day'}, "
            "{per = 'day'}]",
            "chat_stack kind 'spend_limits': budgets[1]: option 'usd' is required",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = [{usd = 1, per = 'day', "
            "scope = 'user'}]",
            "budgets[0]: option 'scope' must be one of 'session', 'agent', 'key', got 'user'",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = [{usd = 1, per = 'day', usd_ = 2}]",
            "budgets[0]: unknown option(s) 'usd_' (known options: name, per, scope, usd)",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'\nbudgets = [{usd = -1, per = 'day'}]",
            "chat_stack kind 'spend_limits': Budget: usd must be finite and >= 0 (USD), got -1",
        ),
        (
            "[[chat_stack]]\nkind = 'spend_limits'\n"
            "budgets = [{usd = 1, per = 'day'}, {usd = 2, per = 'day'}]",
            "chat_stack kind 'spend_limits': SpendLimits: Budget(usd=Decimal('1'), per='day', "
            "scope='session', name=None) and Budget(usd=Decimal('2'), per='day', "
            "scope='session', name=None) count the same spending",
        ),
        (
            "[[tool_stack]]\nkind = 'tool_output_limit'",
            "tool_stack[0]: tool_stack kind 'tool_output_limit': option 'max_chars' is "
            "required: an integer >= 1",
        ),
        (
            "[[tool_stack]]\nkind = 'tool_output_limit'\nmax_chars = 100",
            "tool_stack[0]: tool_stack kind 'tool_output_limit': ToolOutputLimit(max_chars=100): "
            "max_chars must be at least 224",
        ),
        (
            "[[tool_stack]]\nkind = 'tool_output_limit'\nmax_chars = 1000\npreview_chars = 900",
            "tool_stack kind 'tool_output_limit': ToolOutputLimit(max_chars=1000, "
            "preview_chars=900): preview_chars must be an int from 0 to 776",
        ),
        (
            "[[tool_stack]]\nkind = 'tool_output_limit'\nmax_chars = 1000\nkeep = 'tail'",
            "option 'keep' must be one of 'head_tail', 'head', got 'tail'",
        ),
        (
            "[[tool_stack]]\nkind = 'output_limit'",
            "tool_stack[0]: unknown tool_stack kind 'output_limit'; known kinds: "
            "tool_output_limit (or an import path 'package.module:factory')",
        ),
        ("[[tool_stack]]\nname = 'x'", "tool_stack[0]: 'kind' is required"),
        (
            "[[tool_stacks]]\nkind = 'tool_output_limit'",
            "unknown top-level table [[tool_stacks]]; did you mean [[tool_stack]]?",
        ),
    ],
)
def test_a_mistake_in_a_stack_is_one_line_naming_table_kind_and_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, message: str
) -> None:
    path = write(tmp_path, config)
    assert main(["run", str(path), "hi"]) == 2
    out, err = capsys.readouterr()
    assert (out, err.count("\n")) == ("", 1)
    assert err.startswith(f"raf: {path}: ")
    assert message in err
    assert "validation error" not in err


def test_a_tool_stack_factory_must_return_middleware(tmp_path: Path) -> None:
    (tmp_path / "not_middleware.py").write_text("def make(options):\n    return 3\n")
    decl = ContextProviderDecl("not_middleware:make", base_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"the factory returned int, not middleware"):
        build_tool_middleware(decl)
