"""``raf serve CONFIG``: the agent of a config file, served by uvicorn (one or more workers)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raf._config.file import load_config
from raf._errors import ConfigError
from raf.serve._app import app

__all__: list[str] = []

#: How the command hands its settings to uvicorn's worker processes (each builds its app).
_ENV = "RAF_SERVE_SETTINGS"
#: Seconds a SIGTERM leaves in-flight streams to finish before they are cancelled.
GRACE = 10


def serve(
    config: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    db: str | None = None,
    workers: int = 1,
    api_keys: Sequence[str] = (),
    grace: int = GRACE,
) -> int:
    """Serve the agent of ``config`` until SIGINT or SIGTERM; returns the exit status.

    A SIGTERM drains: uvicorn stops accepting, the streams under way go on
    for up to ``grace`` seconds, then what is left is cancelled (its post
    stages run shielded, bounded by the agent's ``post_timeout``). More than
    one worker needs a store they share (``db``: a SQLite file or ``redis://``).
    """
    try:
        import uvicorn
    except ImportError as exc:
        raise ConfigError(
            f"raf serve needs the serve extra: pip install 'raf-agents[serve]' ({exc})"
        ) from None
    if grace < 1:
        raise ConfigError(f"--grace must be at least 1 second, got {grace}")
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if workers > 1 and db is None:
        raise ConfigError(
            "--workers above 1 needs --db (a SQLite file or redis://...): "
            "the workers must share the sessions"
        )
    settings = {"config": str(config.resolve()), "db": db, "api_keys": list(api_keys)}
    from_env(settings)  # the config is checked here, once, before any worker starts
    os.environ[_ENV] = json.dumps(settings)
    uvicorn.run(
        "raf.serve._server:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        timeout_graceful_shutdown=grace,
        log_level="info",
    )
    return 0


def app_from_env() -> Any:
    """The app of the settings ``serve`` left in the environment (uvicorn's factory)."""
    return from_env(json.loads(os.environ[_ENV]))


def from_env(settings: dict[str, Any]) -> Any:
    """The app of ``settings`` (the config file, the store, the keys)."""
    loaded = load_config(Path(settings["config"]))
    return app(
        loaded.agent,
        store=settings["db"],
        api_keys=settings["api_keys"] or None,
        options=loaded.options,
        manage_agent=True,
    )
