"""The ``raf`` command: run one turn (or chat) with an agent described in TOML."""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

import anyio

from raf.agent import Agent, ChatClient
from raf.clients.echo import EchoChatClient
from raf.config import build_provider, parse_provider_decls
from raf.errors import AgentError, ChatClientError, ConfigError
from raf.sessions.base import Session
from raf.sessions.memory import InMemorySession
from raf.tracing import StageEvent, trace_model, traced_stack

__all__ = ["main"]

DEFAULT_DB = Path(".raf") / "sessions.db"
_AGENT_KEYS = frozenset({"name", "instructions"})
_MODEL_KEYS = frozenset({"client", "model", "base_url"})


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``raf`` and ``python -m raf``; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return anyio.run(_dispatch, args)
    except (AgentError, OSError) as exc:
        print(f"raf: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raf", description="Run an agent described in a TOML config file."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one turn and print the answer")
    run.add_argument("config", type=Path, help="the agent's TOML config file")
    run.add_argument("message", help="the user message")
    chat = commands.add_parser("chat", help="an interactive conversation (one session)")
    chat.add_argument("config", type=Path, help="the agent's TOML config file")
    for command in (run, chat):
        command.add_argument("--session", help="keep history in this session of the store")
        command.add_argument(
            "--db",
            default=None,
            help=f"the session store: a SQLite file or redis://HOST:PORT/N (default {DEFAULT_DB})",
        )
        command.add_argument(
            "--trace", action="store_true", help="print each provider stage as it happens"
        )
    return parser


async def _dispatch(args: argparse.Namespace) -> int:
    emit = _trace_printer(sys.stderr) if args.trace else None
    agent = load_agent(args.config, emit=emit)
    async with AsyncExitStack() as resources, _open_session(args) as session:
        # Providers and clients that hold resources (an MCP server, an HTTP pool)
        # are opened once for the whole command, and closed on the way out.
        for provider in agent.providers:
            inner = getattr(provider, "provider", provider)  # see through tracing
            if hasattr(inner, "__aenter__"):
                await resources.enter_async_context(inner)
        if hasattr(agent.chat_client, "aclose"):
            resources.push_async_callback(agent.chat_client.aclose)
        if args.command == "run":
            response = await agent.run(args.message, session=session)
            print(response.text)
            return 0
        return await _chat(agent, session)


async def _chat(agent: Agent, session: Session) -> int:
    print("raf chat — an empty line or Ctrl-D ends the conversation.", file=sys.stderr)
    # A prompt is for a person: piped input gets just the answers on stdout.
    interactive = sys.stdin.isatty()
    while True:
        try:
            line = await anyio.to_thread.run_sync(input, "> " if interactive else "")
        except EOFError:
            if interactive:
                print()  # Ctrl-D leaves the cursor after the prompt
            return 0
        if not line.strip():
            return 0
        try:
            response = await agent.run(line, session=session)
        except ChatClientError as exc:
            # The model failed this turn (rate limit, timeout...): nothing was stored,
            # so the conversation can go on; a broken config or provider still ends it.
            print(f"raf: this turn failed: {exc}", file=sys.stderr)
            continue
        print(response.text)


class _open_session:
    """The session of ``--session`` in the ``--db`` store, or a fresh in-memory one."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        self._store: Any = None

    async def __aenter__(self) -> Session:
        if self._args.session is None:
            return InMemorySession()
        from raf.sessions.stores import open_store

        if not self._args.session:
            raise ConfigError("--session: the session id must not be empty")
        # A SQLite file (its folder created) or redis://HOST:PORT/N.
        self._store = await open_store(self._args.db or DEFAULT_DB)
        session: Session = await self._store.get(self._args.session)
        return session

    async def __aexit__(self, *exc_info: object) -> None:
        if self._store is not None:
            await self._store.aclose()


def _trace_printer(stream: TextIO) -> Callable[[StageEvent], None]:
    def emit(event: StageEvent) -> None:
        print(f"trace: {event}", file=stream, flush=True)

    return emit


def load_agent(path: Path, *, emit: Callable[[StageEvent], None] | None = None) -> Agent:
    """Build the agent a config file describes (``ConfigError`` says what is wrong, where)."""
    data = read_config(path)
    agent_table = _table(data, "agent", path, _AGENT_KEYS)
    model_table = _table(data, "model", path, _MODEL_KEYS)
    client = _chat_client(model_table, path)
    providers = _providers(data, path, client)
    stack: list[Any] = providers if emit is None else traced_stack(providers, emit)
    chat_stack = [] if emit is None else [trace_model(emit)]
    name = agent_table.get("name")
    instructions = agent_table.get("instructions")
    for key, value in (("name", name), ("instructions", instructions)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{path}: [agent] {key} must be a string, got {value!r}")
    return Agent(client, name=name, instructions=instructions, stack=stack, chat_stack=chat_stack)


def read_config(path: Path) -> dict[str, Any]:
    """The TOML document at ``path``."""
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{path}: cannot read the config file: {reason}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def _table(data: dict[str, Any], key: str, path: Path, allowed: frozenset[str]) -> dict[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{key}] must be a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{path}: [{key}] has unknown keys {unknown}; allowed: {sorted(allowed)}")
    return table


def _chat_client(model: dict[str, Any], path: Path) -> ChatClient:
    for key in ("model", "base_url"):
        if key in model and not isinstance(model[key], str):
            raise ConfigError(f"{path}: [model] {key} must be a string, got {model[key]!r}")
    kind = model.get("client", "echo")
    if kind == "echo":
        return EchoChatClient()
    if kind == "openai":
        from raf.clients.openai import OpenAIChatClient

        name = model.get("model")
        if not isinstance(name, str) or not name:
            raise ConfigError(f'{path}: [model] client = "openai" needs model = "<model name>"')
        if not os.environ.get("OPENAI_API_KEY"):
            raise ConfigError(f'{path}: [model] client = "openai" needs OPENAI_API_KEY set')
        return OpenAIChatClient(name, base_url=model.get("base_url"))
    raise ConfigError(f'{path}: [model] client must be "echo" or "openai", got {kind!r}')


def _providers(data: dict[str, Any], path: Path, client: ChatClient) -> list[Any]:
    decls = parse_provider_decls(data, base_dir=path.parent, source=str(path))
    providers = []
    for index, decl in enumerate(decls):
        try:
            providers.append(build_provider(decl, chat_client=client))
        except ConfigError as exc:
            raise ConfigError(f"{path}: providers[{index}]: {exc}") from None
    return providers


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
