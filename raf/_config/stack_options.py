"""The options of each built-in ``[[chat_stack]]`` and ``[[tool_stack]]`` kind, as pydantic
models (the middleware the config file builds: :mod:`raf._config.file`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from raf._config.types import (
    Closed,
    Count,
    Expect,
    Flag,
    Money,
    NonNegative,
    NonNegativeCount,
    PathText,
    Text,
    TextList,
    class_default,
)
from raf._middleware.compaction import CompactionMiddleware
from raf._middleware.spend import Budget
from raf._middleware.tool_outputs import ToolOutputLimit

__all__: list[str] = []


class RetryOptions(Closed):
    """``[[chat_stack]] kind = "retry"``: :class:`raf.RetryMiddleware`'s options."""

    attempts: Count = 3
    retry_on: TextList | None = Field(
        default=None, description="import paths of exception classes ('package.module:name')"
    )
    wait_initial: NonNegative = 0.5
    wait_max: NonNegative = 8.0


class LoggingOptions(Closed):
    """``[[chat_stack]] kind = "logging"``: no options."""


class CompactionOptions(Closed):
    """``[[chat_stack]] kind = "compaction"``: :class:`raf.CompactionMiddleware`'s options."""

    threshold_tokens: Count = Field(description="keep each model call under this many tokens")
    native: Flag = Field(
        default=class_default(CompactionMiddleware, "native"),
        description="let a server that compacts (OpenAI Responses, Anthropic) do it",
    )
    fallback: (
        Annotated[
            dict[str, Any],
            Field(strict=True),
            Expect("a table: a compression strategy (strategy = ..., and its options)"),
        ]
        | None
    ) = Field(
        default=None,
        description="the compression strategy for other clients: a table as a compression "
        "provider's options (strategy = 'truncation', 'token_budget', 'summary' or "
        "'clear_tool_results', and its options); none: such clients are not compacted",
    )


_LIMIT = "at most this many in a run"


class UsageLimitsOptions(Closed):
    """``[[chat_stack]] kind = "usage_limits"``: :class:`raf.UsageLimits`' limits of one run."""

    max_requests: NonNegativeCount | None = Field(default=None, description="model calls " + _LIMIT)
    max_input_tokens: NonNegativeCount | None = Field(default=None, description=_LIMIT)
    max_output_tokens: NonNegativeCount | None = Field(default=None, description=_LIMIT)
    max_total_tokens: NonNegativeCount | None = Field(default=None, description=_LIMIT)
    max_request_input_tokens: NonNegativeCount | None = Field(
        default=None, description="the input of any single call"
    )
    max_cost: Money | None = Field(
        default=None, description="USD, priced for the model that answered each call"
    )


class BudgetOptions(Closed):
    """One budget of ``[[chat_stack]] kind = "spend_limits"``: a :class:`raf.Budget`."""

    usd: Money = Field(description="at most this many US dollars per window")
    per: Literal["minute", "hour", "day", "month"] = Field(description="a calendar window, UTC")
    scope: Literal["session", "agent", "key"] = Field(
        default=class_default(Budget, "scope"),
        description="whose budget: each session's, the agent's, each served API key's",
    )
    name: Text | None = Field(default=None, description="the name the counts are kept under")


class SpendLimitsOptions(Closed):
    """``[[chat_stack]] kind = "spend_limits"``: :class:`raf.SpendLimits`, budgets across runs."""

    budgets: Annotated[
        list[BudgetOptions],
        Field(min_length=1),
        Expect("a list of one or more tables ({usd = ..., per = ..., scope = ..., name = ...})"),
    ]
    store: PathText | None = Field(
        default=None,
        description="where the budgets are counted: a SQLite file (a relative path starts at "
        "the config's folder), or a redis:// or postgresql:// URL; none: this process's memory",
    )


class ToolOutputLimitOptions(Closed):
    """``[[tool_stack]] kind = "tool_output_limit"``: :class:`raf.ToolOutputLimit`."""

    max_chars: Count = Field(description="a tool result longer than this is cut, once")
    keep: Literal["head_tail", "head"] = Field(
        default=class_default(ToolOutputLimit, "keep"), description="what of a cut result stays"
    )
    spill: Flag = Field(
        default=class_default(ToolOutputLimit, "spill"),
        description="keep the full result with the session, and offer read_tool_result",
    )
    preview_chars: NonNegativeCount | None = Field(
        default=None, description="show this many characters of a cut result; none: all that fit"
    )


#: The options type of each built-in ``[[chat_stack]]`` kind.
BUILTIN_CHAT_STACK_OPTIONS: dict[str, Any] = {
    "retry": RetryOptions,
    "logging": LoggingOptions,
    "compaction": CompactionOptions,
    "usage_limits": UsageLimitsOptions,
    "spend_limits": SpendLimitsOptions,
}
#: The options type of each built-in ``[[tool_stack]]`` kind.
BUILTIN_TOOL_STACK_OPTIONS: dict[str, Any] = {"tool_output_limit": ToolOutputLimitOptions}
