"""The ``raf`` command: run one turn (or chat) with an agent described in TOML."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import wait
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from importlib.resources import files
from typing import Any, TextIO

import anyio
import attrs
import structlog
from anyio.from_thread import BlockingPortal, start_blocking_portal

from raf._agent.agent import Agent, enter_resources
from raf._cli_args import DEFAULT_DB, build_parser
from raf._cli_cost import TurnCost
from raf._cli_replay import replay_command
from raf._cli_waiting import UNDECIDABLE, ask_decisions, decisions_of, waiting_lines
from raf._config.file import LoadedConfig, load_config
from raf._observers.ledger import ContextLedger
from raf._observers.mermaid import MermaidObserver
from raf._observers.tracing import StageEvent
from raf._sessions.base import Session
from raf._sessions.memory import InMemorySession
from raf._sessions.stores import open_store
from raf._values.decision import Decision
from raf._values.messages import AgentResponse, Update
from raf.errors import (
    AgentError,
    ChatClientError,
    ConfigError,
    ProviderError,
    StreamClosedError,
    ToolError,
)

__all__: list[str] = []

#: Exit statuses of the command (docs/cli.md): scripts tell these apart.
EXIT_OK = 0
#: The run failed in a provider or a tool (a ProviderError, a ToolLoopError...).
EXIT_RUN_FAILED = 1
#: A usage or config error: a bad option, a config file that is wrong, a store that cannot open.
EXIT_USAGE = 2
#: The model or the network failed (a ChatClientError: rate limit, timeout, connection...).
EXIT_MODEL = 3
#: The turn ended with tool calls that wait for a person's approval (printed, with how to
#: decide each: ``raf run CONFIG --session ID --approve TOKEN``).
EXIT_WAITING = 4
#: Interrupted (Ctrl-C, SIGINT), as a shell reports it: 128 + 2.
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``raf`` and ``python -m raf``; returns the exit status."""
    _tolerant_streams()
    args = build_parser().parse_args(argv)  # a usage error exits EXIT_USAGE (argparse's 2)
    args.printer = _Printer(sys.stdout)
    # raf never configures structlog; its command does, unless the program running it
    # (a test, an application calling main) already has.
    logs_here = not structlog.is_configured()
    if logs_here:
        _configure_logging(args.printer, verbose=getattr(args, "verbose", False))
    try:
        if args.command == "schema":
            _say(_schema(), sys.stdout)
            return EXIT_OK
        if args.command == "chat":
            return _chat_command(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "replay":
            _say(anyio.run(replay_command, args), sys.stdout)
            return EXIT_OK
        return anyio.run(_run_command, args)
    except (AgentError, OSError) as exc:
        _say(f"raf: {exc}")
        return _exit_status(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if logs_here:
            structlog.reset_defaults()


def _serve(args: argparse.Namespace) -> int:
    """``raf serve``: its options as one :class:`raf.serve.ServeOptions`, served."""
    try:  # here: Starlette and uvicorn are an optional extra
        from raf.serve._options import ServeOptions
        from raf.serve._server import serve
    except ImportError as exc:
        raise ConfigError(
            f"raf serve needs the serve extra: pip install 'raf-agents[serve]' ({exc})"
        ) from None
    given = vars(args)  # the options given (the others are not there: their defaults hold)
    options = {
        field.name: given[field.name] for field in attrs.fields(ServeOptions) if field.name in given
    }
    return serve(
        args.config,
        ServeOptions(**options),
        host=args.host,
        port=args.port,
        workers=args.workers,
        grace=args.grace,
        api_key_files=args.api_key_file,
    )


def _exit_status(error: BaseException) -> int:
    """The exit status of an error that ended the command (see the EXIT_ constants)."""
    cause: BaseException | None = error
    while cause is not None:  # a provider's model call (a summary) that failed is the model's
        if isinstance(cause, ChatClientError):
            return EXIT_MODEL
        if isinstance(cause, ConfigError):
            return EXIT_USAGE
        cause = cause.__cause__ if isinstance(cause, ProviderError) else None
    if isinstance(error, (ProviderError, ToolError, StreamClosedError)):
        return EXIT_RUN_FAILED
    return EXIT_USAGE


class _LogLines:
    """structlog's logger for the command: each event on a line of its own, on stderr.

    An answer being printed to the same terminal has its line ended first, and
    a "thinking…" line is cleared (and shown again after the event), so a log
    line never lands inside an answer or after the "thinking…".
    """

    def __init__(self, printer: _Printer, stream: TextIO) -> None:
        self._printer = printer
        self._stream = stream
        self._same = _same_file(printer.out, stream)

    def msg(self, message: str) -> None:
        if self._same:
            self._printer.end_line()
        thinking = self._printer.clear is self._stream
        if thinking:
            _write(self._stream, _CLEAR_LINE)
        _say(message, self._stream)
        if thinking:  # still waiting for the first update
            _write(self._stream, _THINKING)

    log = debug = info = warning = warn = error = critical = fatal = exception = msg


def _configure_logging(printer: _Printer, *, verbose: bool) -> None:
    """structlog for the command: on stderr; on a terminal only errors, unless ``--verbose``.

    stdout holds just the answers. A terminal is a person reading an answer:
    warnings (a retry, a skipped skill) would only get in the way; ``--verbose``
    brings every event back. Piped stderr (a file, a log collector) gets them all.
    """
    import logging

    quiet = sys.stderr.isatty() and not verbose
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.ERROR if quiet else logging.DEBUG
        ),
        logger_factory=lambda *args: _LogLines(printer, sys.stderr),
        cache_logger_on_first_use=False,
    )


def _schema() -> str:
    """The JSON Schema of a config file, as shipped in the package (no pydantic needed)."""
    return (files("raf") / "config.schema.json").read_text(encoding="utf-8").rstrip("\n")


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


async def _run_command(args: argparse.Namespace) -> int:
    printer: _Printer = args.printer
    decisions = decisions_of(args)  # before the config: a usage error needs no agent
    loaded = _load(args, printer)
    async with _opened(args, loaded.agent) as session:
        try:
            response = await loaded.agent.run(
                decisions or _from_argv(args.message),
                session=session,
                options=loaded.options,
                on_update=printer,
            )
        finally:
            # A failed turn leaves what it printed on a line of its own, before the error.
            printer.end_line()
        if not response.pending:
            printer.finish()
            return EXIT_OK
        for line in waiting_lines(response.pending, args):
            _say(line, printer.out)
        if args.session is None:
            _say(UNDECIDABLE)
        return EXIT_WAITING


def _load(args: argparse.Namespace, printer: _Printer) -> LoadedConfig:
    """The config, its agent watched by the observers that ``--trace`` asks for."""

    def diagram(text: str) -> None:
        printer.end_line()
        _say(text, sys.stderr)

    observers: list[Any] = [MermaidObserver(diagram)] if args.mermaid else []
    args.ledger = ContextLedger() if args.context else None  # printed by _opened, at the end
    if args.ledger is not None:
        observers.append(args.ledger)
    # raf chat says what each turn cost, when the model's price is known.
    args.turn_cost = TurnCost() if getattr(args, "command", None) == "chat" else None
    if args.turn_cost is not None:
        observers.append(args.turn_cost)
    return load_config(
        args.config,
        emit=_trace_printer(sys.stderr, printer) if args.trace else None,
        observers=observers,
    )


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
        elif update.kind not in ("usage", "reasoning", "compaction"):
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

    Providers, chat middleware and clients that hold resources (an MCP server, a
    SpendLimits' store, an HTTP pool) are opened once for the whole command, and
    closed on the way out.
    """
    async with AsyncExitStack() as resources:
        ledger = getattr(args, "ledger", None)
        if ledger is not None:  # --trace=context: the ledger's table, once all is closed
            resources.callback(lambda: _say(ledger.report()))
        await enter_resources(agent, resources)
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
    printer: _Printer = args.printer
    loaded = _load(args, printer)
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(_opened(args, loaded.agent)) as session,
    ):
        # --trace prints its own progress on stderr: no "thinking…" line in between.
        return _chat(
            portal,
            loaded,
            session,
            thinking=not (args.trace or args.mermaid),
            printer=printer,
            cost=args.turn_cost,
        )


def _chat(
    portal: BlockingPortal,
    loaded: LoadedConfig,
    session: Session,
    *,
    thinking: bool = True,
    printer: _Printer | None = None,
    cost: TurnCost | None = None,
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

    def ask(question: str) -> str:
        if prompt_on_stdout:
            return input(question)
        _write(person, question)  # piped input too: the question names the call
        return input("")

    def said(turn: str | tuple[Decision, ...]) -> AgentResponse | None:
        """One turn (or a resume) printed; ``None`` when it failed or was stopped."""
        try:
            response = _turn(
                portal, loaded, session, turn, printer, thinking=thinking and interactive
            )
        except ChatClientError as exc:
            # The model failed this turn (rate limit, timeout...): nothing was stored,
            # so the conversation can go on; a broken config or provider still ends it.
            printer.end_line()
            _say(f"raf: this turn failed: {exc}")
            spent()
            return None
        if isinstance(response, str):  # Ctrl-C ended it
            printer.end_line()
            _say(f"raf: {response}")
            return None
        if response.pending:  # no empty line before the questions
            printer.end_line()
        else:
            printer.finish()
        spent()
        return response

    def spent() -> None:
        line = None if cost is None else cost.line()
        if line is not None:  # on stderr: stdout holds the answers alone
            _say(line, sys.stderr)

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
            response = said(line)
            # Each call that waits is asked for before the next message (a new message
            # would refuse it); the decisions resume the turn, which may wait again.
            while response is not None and response.pending:
                try:
                    decisions = ask_decisions(response.pending, ask)
                except EOFError:  # the calls stay waiting in the session
                    if interactive:
                        _write(person, "\n")
                    return EXIT_WAITING
                response = said(decisions)
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
    line: str | tuple[Decision, ...],
    printer: _Printer,
    *,
    thinking: bool,
) -> AgentResponse | str:
    """One turn in the loop thread, streamed to ``printer``: its response, or how Ctrl-C ended it.
    ``line`` is the person's message, or the decisions of the calls that wait.

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


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
