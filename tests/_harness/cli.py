"""Run the ``raf`` command in this process, as the installed console script runs it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points


def raf_command() -> Callable[[], object]:
    """The ``raf`` console script's function, found as pip's wrapper finds it."""
    (script,) = entry_points(group="console_scripts", name="raf")
    command: Callable[[], object] = script.load()
    return command


def run_raf(argv: Sequence[str]) -> int:
    """``raf *argv``; the exit status the shell would see (docs/cli.md, "Exit status").

    pip's wrapper is ``sys.exit(main())`` with the words in ``sys.argv``: a returned
    status and a ``SystemExit`` (argparse's usage error) both end as the process's status.
    """
    saved = sys.argv
    sys.argv = ["raf", *argv]
    try:
        status = raf_command()()
    except SystemExit as exit_:
        status = exit_.code
    finally:
        sys.argv = saved
    if status is None:
        return 0
    return status if isinstance(status, int) else 1
