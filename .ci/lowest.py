"""Pins at the lowest version pyproject.toml declares, for `make test-lowest`.

Prints a pip constraints file: each dependency of the base install, and each package of the
`test` extra named on the command line (an extra's name in brackets is ignored: constraints
cannot carry one), pinned `==` its declared lower bound (`>=X`). A dependency without a lower
bound is an error: its lowest version cannot be tested. With `--extras-only` the base install is
left unpinned: the extras' lowest versions need newer base dependencies than raf does (coredis 6
needs anyio 4.11, google-genai 3.6.1 pydantic 2.12.5), so they get their own venv.

    python .ci/lowest.py pytest hypothesis trio 'psycopg[binary]' > constraints.txt
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")


def lower_bound(requirement: str) -> tuple[str, str]:
    """The name and the `>=` version of one requirement string of pyproject.toml."""
    match = REQUIREMENT.match(requirement.strip())
    if match is None:
        raise SystemExit(f"pyproject.toml: cannot read the requirement {requirement!r}")
    name, _, spec = match.groups()
    for clause in spec.split(";")[0].split(","):
        clause = clause.strip()
        if clause.startswith(">="):
            return name.lower(), clause[2:].strip()
    raise SystemExit(f"pyproject.toml: {requirement!r} declares no lower bound (>=) to test")


def main(names: list[str]) -> None:
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    extras_only = names[:1] == ["--extras-only"]
    names = names[1:] if extras_only else names
    pins = {} if extras_only else dict(lower_bound(r) for r in project["dependencies"])
    extra = {
        match.group(1).lower(): requirement
        for requirement in project["optional-dependencies"]["test"]
        if (match := REQUIREMENT.match(requirement))
    }
    for name in (n.split("[")[0] for n in names):
        if name.lower() not in extra:
            raise SystemExit(f"pyproject.toml: the test extra does not list {name!r}")
        pins.update([lower_bound(extra[name.lower()])])
    print("\n".join(f"{name}=={version}" for name, version in pins.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
