"""``raf replay``: a stored conversation through one or two configs' stacks, side by side."""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from raf._agent.agent import Agent, enter_resources
from raf._cli_args import DEFAULT_DB
from raf._config.file import load_config
from raf._middleware.spend import SpendLimits
from raf._observers.replay import replay
from raf._observers.replay_chart import replay_chart
from raf._observers.replay_report import ReplayReport, side_by_side
from raf._sessions.stores import is_postgres_url, is_redis_url, open_store
from raf._values.messages import ChatMessage
from raf.errors import ConfigError

__all__: list[str] = []


async def replay_command(args: argparse.Namespace) -> str:
    """What ``raf replay`` prints: the table of each config's replay of ``--session``;
    the chart is written to ``--chart`` when asked."""
    configs: list[Path] = [args.config, *([args.against] if args.against else [])]
    # A bad config is told before the store is opened; no key is needed: nothing is sent.
    agents = [load_config(path, needs_key=False).agent for path in configs]
    messages = await _stored(args.db or str(DEFAULT_DB), args.session)
    names = _names(configs)
    reports: list[tuple[str, ReplayReport]] = []
    for name, agent in zip(names, agents, strict=True):
        reports.append((name, await _replayed(agent, messages)))
    lines = [
        f"session {args.session!r}: {len(messages)} messages, {reports[0][1].turns} turns, "
        f"{reports[0][1].recorded_calls} recorded model calls",
        # One config: its columns need no name.
        side_by_side(reports if len(reports) > 1 else [("", reports[0][1])]),
    ]
    if args.chart is not None:
        title = f"Session {args.session!r} replayed: " + " against ".join(names)
        try:
            args.chart.write_text(replay_chart(reports, title=title), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--chart {args.chart}: {exc.strerror or exc}") from None
        lines.append(f"chart: {args.chart}")
    return "\n".join(lines)


async def _stored(db: str, session_id: str) -> tuple[ChatMessage, ...]:
    """The messages of ``session_id`` in the store ``db``; a session that holds none is a
    :class:`raf.errors.ConfigError` (a mistyped id or store). A SQLite file that is not there
    is one too: this command only reads, and opening it would make an empty one."""
    if not (is_redis_url(db) or is_postgres_url(db) or await anyio.Path(db).exists()):
        raise ConfigError(f"--db {db}: no such session store file")
    store = await open_store(db)
    try:
        messages = tuple(await (await store.get(session_id)).get_messages())
    finally:
        await store.aclose()
    if not messages:
        raise ConfigError(f"--session {session_id!r}: the store {db} holds no message of it")
    return messages


async def _replayed(agent: Agent, messages: tuple[ChatMessage, ...]) -> ReplayReport:
    """The replay, with what the agent holds (an MCP server) opened around it.

    A replay spends nothing: the config's :class:`raf.SpendLimits` are left out (they
    would count the replayed calls in their store, against the real budgets).
    """
    if any(isinstance(item, SpendLimits) for item in agent.chat_stack):
        kept = [item for item in agent.chat_stack if not isinstance(item, SpendLimits)]
        agent = agent.replace(chat_stack=kept)
    async with AsyncExitStack() as resources:
        await enter_resources(agent, resources)  # its client is never called, but holds a pool
        return await replay(agent, messages)


def _names(configs: list[Path]) -> list[str]:
    """Each config's name in the table: its file's stem, or its path when the stems match."""
    stems = [path.stem for path in configs]
    return stems if len(set(stems)) == len(stems) else [str(path) for path in configs]
