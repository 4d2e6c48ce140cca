"""The config as pydantic models: each built-in kind's options, the tables of a config file.

Imported with the config's modules, never by ``import raf`` (which must not
pay for pydantic). A :class:`pydantic.ValidationError` never leaves this
module: :func:`check_options` and :func:`check_file` turn it into a one-line
:class:`raf.errors.ConfigError` that names where the mistake is, the field, and
what the field must be.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic import create_model as _create_model

from raf._clients.registry import CLIENTS
from raf._config.stack_options import BUILTIN_CHAT_STACK_OPTIONS, BUILTIN_TOOL_STACK_OPTIONS
from raf._config.types import (
    AnyText,
    ColdAfter,
    Count,
    Expect,
    Flag,
    NonNegative,
    NonNegativeCount,
    PathText,
    Positive,
    Text,
    TextList,
    TextTable,
    class_default,
)
from raf._config.types import Closed as _Closed
from raf._providers.clearing import ClearToolResults
from raf._providers.compression import TruncationStrategy
from raf._sessions.history import HistoryProvider
from raf.errors import ConfigError

__all__: list[str] = []


# The options of each built-in kind ---------------------------------------------------------

_MAX_BYTES = 1_000_000  # DEFAULT_MAX_BYTES of the skills and workspace providers
_STEP = (
    "how far the start moves when the bound is reached (in the bound's unit); "
    "default: four fifths of the bound"
)
_COLD_AFTER = (
    "seconds after the session's last model call from which the cache counts as expired: "
    "the cut due next is made then; false: never"
)
#: Every window's default ``cold_after`` is the same (raf._sessions.cold.COLD_AFTER).
_COLD = class_default(TruncationStrategy, "cold_after")


class MemoryOptions(_Closed):
    """``kind = "memory"``: the session's history."""

    inject: Flag = True
    persist_partial: Flag = Field(
        default=False, description="store a streamed turn its consumer left early"
    )
    max_messages: Count | None = Field(
        default=None, description="inject at most the newest N messages (read from the tail)"
    )
    max_tokens: Count | None = Field(
        default=None, description="inject at most this many tokens of the newest messages"
    )
    step: Count | None = Field(default=None, description=_STEP + " (give it with one bound)")
    cold_after: ColdAfter = Field(
        default=class_default(HistoryProvider, "cold_after"), description=_COLD_AFTER
    )


class TruncationOptions(_Closed):
    """``kind = "compression"``, ``strategy = "truncation"``: keep the last messages."""

    strategy: Literal["truncation"] = "truncation"
    keep_last: Count = 20
    max_messages: Count | None = Field(
        default=None, description="load at most the newest N messages to compress"
    )
    step: Count | None = Field(default=None, description=_STEP)
    cold_after: ColdAfter = Field(default=_COLD, description=_COLD_AFTER)


class TokenBudgetOptions(_Closed):
    """``kind = "compression"``, ``strategy = "token_budget"``: keep what fits."""

    strategy: Literal["token_budget"]
    max_tokens: Count
    max_messages: Count | None = Field(
        default=None, description="load at most the newest N messages to compress"
    )
    step: Count | None = Field(default=None, description=_STEP)
    cold_after: ColdAfter = Field(default=_COLD, description=_COLD_AFTER)


class SummaryOptions(_Closed):
    """``kind = "compression"``, ``strategy = "summary"``: the model summarises the rest."""

    strategy: Literal["summary"]
    keep_last: Count = 20
    prompt: AnyText | None = None
    on_failure: Literal["truncate", "raise"] = "truncate"
    max_messages: Count | None = Field(
        default=None, description="load at most the newest N messages to compress"
    )
    step: Count | None = Field(default=None, description=_STEP)
    cold_after: ColdAfter = Field(default=_COLD, description=_COLD_AFTER)


class ClearToolResultsOptions(_Closed):
    """``kind = "compression"``, ``strategy = "clear_tool_results"``: older tool results
    replaced by a placeholder, in batches."""

    strategy: Literal["clear_tool_results"]
    keep_last: NonNegativeCount = Field(
        default=class_default(ClearToolResults, "keep_last"),
        description="how many of the newest tool results stay whole",
    )
    clear_at_least: NonNegativeCount = Field(
        default=class_default(ClearToolResults, "clear_at_least"),
        description="clear only when this many tokens of results can go at once",
    )
    exclude: TextList = Field(default=[], description="tools whose results are never cleared")
    cold_after: ColdAfter = Field(
        default=class_default(ClearToolResults, "cold_after"), description=_COLD_AFTER
    )
    max_messages: Count | None = Field(
        default=None, description="load at most the newest N messages to compress"
    )


def _default_strategy(value: object) -> object:
    if isinstance(value, Mapping) and "strategy" not in value:
        return {**value, "strategy": "truncation"}
    return value


#: ``kind = "compression"``: one of four strategies, ``truncation`` when none is named.
CompressionOptions = Annotated[
    Union[TruncationOptions, TokenBudgetOptions, SummaryOptions, ClearToolResultsOptions],  # noqa: UP007
    Field(discriminator="strategy"),
    BeforeValidator(_default_strategy),
]


class SkillsOptions(_Closed):
    """``kind = "skills"``: the agent skills of a folder."""

    root: PathText = Field(description="a folder; a relative path starts at the config's folder")
    max_bytes: Count = _MAX_BYTES
    tool_prefix: AnyText = ""


class WorkspaceOptions(_Closed):
    """``kind = "workspace"``: a folder the model reads (and writes)."""

    root: PathText = Field(description="a folder; a relative path starts at the config's folder")
    writable: Flag = True
    max_bytes: Count = _MAX_BYTES
    tool_prefix: AnyText = ""


class KnowledgeOptions(_Closed):
    """``kind = "knowledge"`` and ``kind = "wiki"``: retrieval over a folder."""

    root: PathText = Field(description="a folder; a relative path starts at the config's folder")
    top_k: Count = 3
    volatile: Flag = True


class LongTermMemoryOptions(_Closed):
    """``kind = "long_term_memory"``: facts kept across sessions (:class:`raf.LongTermMemory`)."""

    store: PathText = Field(
        description="a SQLite file (a relative path starts at the config's folder), "
        "or a redis:// or postgresql:// URL"
    )
    namespace: Text = Field(description="whose memories (served, each key has its own)")
    top_k: Count = 5
    extract_every: Annotated[int, Field(strict=True, ge=0), Expect("an integer >= 0")] = Field(
        default=1, description="extract memories every N turns of a session; 0: never"
    )
    tools: Flag = Field(default=False, description="offer the model remember and forget")


class McpOptions(_Closed):
    """``kind = "mcp"``: the tools of an MCP server started as a command."""

    command: Text
    args: TextList = Field(default=[])
    env: TextTable | None = None
    cwd: PathText | None = None
    tool_prefix: AnyText = ""
    timeout: Positive = 60.0
    max_tools: Count = 1000


class InputGuardrailOptions(_Closed):
    """``[[guardrails]] kind = "input"``: a :class:`raf.InputGuardrail`."""

    check: Text = Field(
        description="a built-in check ('pii_redactor') or an import path 'package.module:check'"
    )
    entities: TextList | None = Field(
        default=None, description="pii_redactor: what it redacts (email, phone, card, ...)"
    )


class OutputGuardrailOptions(InputGuardrailOptions):
    """``[[guardrails]] kind = "output"``: a :class:`raf.OutputGuardrail`."""

    hold_back: Count = Field(
        default=200, description="the most characters of a streamed answer held at a time"
    )


class ToolGuardrailOptions(InputGuardrailOptions):
    """``[[guardrails]] kind = "tool"``: a :class:`raf.ToolGuardrail`."""


#: The options type of each built-in provider kind.
BUILTIN_PROVIDER_OPTIONS: dict[str, Any] = {
    "memory": MemoryOptions,
    "compression": CompressionOptions,
    "skills": SkillsOptions,
    "workspace": WorkspaceOptions,
    "knowledge": KnowledgeOptions,
    "wiki": KnowledgeOptions,
    "mcp": McpOptions,
    "long_term_memory": LongTermMemoryOptions,
}
#: The options type of each ``[[guardrails]]`` kind: where the guardrail checks.
GUARDRAIL_OPTIONS: dict[str, Any] = {
    "input": InputGuardrailOptions,
    "output": OutputGuardrailOptions,
    "tool": ToolGuardrailOptions,
}


# The tables of a config file ---------------------------------------------------------------


if TYPE_CHECKING:
    ClientName = str
else:  # the names of the registry of chat clients: a new client is a line there, not here
    ClientName = Literal[tuple(CLIENTS)]


class AgentTable(_Closed):
    """``[agent]``: the agent's name, its instructions, its tools (import paths)."""

    name: AnyText | None = None
    instructions: AnyText | None = None
    tools: Annotated[
        list[str], Field(strict=True), Expect("a list of import paths ('package.module:name')")
    ] = Field(default=[])


class ModelTable(_Closed):
    """``[model]``: the chat client and the options of each run."""

    client: Annotated[ClientName, Expect(" or ".join(f'"{name}"' for name in CLIENTS))] = "echo"
    model: Text | None = None
    base_url: Text | None = None
    api_key_env: Text | None = Field(
        default=None, description="the environment variable that holds the API key"
    )
    temperature: NonNegative | None = None
    max_tokens: Count | None = None
    timeout: Positive | None = Field(
        default=None, description="seconds for a whole model call, or a stream until it starts"
    )
    idle_timeout: Positive | None = Field(
        default=None, description="seconds a stream may send nothing before it is given up"
    )


class Entry(BaseModel):
    """One ``[[providers]]``, ``[[chat_stack]]``, ``[[tool_stack]]`` or ``[[guardrails]]``
    table: ``kind``, ``name``, the options."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    kind: Text
    name: Text | None = None


class ConfigFile(_Closed):
    """A config file of the ``raf`` command."""

    agent: AgentTable = AgentTable()
    model: ModelTable = ModelTable()
    providers: list[Entry] = Field(default=[])
    chat_stack: list[Entry] = Field(default=[])
    tool_stack: list[Entry] = Field(default=[])
    guardrails: list[Entry] = Field(default=[])


# ValidationError -> one line ----------------------------------------------------------------


def _expect(annotation: Any) -> str | None:
    """What an annotation's values must be: its :class:`Expect`, looked for through
    ``X | None``; the choices of a ``Literal``."""
    if get_origin(annotation) is Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, Expect):
                return meta.text
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(repr(choice) for choice in get_args(annotation))
    for arg in get_args(annotation):
        found = _expect(arg)
        if found is not None:
            return found
    return None


def _models(tp: Any) -> list[type[BaseModel]]:
    """The models of ``tp``: itself, or the variants of a union."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [model for arg in get_args(tp) for model in _models(arg)]


def _expected(tp: Any, field: str, error: Any = None, loc: Sequence[Any] = ()) -> str | None:
    """What ``field`` must be: its :class:`Expect`, else what pydantic's ``error`` says;
    in a tagged union, the field of the variant the error at ``loc`` is about."""
    for model in _variants(tp, loc):
        info = model.model_fields.get(field)
        if info is not None:
            found = next((meta.text for meta in info.metadata if isinstance(meta, Expect)), None)
            if found or (found := _expect(info.annotation)):
                return found
    if error is not None and error["type"] != "missing":
        # A model of your own, without Expect: "Input should be a valid integer" says it.
        return str(error["msg"]).removeprefix("Input should be ").removeprefix("Value error, ")
    return None


def _variants(tp: Any, loc: Sequence[Any]) -> list[type[BaseModel]]:
    """The models an error at ``loc`` is about: in a tagged union, the tag's variant."""
    models = _models(tp)
    if len(models) > 1 and loc:
        tagged = [
            model
            for model in models
            if any(loc[0] in get_args(info.annotation) for info in model.model_fields.values())
        ]
        return tagged or models
    return models


def unknown_options_error(where: str, unknown: Sequence[str], known: Sequence[str]) -> ConfigError:
    """An option the kind does not take: refused, naming the ones it does."""
    listed = ", ".join(sorted(known)) or "none"
    return ConfigError(
        f"{where}: unknown option(s) {', '.join(map(repr, sorted(unknown)))} "
        f"(known options: {listed})"
    )


def option_error(where: str, option: str, expected: str | None, got: Any = ...) -> ConfigError:
    """An option that is missing (``got`` not given) or of the wrong value."""
    if got is ...:
        what = f": {expected}" if expected else ""
        return ConfigError(f"{where}: option {option!r} is required{what}")
    return ConfigError(f"{where}: option {option!r} must be {expected}, got {got!r}")


def check_options(tp: Any, options: Mapping[str, Any], where: str) -> Any:
    """``options`` validated as ``tp`` (a model, or a tagged union of models), or a ConfigError.

    A wrong or missing option is reported first, then the options ``tp``
    does not know; ``where`` starts the line (``"provider kind 'workspace'"``).
    """
    try:
        return TypeAdapter(tp).validate_python(dict(options))
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    fields = {name for model in _models(tp) for name in model.model_fields}
    for error in errors:
        loc = error["loc"]
        if error["type"] == "union_tag_invalid":  # a tagged union's tag: compression's strategy
            field = error["ctx"]["discriminator"].strip("'")
            expected = f"one of {error['ctx']['expected_tags']}"
            raise option_error(where, field, expected, options.get(field)) from None
        if error["type"] == "extra_forbidden":
            continue
        field = next((part for part in loc if part in fields), None)
        if field is None:
            raise ConfigError(f"{where}: the options must be a table") from None
        if error["type"] == "missing":
            raise option_error(where, field, _expected(tp, field, loc=loc)) from None
        got = options.get(field)
        raise option_error(where, field, _expected(tp, field, error, loc), got) from None
    unknown = [str(e["loc"][-1]) for e in errors]
    known = {name for model in _variants(tp, errors[0]["loc"]) for name in model.model_fields}
    raise unknown_options_error(where, unknown, sorted(known)) from None


_TOP_LEVEL = {
    "agent": "[agent]",
    "model": "[model]",
    "providers": "[[providers]]",
    "chat_stack": "[[chat_stack]]",
    "tool_stack": "[[tool_stack]]",
    "guardrails": "[[guardrails]]",
}


def _unknown_top_level(source: str, key: str, value: Any) -> ConfigError:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        shown = f"table [[{key}]]"
    elif isinstance(value, dict):
        shown = f"table [{key}]"
    else:
        shown = f"key {key!r}"
    close = difflib.get_close_matches(key, list(_TOP_LEVEL), n=1)
    hint = f"; did you mean {_TOP_LEVEL[close[0]]}?" if close else ""
    if key in AgentTable.model_fields:  # [tools] is [agent] tools, not [[tool_stack]]
        hint = f"; did you mean [agent] {key}?"
    allowed = ", ".join(_TOP_LEVEL.values())
    return ConfigError(f"{source}: unknown top-level {shown}{hint} (allowed: {allowed})")


def check_file(data: Mapping[str, Any], source: str) -> ConfigFile:
    """A parsed config file as a :class:`ConfigFile`, or a ConfigError naming the table and key.

    Unknown tables and keys are reported first, then wrong values.
    """
    model = data.get("model")
    if isinstance(model, Mapping) and "api_key" in model:
        raise ConfigError(
            f"{source}: [model] api_key: a key does not belong in a config file; put it in an "
            'environment variable and name the variable: api_key_env = "OPENAI_API_KEY"'
        )
    try:
        return ConfigFile.model_validate(dict(data))
    except ValidationError as exc:
        errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
    error = errors[0]
    loc, value = error["loc"], error["input"]
    table = str(loc[0])
    if len(loc) == 1 and error["type"] == "extra_forbidden":
        raise _unknown_top_level(source, table, value) from None
    if table in ("providers", "chat_stack", "tool_stack", "guardrails"):
        raise _entry_error(source, table, loc[1:], error) from None
    if len(loc) == 1:
        raise ConfigError(f"{source}: [{table}] must be a table") from None
    key = str(loc[1])
    fields = (AgentTable if table == "agent" else ModelTable).model_fields
    if error["type"] == "extra_forbidden":
        unknown = sorted(e["loc"][1] for e in errors if e["type"] == "extra_forbidden")
        unknown = [k for k in unknown if k in data[table]]
        raise ConfigError(
            f"{source}: [{table}] has unknown keys {unknown}; allowed: {sorted(fields)}"
        ) from None
    expected = _expected(AgentTable if table == "agent" else ModelTable, key, error)
    raise ConfigError(
        f"{source}: [{table}] {key} must be {expected}, got {data[table][key]!r}"
    ) from None


def _entry_error(source: str, table: str, loc: Sequence[Any], error: Any) -> ConfigError:
    if not loc:
        return ConfigError(f"{source}: {table!r} must be an array of tables ([[{table}]])")
    where = f"{source}: {table}[{loc[0]}]"
    if len(loc) == 1:
        return ConfigError(f"{where} must be a table")
    key = loc[1]
    if error["type"] == "missing":
        return ConfigError(f"{where}: {key!r} is required and must be a non-empty string")
    return ConfigError(f"{where}: {key!r} must be a non-empty string, got {error['input']!r}")


# The JSON Schema ----------------------------------------------------------------------------


def _entries(kinds: Mapping[str, Any], table: str) -> Any:
    """The entries of ``[[table]]`` for the schema: one closed model per built-in kind
    (and per compression strategy), and an open one for the kinds of your own (but for
    guardrails, whose kinds are only where they check)."""
    suffixes = {"providers": "Provider", "guardrails": "Guardrail", "tool_stack": "ToolMiddleware"}
    suffix = suffixes.get(table, "Middleware")
    variants: list[Any] = []
    for kind, options in kinds.items():
        models = _models(options)
        for model in models:
            variant = model.__name__.removesuffix("Options") if len(models) > 1 else ""
            fields: dict[str, Any] = {"kind": (Literal[kind], ...), "name": (Text | None, None)}
            variants.append(
                _create_model(
                    f"{kind.title()}{variant}{suffix}",
                    __base__=model,
                    __doc__=model.__doc__,
                    **fields,
                )
            )
    if table == "guardrails":
        return list[Union[tuple(variants)]]  # type: ignore[misc]  # noqa: UP007
    # A kind that is not built in: its options are its own. The schema refuses a
    # built-in kind here, so a typo in a built-in kind's option is still flagged.
    not_builtin = Field(min_length=1, json_schema_extra={"not": {"enum": list(kinds)}})
    custom: dict[str, Any] = {"kind": (Annotated[str, not_builtin], ...)}
    variants.append(
        _create_model(
            f"Custom{suffix}",
            __base__=Entry,
            __doc__="A kind of your own: an import path 'package.module:factory', a kind an "
            "installed package offers, or one register_provider_kind adds.",
            **custom,
        )
    )
    return list[Union[tuple(variants)]]  # type: ignore[misc]  # noqa: UP007


def config_schema() -> dict[str, Any]:
    """The JSON Schema of a config file of the ``raf`` command, from the models.

    ``raf/config.schema.json`` holds it as text (:func:`schema_text`); a
    test checks that the two agree.
    """
    model = _create_model(
        "RafConfig",
        __base__=ConfigFile,
        __doc__="A config file of the raf command: see docs/cli.md in raf's repository.",
        providers=(_entries(BUILTIN_PROVIDER_OPTIONS, "providers"), []),
        chat_stack=(_entries(BUILTIN_CHAT_STACK_OPTIONS, "chat_stack"), []),
        tool_stack=(_entries(BUILTIN_TOOL_STACK_OPTIONS, "tool_stack"), []),
        guardrails=(_entries(GUARDRAIL_OPTIONS, "guardrails"), []),
    )
    return model.model_json_schema()


def schema_text() -> str:
    """:func:`config_schema` as the text of ``raf/config.schema.json``."""
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # regenerate: python -m raf._config.models > raf/config.schema.json
    print(schema_text(), end="")
