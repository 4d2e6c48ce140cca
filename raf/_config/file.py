"""The config file of the ``raf`` command: the agent, its model, providers, stacks, guardrails.

A file is read once (:func:`raf._config.declarations.read_config`), checked whole against
:class:`raf._config.models.ConfigFile` (unknown tables and keys, values of the
wrong type: one line each), then built: the chat client, the run options, the
providers, the chat stack's and the tool stack's middleware, the guardrails, the tools
and the agent.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from raf._agent.agent import Agent
from raf._agent.tools import Tool
from raf._clients.registry import CLIENTS
from raf._config.declarations import (
    ContextProviderDecl,
    ProviderFactory,
    ProviderOptions,
    _built,
    _parse_decls,
    build_provider,
    build_strategy,
    import_object,
    read_config,
)
from raf._config.guardrails import build_guardrail
from raf._config.models import (
    CompressionOptions,
    ModelTable,
    check_file,
    check_options,
    option_error,
)
from raf._config.stack_options import (
    BudgetOptions,
    CompactionOptions,
    LoggingOptions,
    RetryOptions,
    SpendLimitsOptions,
    ToolOutputLimitOptions,
    UsageLimitsOptions,
)
from raf._config.types import given
from raf._middleware.compaction import CompactionMiddleware
from raf._middleware.guardrails import InputGuardrail, OutputGuardrail, ToolGuardrail
from raf._middleware.limits import UsageLimits
from raf._middleware.logging import LoggingMiddleware
from raf._middleware.retry import RetryMiddleware
from raf._middleware.spend import Budget, SpendLimits
from raf._middleware.tool_outputs import ToolOutputLimit
from raf._observers.tracing import StageEvent, TraceObserver
from raf._sessions.stores import is_postgres_url, is_redis_url
from raf._values.client import ChatClient
from raf._values.options import AgentRunOptions
from raf.errors import AgentError, ConfigError

__all__: list[str] = []


@attrs.frozen
class LoadedConfig:
    """What a config file describes: the agent, and the options of each of its runs."""

    agent: Agent
    options: AgentRunOptions


def load_agent(path: Path, *, emit: Callable[[StageEvent], None] | None = None) -> Agent:
    """Build the agent a config file describes (``ConfigError`` says what is wrong, where)."""
    return load_config(path, emit=emit).agent


def load_config(
    path: Path,
    *,
    emit: Callable[[StageEvent], None] | None = None,
    observers: Sequence[Any] = (),
    needs_key: bool = True,
) -> LoadedConfig:
    """The agent and run options a config file describes; ``emit`` traces every stage,
    ``observers`` are given to the agent too. ``needs_key=False``: a missing key of
    ``[model]`` is no error (``raf replay`` never calls the model); the client gets a
    stand-in that no server accepts.

    Every mistake is a :class:`ConfigError` naming the file, the table, the
    entry and the key.
    """
    data = read_config(path)
    config = check_file(data, str(path))
    client = _chat_client(config.model, path, needs_key)
    options = AgentRunOptions(
        temperature=config.model.temperature, max_tokens=config.model.max_tokens
    )
    providers = _each(data, "providers", path, lambda d: build_provider(d, chat_client=client))
    chat_stack = _each(
        data, "chat_stack", path, lambda d: build_chat_middleware(d, chat_client=client)
    )
    tool_stack = _each(data, "tool_stack", path, build_tool_middleware)
    # Input guardrails first in the stack: every provider sees the request as rewritten.
    # Output guardrails innermost in the chat stack: retry and logging see what is released.
    # Tool guardrails after the declared tool stack: a ToolOutputLimit (outermost) keeps
    # what they made of a result.
    guardrails = _each(data, "guardrails", path, build_guardrail)
    stack = [*_of(guardrails, InputGuardrail), *providers]
    chat_stack = [*chat_stack, *_of(guardrails, OutputGuardrail)]
    tool_stack = [*tool_stack, *_of(guardrails, ToolGuardrail)]
    tools = _tools(config.agent.tools, path)
    observers = [*([] if emit is None else [TraceObserver(emit)]), *observers]
    try:
        agent = Agent(
            client,
            name=config.agent.name,
            instructions=config.agent.instructions,
            tools=tools,
            stack=stack,
            chat_stack=chat_stack,
            tool_stack=tool_stack,
            observers=observers,
        )
    except (TypeError, ValueError, AgentError) as exc:
        raise ConfigError(f"{path}: [agent]: {exc}") from exc
    return LoadedConfig(agent, options)


def _each(
    data: Mapping[str, Any], key: str, path: Path, build: Callable[[ContextProviderDecl], Any]
) -> list[Any]:
    """Build each ``[[key]]`` entry; an error names the file and the entry."""
    built = []
    for index, decl in enumerate(_parse_decls(data, key, path.parent, str(path))):
        try:
            built.append(build(decl))
        except ConfigError as exc:
            raise ConfigError(f"{path}: {key}[{index}]: {exc}") from None
    return built


#: The key a client gets when its config's key is not set and none is needed (``raf replay``).
NO_KEY = "raf-replay-sends-nothing"


def _chat_client(model: ModelTable, path: Path, needs_key: bool = True) -> ChatClient:
    """The client of ``[model]``, as the registry of chat clients builds it."""
    client = CLIENTS[model.client]
    if client.offline:
        return client.build()
    kind = model.client
    if model.model is None:
        raise ConfigError(f'{path}: [model] client = "{kind}" needs model = "<model name>"')
    names = (model.api_key_env,) if model.api_key_env is not None else client.key_env
    key_env = next((name for name in names if os.environ.get(name)), " or ".join(names))
    api_key = os.environ.get(key_env) or (None if needs_key else NO_KEY)
    if not api_key:
        named = " (named by [model] api_key_env)" if model.api_key_env is not None else ""
        raise ConfigError(f'{path}: [model] client = "{kind}" needs {key_env} set{named}')
    extra: dict[str, Any] = {}
    if model.timeout is not None:
        # A deadline for the whole call (connection, retries, a trickling reply).
        extra["timeout"] = model.timeout
    if model.idle_timeout is not None:
        # A stream's bound: the silence between two chunks (its length is not bounded).
        extra["idle_timeout"] = model.idle_timeout
    try:  # the clients take the same keywords
        return client.build(model.model, base_url=model.base_url, api_key=api_key, **extra)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: [model]: {exc}") from exc


def _tools(specs: list[str], path: Path) -> list[Any]:
    tools = []
    for index, spec in enumerate(specs):
        where = f"[agent] tools[{index}]"
        try:
            found = import_object(spec, base_dir=path.parent, what=where)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if not isinstance(found, Tool):
            hint = " (decorate the function with @raf.tool)" if callable(found) else ""
            raise ConfigError(
                f"{path}: {where} {spec!r} is a {type(found).__name__}, not a raf Tool{hint}"
            )
        tools.append(found)
    return tools


def _of(built: list[Any], kind: type) -> list[Any]:
    return [item for item in built if isinstance(item, kind)]


# [[chat_stack]] ------------------------------------------------------------------------------


def _retry(o: ProviderOptions) -> Any:
    options = o.parse(RetryOptions)
    types: tuple[type[BaseException], ...] | None = None
    if options.retry_on is not None:
        found = []
        for spec in options.retry_on:
            error = import_object(spec, base_dir=o.decl.base_dir, what="retry_on")
            if not (isinstance(error, type) and issubclass(error, BaseException)):
                raise option_error(o.where, "retry_on", "a list of exception classes", spec)
            found.append(error)
        types = tuple(found)
    return RetryMiddleware(
        attempts=options.attempts,
        retry_on=types,
        wait_initial=options.wait_initial,
        wait_max=options.wait_max,
    )


def _logging(o: ProviderOptions) -> Any:
    o.parse(LoggingOptions)
    return LoggingMiddleware()


def _compaction(o: ProviderOptions) -> Any:
    options = o.parse(CompactionOptions)
    fallback = None
    if options.fallback is not None:
        where = f"{o.where}: option 'fallback'"
        strategy = check_options(CompressionOptions, options.fallback, where)
        if strategy.max_messages is not None:
            raise ConfigError(
                f"{where}: max_messages bounds what a compression provider loads; a "
                "fallback is given the call's messages: leave it out"
            )
        fallback = build_strategy(strategy, o.chat_client, where)
    return CompactionMiddleware(
        options.threshold_tokens, fallback=fallback, **given(options, "native")
    )


def _usage_limits(o: ProviderOptions) -> Any:
    options = o.parse(UsageLimitsOptions)
    return UsageLimits(**given(options, *UsageLimitsOptions.model_fields))


def _spend_limits(o: ProviderOptions) -> Any:
    # Each budget checked on its own first: an error names the budget and its option.
    tables = o.decl.options.get("budgets")
    if isinstance(tables, list):
        for index, table in enumerate(tables):
            if isinstance(table, Mapping):
                check_options(BudgetOptions, table, f"{o.where}: budgets[{index}]")
    options = o.parse(SpendLimitsOptions)
    budgets = [Budget(b.usd, b.per, b.scope, name=b.name) for b in options.budgets]
    store: str | Path | None = options.store
    if store is not None and not (is_redis_url(store) or is_postgres_url(store)):
        store = o.resolve(store)
    return SpendLimits(budgets, store=store)


#: The kinds of ``[[chat_stack]]`` entries: middleware around each model call.
CHAT_STACK_KINDS: dict[str, ProviderFactory] = {
    "retry": _retry,
    "logging": _logging,
    "compaction": _compaction,
    "usage_limits": _usage_limits,
    "spend_limits": _spend_limits,
}


def parse_chat_stack_decls(
    data: Mapping[str, Any], *, base_dir: Path | None = None, source: str = "config"
) -> list[ContextProviderDecl]:
    """The ``[[chat_stack]]`` of parsed TOML as declarations (``kind`` and options).

    >>> [decl] = parse_chat_stack_decls({"chat_stack": [{"kind": "retry", "attempts": 5}]})
    >>> build_chat_middleware(decl)
    RetryMiddleware(attempts=5, retry_on=None, wait_initial=0.5, wait_max=8.0)
    """
    return _parse_decls(data, "chat_stack", base_dir, source)


def build_chat_middleware(decl: ContextProviderDecl, *, chat_client: Any = None) -> Any:
    """The chat-stack middleware ``decl`` declares: a kind of :data:`CHAT_STACK_KINDS`,
    or an import path.

    ``retry`` takes :class:`raf.RetryMiddleware`'s options (``attempts``,
    ``wait_initial``, ``wait_max``, ``retry_on`` as a list of import paths of
    exception classes); ``logging`` takes none; ``compaction``,
    ``usage_limits`` and ``spend_limits`` take :class:`raf.CompactionMiddleware`'s,
    :class:`raf.UsageLimits`' and :class:`raf.SpendLimits`' (see
    ``docs/cli.md``). A kind of the form ``"package.module:factory"`` is a
    factory like a provider kind's, which returns the middleware.
    ``chat_client`` is handed to a ``summary`` fallback of ``compaction``.
    """
    return _middleware(decl, CHAT_STACK_KINDS, "chat_stack", chat_client)


# [[tool_stack]] ------------------------------------------------------------------------------


def _tool_output_limit(o: ProviderOptions) -> Any:
    options = o.parse(ToolOutputLimitOptions)
    return ToolOutputLimit(options.max_chars, **given(options, "keep", "spill", "preview_chars"))


#: The kinds of ``[[tool_stack]]`` entries: middleware around each tool call.
TOOL_STACK_KINDS: dict[str, ProviderFactory] = {"tool_output_limit": _tool_output_limit}


def build_tool_middleware(decl: ContextProviderDecl) -> Any:
    """The tool-stack middleware ``decl`` declares: ``tool_output_limit``
    (:class:`raf.ToolOutputLimit`'s options), or an import path ``"package.module:factory"``
    whose factory returns the middleware. The declared tool stack goes before (outside)
    the tool guardrails."""
    return _middleware(decl, TOOL_STACK_KINDS, "tool_stack", None)


def _middleware(
    decl: ContextProviderDecl, kinds: Mapping[str, ProviderFactory], what: str, chat_client: Any
) -> Any:
    """The middleware of ``decl`` by the factory of its kind (``kinds``, else an import path)."""
    factory = kinds.get(decl.kind)
    if factory is None:
        if ":" not in decl.kind:
            known = ", ".join(sorted(kinds))
            raise ConfigError(
                f"unknown {what} kind {decl.kind!r}; known kinds: {known} "
                "(or an import path 'package.module:factory')"
            )
        factory = import_object(decl.kind, base_dir=decl.base_dir, what=f"{what} kind")
        if not callable(factory):
            raise ConfigError(f"{what} kind {decl.kind!r} is not callable")
    options = ProviderOptions(decl, chat_client, what=what)
    middleware = _built(factory, options, f"{what} kind {decl.kind!r}")
    if not callable(middleware):
        request = "request" if what == "chat_stack" else "tool request"
        raise ConfigError(
            f"{what} kind {decl.kind!r}: the factory returned {type(middleware).__name__}, "
            f"not middleware (async ({request}, call_next))"
        )
    return middleware
