"""``raf serve CONFIG``: the agent of a config file, served by uvicorn (one or more workers)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from raf._config.file import load_config
from raf._sessions.stores import open_store
from raf.errors import ConfigError
from raf.serve._app import app
from raf.serve._edge import BODY_TIMEOUT, WRITE_TIMEOUT
from raf.serve._sessions import HEALTH_ID

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
    api_key_files: Sequence[Path] = (),
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
    mcp: bool = False,
    a2a: bool = False,
    body_timeout: float = BODY_TIMEOUT,
    write_timeout: float = WRITE_TIMEOUT,
    public_url: str | None = None,
) -> int:
    """Serve the agent of ``config`` until SIGINT or SIGTERM; returns the exit status.

    A SIGTERM drains: uvicorn stops accepting, the streams under way go on
    for up to ``grace`` seconds, then what is left is cancelled (its post
    stages run shielded, bounded by the agent's ``post_timeout``). More than
    one worker needs a store they share (``db``: a SQLite file or ``redis://``).
    The keys are ``api_keys``, those of ``api_key_files`` (one a line) and of
    ``RAF_API_KEYS`` (comma-separated): a key on the command line is seen by
    every local user in the process list. ``host`` is served besides
    localhost, and ``allowed_hosts``, ``allowed_origins``, ``body_timeout``,
    ``write_timeout``, ``mcp``, ``a2a`` (serve ``/mcp``, serve A2A) and ``public_url``
    (the address the A2A card names, else ``host`` and ``port``) go to the app.
    A usage mistake (a port out of range, a ``db`` that does not answer) is
    a :class:`raf.ConfigError` here, before uvicorn starts.
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
            "--workers above 1 needs --db (a SQLite file, redis://... or postgresql://...): "
            "the workers must share the sessions"
        )
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be 0 to 65535, got {port}")
    settings = {
        "config": str(config.resolve()), "db": db,
        "api_keys": [*api_keys, *_keys(api_key_files)],
        "allowed_hosts": [host, *allowed_hosts], "allowed_origins": list(allowed_origins),
        "mcp": mcp, "a2a": a2a,
        "body_timeout": body_timeout, "write_timeout": write_timeout,
        "public_url": public_url,
    }  # fmt: skip
    from_env(settings)  # the config is checked here, once, before any worker starts
    if db is not None:
        anyio.run(_check_db, db)
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
        allowed_hosts=settings.get("allowed_hosts"),
        allowed_origins=settings.get("allowed_origins"),
        options=loaded.options,
        manage_agent=True,
        mcp=settings.get("mcp", False),
        a2a=settings.get("a2a", False),
        body_timeout=settings.get("body_timeout", BODY_TIMEOUT),
        write_timeout=settings.get("write_timeout", WRITE_TIMEOUT),
        public_url=settings.get("public_url"),
    )


def _keys(files: Sequence[Path]) -> list[str]:
    """The keys of ``files`` (one a line, blank lines skipped) and of ``RAF_API_KEYS``."""
    keys = [k.strip() for k in os.environ.get("RAF_API_KEYS", "").split(",") if k.strip()]
    for path in files:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--api-key-file {path}: cannot be read ({exc})") from None
        found = [line.strip() for line in lines if line.strip()]
        if not found:
            raise ConfigError(f"--api-key-file {path}: holds no key (one a line)")
        keys += found
    return keys


async def _check_db(db: str) -> None:
    """A ``ConfigError`` unless the store ``db`` opens and answers (a Redis that is down)."""
    store = await open_store(db)
    try:
        # Not check_store: a Redis client's pool must be entered outside its time limit's
        # scope to be closed here; the store's own timeout bounds this read.
        await (await store.get(HEALTH_ID)).get_messages()
    except Exception as exc:
        raise ConfigError(f"--db {db}: the store does not answer: {exc}") from None
    finally:
        await store.aclose()  # in no scope of its own: the Redis pool's task group exits here
