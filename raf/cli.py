"""The ``raf`` command: run one turn (or chat) with an agent described in TOML."""

from __future__ import annotations

import argparse
import difflib
import math
import os
import signal
import sys
import threading
import tomllib
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import wait
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TextIO

import anyio
import attrs
import structlog
from anyio.from_thread import BlockingPortal, start_blocking_portal

from raf.agent import Agent
from raf.clients.echo import EchoChatClient
from raf.config import (
    MAX_CONFIG_BYTES,
    build_chat_middleware,
    build_provider,
    import_object,
    parse_chat_stack_decls,
    parse_provider_decls,
)
from raf.errors import AgentError, ChatClientError, ConfigError
from raf.messages import AgentResponse, ChatClient, Update
from raf.options import AgentRunOptions
from raf.sessions.base import Session
from raf.sessions.memory import InMemorySession
from raf.tools import Tool
from raf.tracing import StageEvent, trace_model, traced_stack, traced_tools

__all__ = ["MAX_CONFIG_BYTES", "LoadedConfig", "load_agent", "load_config", "main", "read_config"]

DEFAULT_DB = Path(".raf") / "sessions.db"
_TOP_LEVEL = {"agent": "[agent]", "model": "[model]", "providers": "[[providers]]"}
_TOP_LEVEL["chat_stack"] = "[[chat_stack]]"
_AGENT_KEYS = frozenset({"name", "instructions", "tools"})
_MODEL_KEYS = frozenset(
    {"client", "model", "base_url", "api_key_env", "temperature", "max_tokens", "timeout"}
)
_EPILOG = """\
The config is a TOML file: [agent] (name, instructions, tools), [model] (client,
model, base_url, api_key_env, temperature, max_tokens, timeout), [[providers]]
and [[chat_stack]]. The docs are in raf's repository: docs/cli.md for this
command and its config, docs/declaring-providers.md for the provider kinds."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``raf`` and ``python -m raf``; returns the exit status."""
    _tolerant_streams()
    args = _parser().parse_args(argv)
    # structlog prints to stdout unless configured: a command's logs ([[chat_stack]]
    # kind = "logging") go to stderr, so stdout holds just the answers.
    logs_here = not structlog.is_configured()
    if logs_here:
        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        if args.command == "chat":
            return _chat_command(args)
        return anyio.run(_run_command, args)
    except (AgentError, OSError) as exc:
        _say(f"raf: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        if logs_here:
            structlog.reset_defaults()


def _tolerant_streams() -> None:
    """Text that cannot be encoded or decoded is replaced, never a crash of the command.

    A model's answer or a user's line may hold what the terminal's encoding
    cannot show (a lone surrogate from a non-UTF-8 argv, bytes that are not
    UTF-8 on stdin): printing it must not raise ``UnicodeEncodeError``.
    """
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and getattr(stream, "errors", None) == "strict":
            with suppress(ValueError, OSError):  # a closed or detached stream
                reconfigure(errors="replace")


def _say(text: str, stream: TextIO | None = None) -> None:
    """Print a line, replacing what the stream's encoding cannot hold."""
    stream = sys.stderr if stream is None else stream
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        print(text, file=stream, flush=True)
    except UnicodeEncodeError:
        print(text.encode(encoding, "replace").decode(encoding), file=stream, flush=True)


def _from_argv(text: str) -> str:
    """An argument as text: bytes that are not UTF-8 become U+FFFD, not lone surrogates."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate that surrogateescape did not make
        return text.encode("utf-8", "replace").decode("utf-8")


def _version() -> str:
    try:
        return version("raf")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raf",
        description="Run an agent described in a TOML config file.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"raf {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run one turn and print the answer",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("config", type=Path, help="the agent's TOML config file")
    run.add_argument("message", help="the user message")
    chat = commands.add_parser(
        "chat",
        help="an interactive conversation (one session)",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat.add_argument("config", type=Path, help="the agent's TOML config file")
    for command in (run, chat):
        command.add_argument("--session", help="keep history in this session of the store")
        command.add_argument(
            "--db",
            default=None,  # a str, not a Path: Path would fold redis:// into redis:/
            help=f"the session store: a SQLite file (default {DEFAULT_DB}; missing folders "
            "are created) or redis://HOST:PORT/N",
        )
        command.add_argument(
            "--trace",
            action="store_true",
            help="print each provider stage, model call and tool call as it happens",
        )
    return parser


@attrs.frozen
class LoadedConfig:
    """What a config file describes: the agent, and the options of each of its runs."""

    agent: Agent
    options: AgentRunOptions


async def _run_command(args: argparse.Namespace) -> int:
    printer = _Printer(sys.stdout)
    loaded = load_config(
        args.config, emit=_trace_printer(sys.stderr, printer) if args.trace else None
    )
    async with _opened(args, loaded.agent) as session:
        try:
            await loaded.agent.run(
                _from_argv(args.message),
                session=session,
                options=loaded.options,
                on_update=printer,
            )
        finally:
            # A failed turn leaves what it printed on a line of its own, before the error.
            printer.end_line()
        printer.finish()
        return 0


class _Printer:
    """The ``on_update`` of the command: the answer's text as it arrives, flushed.

    Each model call's text goes on as it comes; a tool call ends the line, so
    the next call's text starts a line of its own. ``clear`` is a stream on
    which a "thinking…" line waits to be cleared at the first update.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.open = False  # a line of answer text is not yet ended
        self.printed = False
        self.updated = False  # an update came in this turn
        self.clear: TextIO | None = None

    async def __call__(self, update: Update) -> None:
        self.updated = True
        if self.clear is not None:
            _write(self.clear, _CLEAR_LINE)
            self.clear = None
        if update.kind == "text":
            if update.text:
                _write(self.out, update.text)
                self.open = self.printed = True
        elif update.kind != "usage":
            self.end_line()

    def end_line(self) -> None:
        """End the line of text being printed, if any."""
        if self.open:
            _write(self.out, "\n")
            self.open = False

    def finish(self) -> None:
        """The end of an answer: its line ended (an empty answer is an empty line)."""
        if self.open or not self.printed:
            _write(self.out, "\n")
        self.open = self.printed = False


@asynccontextmanager
async def _opened(args: argparse.Namespace, agent: Agent) -> AsyncIterator[Session]:
    """The session, and the resources of the providers and the client, for one command.

    Providers and clients that hold resources (an MCP server, an HTTP pool)
    are opened once for the whole command, and closed on the way out.
    """
    async with AsyncExitStack() as resources:
        for provider in agent.providers:
            inner = getattr(provider, "provider", provider)  # see through tracing
            if hasattr(inner, "__aenter__"):
                await resources.enter_async_context(inner)
        if hasattr(agent.chat_client, "aclose"):
            resources.push_async_callback(agent.chat_client.aclose)
        yield await resources.enter_async_context(_open_session(args))


# raf chat ------------------------------------------------------------------------------------
#
# The conversation runs on the main thread, the agent on an event loop in a
# portal thread. So `input()` is the plain, readline-backed `input()` of the
# main thread, and Ctrl-C (SIGINT, always delivered to the main thread) is seen
# where the main thread waits: at the prompt, a KeyboardInterrupt that drops the
# line; during an answer, a flag on which the main thread cancels that turn's
# scope in the loop, whose post stages then run (shielded, bounded by the
# agent's post_timeout), and the chat goes on.

_BANNER = "raf chat — /exit or Ctrl-D ends the conversation; Ctrl-C stops the current turn."
_THINKING = "thinking…"
_CLEAR_LINE = "\r\x1b[K"


def _chat_command(args: argparse.Namespace) -> int:
    printer = _Printer(sys.stdout)
    loaded = load_config(
        args.config, emit=_trace_printer(sys.stderr, printer) if args.trace else None
    )
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(_opened(args, loaded.agent)) as session,
    ):
        # --trace prints its own progress on stderr: no "thinking…" line in between.
        return _chat(portal, loaded, session, thinking=not args.trace, printer=printer)


def _chat(
    portal: BlockingPortal,
    loaded: LoadedConfig,
    session: Session,
    *,
    thinking: bool = True,
    printer: _Printer | None = None,
) -> int:
    printer = _Printer(sys.stdout) if printer is None else printer
    # A prompt, line editing and a "thinking" line are for a person: piped input
    # gets just the answers on stdout.
    interactive = sys.stdin.isatty()
    if interactive:
        with suppress(ImportError):  # not every Python has readline (Windows)
            import readline  # noqa: F401  (importing it gives input() editing and history)
    # input() shows its prompt on stdout; when stdout is not the terminal (`raf chat
    # CONFIG > answers.txt`), the prompt goes to the terminal through stderr instead.
    prompt_on_stdout = interactive and sys.stdout.isatty()
    person = sys.stdout if prompt_on_stdout else sys.stderr
    _say(_BANNER)
    while True:
        try:
            try:
                if interactive and not prompt_on_stdout:
                    _write(person, "> ")
                line = input("> " if prompt_on_stdout else "")
            except EOFError:
                if interactive:
                    _write(person, "\n")  # Ctrl-D leaves the cursor after the prompt
                return 0
            text = line.strip()
            if not text:
                continue
            if text == "/exit":
                return 0
            try:
                response = _turn(
                    portal, loaded, session, line, printer, thinking=thinking and interactive
                )
            except ChatClientError as exc:
                # The model failed this turn (rate limit, timeout...): nothing was stored,
                # so the conversation can go on; a broken config or provider still ends it.
                printer.end_line()
                _say(f"raf: this turn failed: {exc}")
                continue
            if isinstance(response, str):  # Ctrl-C ended it
                printer.end_line()
                _say(f"raf: {response}")
                continue
            printer.finish()
        except KeyboardInterrupt:
            # Ctrl-C at the prompt (or between turns) drops the line, as in a shell.
            _write(person, "\n")


def _write(stream: TextIO, text: str) -> None:
    try:
        stream.write(text)
    except UnicodeEncodeError:
        encoding = getattr(stream, "encoding", None) or "utf-8"
        stream.write(text.encode(encoding, "replace").decode(encoding))
    stream.flush()


def _turn(
    portal: BlockingPortal,
    loaded: LoadedConfig,
    session: Session,
    line: str,
    printer: _Printer,
    *,
    thinking: bool,
) -> AgentResponse | str:
    """One turn in the loop thread, streamed to ``printer``: its response, or how Ctrl-C ended it.

    A first Ctrl-C once the answer has begun stops it there ("answer
    stopped"): an early close, so the post stages see ``StreamClosedError``
    (not under cancellation) and a history provider with ``persist_partial``
    keeps what was said. Before the first update, or a second time, Ctrl-C
    cancels the turn wherever it is ("turn cancelled"). ``thinking``: show
    "thinking…" on stderr until the first update, if stderr is a terminal.
    """
    # While a turn runs, Ctrl-C only raises a flag: a KeyboardInterrupt could land
    # anywhere in the portal's machinery; the flag is read here, between waits.
    interrupted = threading.Event()
    previous: Any = None
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:  # signal handlers belong to the main thread
        previous = signal.signal(signal.SIGINT, lambda number, frame: interrupted.set())
    thinking = thinking and sys.stderr.isatty()
    printer.updated = False
    try:
        if thinking:
            # Until the first update (or the end of the turn).
            _write(sys.stderr, _THINKING)
            printer.clear = sys.stderr
        turn: anyio.CancelScope = portal.call(anyio.CancelScope)
        reading: anyio.CancelScope = portal.call(anyio.CancelScope)

        async def run() -> AgentResponse | None:
            # The iterator form, printed as it is read. Cancelling ``reading`` leaves the
            # block normally: an early close. Cancelling ``turn`` is a cancellation: the
            # post stages run with it, shielded and bounded.
            with turn:
                async with loaded.agent.stream(
                    line, session=session, options=loaded.options
                ) as stream:
                    with reading:
                        async for update in stream:
                            await printer(update)
                return stream.response
            return None

        future = portal.start_task_soon(run)
        stopped = cancelled = False
        while not future.done():
            wait([future], timeout=0.05)
            if interrupted.is_set() and not cancelled:
                interrupted.clear()
                if printer.updated and not stopped:
                    portal.call(reading.cancel)  # then wait for the post stages
                    stopped = True
                else:
                    portal.call(turn.cancel)
                    cancelled = True
        response = future.result()
        if response is not None:
            return response
        return "turn cancelled" if cancelled else "answer stopped"
    finally:
        if in_main_thread:
            signal.signal(signal.SIGINT, previous)
        if printer.clear is not None:  # no update came: the line is still shown
            _write(sys.stderr, _CLEAR_LINE)
            printer.clear = None


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
        session: Session = await self._store.get(_from_argv(self._args.session))
        return session

    async def __aexit__(self, *exc_info: object) -> None:
        if self._store is not None:
            await self._store.aclose()


def _same_file(one: TextIO, other: TextIO) -> bool:
    """Whether two streams write to the same file (a terminal, both redirected to one)."""
    try:
        first, second = os.fstat(one.fileno()), os.fstat(other.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def _trace_printer(stream: TextIO, printer: _Printer | None = None) -> Callable[[StageEvent], None]:
    same = printer is not None and _same_file(printer.out, stream)

    def emit(event: StageEvent) -> None:
        if same and printer is not None:
            # The answer and the trace go to one place (a terminal, `2>&1`): the answer's
            # line ends before the trace line starts.
            printer.end_line()
        _say(f"trace: {event}", stream)

    return emit


# The config file -----------------------------------------------------------------------------


def load_agent(path: Path, *, emit: Callable[[StageEvent], None] | None = None) -> Agent:
    """Build the agent a config file describes (``ConfigError`` says what is wrong, where)."""
    return load_config(path, emit=emit).agent


def load_config(path: Path, *, emit: Callable[[StageEvent], None] | None = None) -> LoadedConfig:
    """The agent and run options a config file describes; ``emit`` traces every stage.

    Every mistake is a :class:`ConfigError` naming the file, the table, the
    entry and the key.
    """
    data = read_config(path)
    _refuse_unknown_tables(data, path)
    agent_table = _table(data, "agent", path, _AGENT_KEYS)
    model_table = _model_table(data, path)
    client = _chat_client(model_table, path)
    options = _run_options(model_table, path)
    providers = _providers(data, path, client)
    chat_stack = _chat_stack(data, path)
    tools = _tools(agent_table, path)
    stack: list[Any] = providers
    if emit is not None:
        stack = traced_stack(providers, emit)
        # Innermost, so each actual model call is reported (a retried one too).
        chat_stack = [*chat_stack, trace_model(emit)]
        tools = list(traced_tools(tools, emit))
    name = agent_table.get("name")
    instructions = agent_table.get("instructions")
    for key, value in (("name", name), ("instructions", instructions)):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{path}: [agent] {key} must be a string, got {value!r}")
    try:
        agent = Agent(
            client,
            name=name,
            instructions=instructions,
            tools=tools,
            stack=stack,
            chat_stack=chat_stack,
        )
    except (TypeError, ValueError, AgentError) as exc:
        raise ConfigError(f"{path}: [agent]: {exc}") from exc
    return LoadedConfig(agent, options)


def read_config(path: Path) -> dict[str, Any]:
    """The TOML document at ``path`` (at most :data:`MAX_CONFIG_BYTES`)."""
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{path}: cannot read the config file: {reason}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: not a config file: larger than {MAX_CONFIG_BYTES // 1024} KiB")
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{path}: not a usable config: arrays or tables nested too deeply"
        ) from None


def _refuse_unknown_tables(data: dict[str, Any], path: Path) -> None:
    for key, value in data.items():
        if key in _TOP_LEVEL:
            continue
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            shown = f"table [[{key}]]"
        elif isinstance(value, dict):
            shown = f"table [{key}]"
        else:
            shown = f"key {key!r}"
        close = difflib.get_close_matches(key, list(_TOP_LEVEL), n=1)
        hint = f"; did you mean {_TOP_LEVEL[close[0]]}?" if close else ""
        allowed = ", ".join(_TOP_LEVEL.values())
        raise ConfigError(f"{path}: unknown top-level {shown}{hint} (allowed: {allowed})")


def _table(data: dict[str, Any], key: str, path: Path, allowed: frozenset[str]) -> dict[str, Any]:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{key}] must be a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{path}: [{key}] has unknown keys {unknown}; allowed: {sorted(allowed)}")
    return table


def _model_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    table = data.get("model", {})
    if isinstance(table, dict) and "api_key" in table:
        raise ConfigError(
            f"{path}: [model] api_key: a key does not belong in a config file; put it in an "
            'environment variable and name the variable: api_key_env = "OPENAI_API_KEY"'
        )
    return _table(data, "model", path, _MODEL_KEYS)


def _number(model: dict[str, Any], key: str, path: Path, *, positive: bool) -> float | None:
    value = model.get(key)
    if value is None:
        return None
    expected = "a positive number" if positive else "a number >= 0"
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not (value > 0 if positive else value >= 0)
    ):
        raise ConfigError(f"{path}: [model] {key} must be {expected}, got {value!r}")
    return float(value)


def _run_options(model: dict[str, Any], path: Path) -> AgentRunOptions:
    max_tokens = model.get("max_tokens")
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise ConfigError(f"{path}: [model] max_tokens must be an integer >= 1, got {max_tokens!r}")
    return AgentRunOptions(
        temperature=_number(model, "temperature", path, positive=False), max_tokens=max_tokens
    )


def _chat_client(model: dict[str, Any], path: Path) -> ChatClient:
    for key in ("model", "base_url", "api_key_env"):
        if key in model and not (isinstance(model[key], str) and model[key]):
            raise ConfigError(
                f"{path}: [model] {key} must be a non-empty string, got {model[key]!r}"
            )
    timeout = _number(model, "timeout", path, positive=True)
    kind = model.get("client", "echo")
    if kind == "echo":
        return EchoChatClient()
    if kind in ("openai", "openai-responses"):
        from raf.clients.openai import OpenAIChatClient
        from raf.clients.responses import OpenAIResponsesClient

        name = model.get("model")
        if not isinstance(name, str) or not name:
            raise ConfigError(f'{path}: [model] client = "{kind}" needs model = "<model name>"')
        key_env: str = model.get("api_key_env", "OPENAI_API_KEY")
        api_key = os.environ.get(key_env)
        if not api_key:
            named = " (named by [model] api_key_env)" if "api_key_env" in model else ""
            raise ConfigError(f'{path}: [model] client = "{kind}" needs {key_env} set{named}')
        extra: dict[str, Any] = {}
        if timeout is not None:
            # A deadline for the whole call (connection, retries, a trickling reply).
            extra["timeout"] = timeout
        # The Responses API client ("openai-responses") takes the same keywords.
        factory = OpenAIChatClient if kind == "openai" else OpenAIResponsesClient
        try:
            return factory(name, base_url=model.get("base_url"), api_key=api_key, **extra)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: [model]: {exc}") from exc
    raise ConfigError(
        f'{path}: [model] client must be "echo" or "openai" or "openai-responses", got {kind!r}'
    )


def _tools(agent: dict[str, Any], path: Path) -> list[Any]:
    specs = agent.get("tools", [])
    if not isinstance(specs, list) or not all(isinstance(spec, str) for spec in specs):
        raise ConfigError(
            f"{path}: [agent] tools must be a list of import paths "
            f"('package.module:name'), got {specs!r}"
        )
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


def _providers(data: dict[str, Any], path: Path, client: ChatClient) -> list[Any]:
    decls = parse_provider_decls(data, base_dir=path.parent, source=str(path))
    providers = []
    for index, decl in enumerate(decls):
        try:
            providers.append(build_provider(decl, chat_client=client))
        except ConfigError as exc:
            raise ConfigError(f"{path}: providers[{index}]: {exc}") from None
    return providers


def _chat_stack(data: dict[str, Any], path: Path) -> list[Any]:
    decls = parse_chat_stack_decls(data, base_dir=path.parent, source=str(path))
    middleware = []
    for index, decl in enumerate(decls):
        try:
            middleware.append(build_chat_middleware(decl))
        except ConfigError as exc:
            raise ConfigError(f"{path}: chat_stack[{index}]: {exc}") from None
    return middleware


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
