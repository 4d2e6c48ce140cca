"""Shared setup of raf's own suite: raf's pytest plugin, both anyio backends, hypothesis
profiles, the Redis and PostgreSQL servers.

The suite runs in parallel (pytest-xdist, ``make test``): each worker is its own
pytest session, so a session fixture (the Redis server) is one per worker, and
every path a test writes is under its own ``tmp_path``.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio.testing
from hypothesis import HealthCheck, settings

from tests._harness.postgres_server import PostgresServer, postgres_bin
from tests._harness.redis_server import RedisServer

# raf's plugin is opt-in, and the suite opts in as a user does (its anyio_backend below wins
# over the plugin's: it adds trio's mock clock).
pytest_plugins = ["raf.testing.plugin"]

# "ci" tries hypothesis's own default number of examples (what every run used before the
# profiles), for CI and whenever CI is set; "dev" tries fewer where a test does not ask
# for a number. HYPOTHESIS_PROFILE picks one by name. Neither times examples: their speed
# varies with the machine's load (a shared CI box, a parallel suite), and a slow example
# is not a broken law.
_SPEED = {"suppress_health_check": [HealthCheck.too_slow], "deadline": None}
settings.register_profile("ci", print_blob=True, **_SPEED)
settings.register_profile("dev", max_examples=20, **_SPEED)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "dev")
)


def pytest_collection_finish(session: pytest.Session) -> None:
    # What collection built (modules, test items, parameters) lives to the end: keep it out of
    # every later collection, so that a test module's gc.collect() does not walk it each time.
    gc.collect()
    gc.freeze()


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str | tuple[str, dict[str, Any]]:
    """Each async test on asyncio and on trio; ``@pytest.mark.mock_clock``: trio's autojump clock.

    With the mock clock, trio's time jumps to the next deadline whenever every task
    waits, so sleeps and timeouts cost no real time. Only for tests in which nothing
    waits outside trio (no socket, thread or subprocess): those would see their
    deadlines pass at once. asyncio has no mock clock and runs as it is.
    """
    if request.param == "trio" and request.node.get_closest_marker("mock_clock"):
        return ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)})
    return str(request.param)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder next to a file-tool root, holding what must never leak: ``secret.txt``."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret")
    return folder


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, for the whole session, stopped at its end."""
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL on a free loopback port (as an unprivileged user), for the whole
    session, stopped at its end; skipped where PostgreSQL is not installed."""
    if postgres_bin() is None:
        pytest.skip(
            "PostgreSQL is not installed (make test installs it: apt-get install postgresql)"
        )
    with PostgresServer() as server:
        yield server
