"""ServeOptions: how an app serves its agent, one frozen value from ``raf serve`` to ``app``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import attrs

from raf.errors import ConfigError

__all__ = ["ServeOptions"]

#: The default limit of a request body, in bytes (4 MiB).
MAX_BODY = 4 * 1024 * 1024
#: The default seconds a request's body may take to come in, and a send to be taken.
BODY_TIMEOUT = 30.0
WRITE_TIMEOUT = 30.0


def _keys(keys: Iterable[str] | None) -> tuple[str, ...] | None:
    if keys is None:
        return None
    if isinstance(keys, str):
        raise ConfigError("api_keys must be a list of keys, not one string")
    checked = tuple(keys)
    if not checked or not all(isinstance(k, str) and k for k in checked):
        raise ConfigError("api_keys must be non-empty strings (or None for no keys)")
    return checked


def _names(given: Iterable[str] | None, name: str) -> tuple[str, ...]:
    if isinstance(given, str):
        raise ConfigError(f"{name} must be a list of names, not one string")
    checked = tuple(given or ())
    if not all(isinstance(n, str) and n for n in checked):
        raise ConfigError(f"{name} must be non-empty strings")
    return checked


def _cors_origins(given: Iterable[str] | None) -> tuple[str, ...]:
    return _names(given, "cors_origins")


def _allowed_hosts(given: Iterable[str] | None) -> tuple[str, ...]:
    return _names(given, "allowed_hosts")


def _allowed_origins(given: Iterable[str] | None) -> tuple[str, ...]:
    return _names(given, "allowed_origins")


def _bytes(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 1:
        raise ConfigError(f"{attribute.name} must be a positive int of bytes, got {value!r}")


def _seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ConfigError(f"{attribute.name} must be a positive number of seconds, got {value!r}")


def _public_url(given: str | None) -> str | None:
    """``public_url`` checked: an absolute http(s) URL with a host (and a valid port), no
    query, fragment, credentials (the card is public) or whitespace, its trailing slash
    dropped (the routes' paths are added to it)."""
    if given is None:
        return None
    try:
        parts = urlsplit(given) if isinstance(given, str) else None
        port_ok = parts is not None and (parts.port is None or parts.port > 0)
    except ValueError:  # an unclosed [IPv6 address, a port that is no number or too large
        parts, port_ok = None, False
    if (
        parts is None
        or not port_ok
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
        or any(c.isspace() or not c.isprintable() for c in given)
    ):
        raise ConfigError(
            "public_url must be an http:// or https:// URL with a host and no query, "
            f"credentials or spaces, got {given!r:.200}"
        )
    return given.rstrip("/")


def _store(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    # Checked here, not at the first request: store=123 was a 500 on every one.
    if value is None or (isinstance(value, str) and value.strip()):
        return
    if isinstance(value, str) or not callable(getattr(value, "get", None)):
        raise ConfigError(
            "store must be a session store (with await store.get(id)), a --db value "
            f"(a SQLite path, redis://..., postgresql://...) or None, got {value!r:.80}"
        )


def _flag(instance: object, attribute: attrs.Attribute[bool], value: bool) -> None:
    # mcp="false" was true: a served protocol turned on by a word that says off.
    if not isinstance(value, bool):
        raise ConfigError(f"{attribute.name} must be True or False, got {value!r:.80}")


@attrs.frozen(kw_only=True)
class ServeOptions:
    """How :func:`raf.serve.app` serves an agent: ``app(agent, ServeOptions(...))``.

    ``raf serve``'s options arrive as one of these, and ``app(agent,
    store=...)`` builds one of its keywords; each option is defined here
    once (its default, its check). A wrong value is a :class:`raf.errors.ConfigError`
    naming the option.
    """

    #: Where sessions live: a store (``await store.get(id)``), or a ``--db`` value (a SQLite
    #: path, ``redis://...``, ``postgresql://...``) the app opens for its lifespan; ``None``
    #: keeps them in this process.
    store: Any = attrs.field(default=None, validator=_store)
    #: The keys a caller must send (``Authorization: Bearer KEY``); ``None``: no key.
    api_keys: tuple[str, ...] | None = attrs.field(default=None, converter=_keys)
    #: The largest request body, in bytes.
    max_body: int = attrs.field(default=MAX_BODY, validator=_bytes)
    #: The origins a browser may call from (CORS is off without them).
    cors_origins: tuple[str, ...] = attrs.field(default=(), converter=_cors_origins)
    #: The ``Host`` names served without keys, besides localhost (``"*"``: any).
    allowed_hosts: tuple[str, ...] = attrs.field(default=(), converter=_allowed_hosts)
    #: The browser ``Origin`` allowed without keys, besides the server's own.
    allowed_origins: tuple[str, ...] = attrs.field(default=(), converter=_allowed_origins)
    #: The lifespan also opens the agent's providers and closes its client (``raf serve``).
    manage_agent: bool = attrs.field(default=False, validator=_flag)
    #: Also serve ``/mcp``: the agent as an MCP server (extra ``raf-agents[mcp]``).
    mcp: bool = attrs.field(default=False, validator=_flag)
    #: Also serve the agent over A2A (extra ``raf-agents[a2a]``, asyncio only).
    a2a: bool = attrs.field(default=False, validator=_flag)
    #: The seconds a request's body may take to come in (then a 408).
    body_timeout: float = attrs.field(default=BODY_TIMEOUT, validator=_seconds)
    #: The seconds a send may wait for the client to take it (then the client is gone).
    write_timeout: float = attrs.field(default=WRITE_TIMEOUT, validator=_seconds)
    #: The address callers reach the app at (``https://agents.example.com``), which the
    #: A2A card names; ``None``: the address the connection came in on, never a ``Host``.
    public_url: str | None = attrs.field(default=None, converter=_public_url)
