"""The plugin's ``anyio_backend`` fixture, in a module of its own so that the plugin can
register it after the plugins loaded from entry points (anyio's among them)."""

from __future__ import annotations

import importlib.util

import pytest


def _backends() -> list[str]:
    return ["asyncio", "trio"] if importlib.util.find_spec("trio") is not None else ["asyncio"]


@pytest.fixture(params=_backends(), scope="module")
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every anyio test on asyncio and on trio (if trio is installed)."""
    return str(request.param)
