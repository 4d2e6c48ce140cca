"""The ``raf`` command's arguments: its commands, their options and the help's words."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from raf._metadata import docs_url, installed_version

__all__: list[str] = []

DEFAULT_DB = Path(".raf") / "sessions.db"


def _epilog() -> str:
    """The help's closing words: the config in brief, and where the docs are."""
    site = docs_url()
    where = (
        f"The docs (once hosted; `make docs` builds them from a checkout): {site}\n"
        f"  this command and its config: {site.rstrip('/')}/cli/"
        if site
        else "The docs are in raf's source, docs/cli.md for this command and its config."
    )
    return (
        "The config is a TOML file: [agent] (name, instructions, tools), [model] (client,\n"
        "model, base_url, api_key_env, temperature, max_tokens, timeout, idle_timeout),\n"
        "[[providers]] and [[chat_stack]]; `raf schema` prints its JSON Schema.\n"
        f"{where}\n"
        "In the source: docs/cli.md, docs/declaring-providers.md for the provider kinds.\n"
        "Exit status: 0 done, 1 a provider or a tool failed the run, 2 a usage or config\n"
        "error, 3 the model or the network failed, 4 tool calls wait for approval (raf run\n"
        "prints each and how to decide it: raf run CONFIG --session ID --approve TOKEN\n"
        "| --deny TOKEN [--reason TEXT]), 130 interrupted."
    )


class _Parser(argparse.ArgumentParser):
    """A parser whose help ends with :func:`_epilog` when made with ``docs=True``.

    The epilog reads the package metadata, as ``--version`` does: only when the help is
    shown, not at every start of the command.
    """

    def __init__(self, *args: Any, docs: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._docs = docs

    def format_help(self) -> str:
        if self._docs:
            self.epilog, self._docs = _epilog(), False
        return super().format_help()


class _Version(argparse._VersionAction):
    """``--version``: the installed version, read when asked."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        self.version = f"raf {installed_version()}"
        super().__call__(parser, namespace, values, option_string)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="raf",
        description="Run an agent described in a TOML config file.",
        docs=True,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="run one turn and print the answer",
        docs=True,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("config", type=Path, help="the agent's TOML config file")
    run.add_argument("message", nargs="?", help="the user message (none with --approve/--deny)")
    run.add_argument(
        "--approve",
        action="append",
        metavar="TOKEN",
        help="run the call that waits for approval under TOKEN (repeatable; needs --session)",
    )
    run.add_argument(
        "--deny",
        action="append",
        metavar="TOKEN",
        help="refuse the call that waits under TOKEN (repeatable; needs --session)",
    )
    run.add_argument("--reason", metavar="TEXT", help="why the --deny calls are refused")
    chat = commands.add_parser(
        "chat",
        help="an interactive conversation (one session)",
        docs=True,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat.add_argument("config", type=Path, help="the agent's TOML config file")
    commands.add_parser(
        "schema",
        help="print the JSON Schema of the config file (for an editor: see docs/cli.md)",
    )
    _serve_parser(commands)
    _replay_parser(commands)
    for command in (run, chat):
        command.add_argument("--session", help="keep history in this session of the store")
        command.add_argument(
            "--db",
            default=None,  # a str, not a Path: Path would fold redis:// into redis:/
            help=f"the session store: a SQLite file (default {DEFAULT_DB}; missing folders "
            "are created), redis://HOST:PORT/N or postgresql://USER@HOST:PORT/DB",
        )
        for flag, dest, text in _TRACES:
            command.add_argument(flag, dest=dest, action="store_true", help=text)
        command.add_argument(
            "--verbose",
            action="store_true",
            help="every log event on stderr (on a terminal, only errors are shown otherwise)",
        )
    return parser


def _replay_parser(commands: Any) -> None:
    replay = commands.add_parser(
        "replay",
        help="replay a stored conversation through the config's stack (and another's): what "
        "each model call would have sent and billed (docs/replay.md)",
    )
    replay.add_argument("config", type=Path, help="the agent's TOML config file")
    replay.add_argument(
        "--db",
        default=None,
        help=f"the session store: a SQLite file (default {DEFAULT_DB}), redis://... or "
        "postgresql://...",
    )
    replay.add_argument("--session", required=True, help="the stored conversation to replay")
    replay.add_argument(
        "--against", type=Path, metavar="OTHER.toml", help="a second config, side by side"
    )
    replay.add_argument(
        "--chart", type=Path, metavar="FILE.svg", help="draw each call's context and cache as SVG"
    )


#: The ``--trace`` flags: what each prints on stderr.
_TRACES = (
    ("--trace", "trace", "print each provider stage, model call and tool call as it happens"),
    ("--trace=mermaid", "mermaid", "print each run at its end as a Mermaid sequence diagram"),
    ("--trace=context", "context", "print each model call's tokens by layer at the end"),
)


def _serve_parser(commands: Any) -> None:
    # The options of raf.serve.ServeOptions have its names (dest) and its defaults: an
    # option left out is not in the namespace (SUPPRESS), so ServeOptions' default holds.
    serve = commands.add_parser(
        "serve",
        help="serve the agent over HTTP: OpenAI chat completions, AG-UI, a chat page "
        "(extra raf-agents[serve]; docs/serving.md)",
    )
    serve.add_argument("config", type=Path, help="the agent's TOML config file")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve.add_argument("--port", type=int, default=8000, help="the port to listen on")
    serve.add_argument(
        "--db",
        dest="store",
        default=argparse.SUPPRESS,
        help="the session store: a SQLite file, redis://HOST:PORT/N or postgresql://... "
        "(default: in memory)",
    )
    serve.add_argument("--workers", type=int, default=1, help="worker processes (need --db)")
    serve.add_argument(
        "--api-key-file",
        action="append",
        default=[],
        help="a file of keys, one a line (also RAF_API_KEYS=KEY1,KEY2)",
    )
    for flag, dest, text in (
        (
            "--api-key",
            "api_keys",
            "a key callers must send (repeatable; seen in the process list)",
        ),
        (
            "--allowed-host",
            "allowed_hosts",
            "a Host served besides localhost and --host (without keys)",
        ),
        (
            "--allowed-origin",
            "allowed_origins",
            "a browser Origin allowed besides the server's (without keys)",
        ),
    ):
        serve.add_argument(flag, dest=dest, action="append", default=argparse.SUPPRESS, help=text)
    serve.add_argument(
        "--grace", type=int, default=10, help="seconds SIGTERM leaves in-flight streams"
    )
    serve.add_argument(
        "--mcp",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also serve /mcp: the agent as an MCP server",
    )
    serve.add_argument(
        "--a2a",
        action="store_true",
        default=argparse.SUPPRESS,
        help="also serve the agent over A2A (extra raf-agents[a2a])",
    )
    serve.add_argument(
        "--public-url",
        default=argparse.SUPPRESS,
        help="the address callers reach the server at (https://HOST/PREFIX), which the "
        "A2A card names (default: --host and --port)",
    )
    for flag, text in (
        ("--body-timeout", "seconds a request's body may take to come in (then a 408)"),
        ("--write-timeout", "seconds a client may leave a send untaken (then it is gone)"),
    ):
        serve.add_argument(flag, type=float, default=argparse.SUPPRESS, help=text)
