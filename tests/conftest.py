"""Every async test runs on both anyio backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.redis_server import redis_server  # noqa: F401  (a real redis-server for the session)


@pytest.fixture(params=["asyncio", "trio"], scope="module")
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder next to a file-tool root, holding what must never leak: ``secret.txt``."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.txt").write_text("top secret")
    return folder
