"""The Redis connection of a session store: opening it, running scripts, saying what failed."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Final, NoReturn, Self
from urllib.parse import urlsplit, urlunsplit

import anyio
import coredis
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import NoScriptError, RedisError, WrongTypeError
from coredis.retry import NoRetryPolicy

from raf.errors import SessionStoreError

__all__: list[str] = []

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
#: Seconds a store waits for the server by default: on opening (the connect and the
#: PING) and on each call. Past it the call is a SessionStoreError, never a hang.
DEFAULT_TIMEOUT: Final = 10.0


# A dropped connection shows as coredis's ConnectionError, an OSError, or an anyio
# stream error, depending on where the client was when it dropped.
CONNECTION_FAILURES: Final = (
    RedisConnectionError,
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)
# TimeoutError: the call's own deadline (the store's timeout), or coredis's stream timeout.
FAILURES: Final = (RedisError, TimeoutError, *CONNECTION_FAILURES)
#: Each Lua script's SHA1, computed on first use.
_SHA1: dict[str, str] = {}


class RedisConnection:
    """A :class:`raf.RedisSessionStore`'s client: open, run a script, fail with a clear error."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        prefix: str = "raf",
        ttl: float | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        if type(url) is not str or urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"RedisSessionStore: url must be a redis:// URL, got {url!r}")
        if type(prefix) is not str or not prefix:
            raise ValueError(f"RedisSessionStore: prefix must be a non-empty str, got {prefix!r}")
        if ttl is not None and (isinstance(ttl, bool) or not ttl > 0):
            raise ValueError(f"RedisSessionStore: ttl must be None or > 0 seconds, got {ttl!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ValueError(
                f"RedisSessionStore: timeout must be None or > 0 seconds, got {timeout!r}"
            )
        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.timeout = timeout
        # EXPIRE takes whole seconds; a part of a second is rounded up, never down to 0.
        self.ttl_arg = "0" if ttl is None else str(max(1, -int(-ttl // 1)))
        self.where = f"Redis session store {redacted(url)}"
        self._client: coredis.Redis[bytes] | None = None
        self._exit = AsyncExitStack()
        self._closed = False

    async def open(self) -> Self:
        """Connect and check that the server answers (``async with`` calls it)."""
        if self._closed:
            raise SessionStoreError(f"{self.where}: the store is closed")
        if self._client is not None:
            return self
        await self._check_answers()
        # No automatic retries: resending a write whose reply was lost could store it twice.
        # stream_timeout: coredis's own bound on each reply (opening included), under the
        # calls' deadlines (a cancel scope cannot enclose the client's task group).
        client: coredis.Redis[bytes] = coredis.Redis.from_url(
            self.url,
            decode_responses=False,
            retry_policy=NoRetryPolicy(),
            stream_timeout=self.timeout,
        )
        exit = AsyncExitStack()
        try:
            await exit.enter_async_context(client)
            await client.ping()
        except BaseException as exc:
            await exit.aclose()
            if isinstance(exc, TimeoutError):
                problem = f"the server did not answer within timeout={self.timeout} s"
            elif isinstance(exc, CONNECTION_FAILURES):
                problem = "cannot reach the server"
            elif isinstance(exc, RedisError):
                problem = "the server does not answer as Redis does"
            else:
                raise
            raise SessionStoreError(f"{self.where}: {problem}: {reason(exc)}") from exc
        self._client, self._exit = client, exit
        return self

    async def _check_answers(self) -> None:
        """Connect and send a PING over plain TCP, within ``timeout``: a server that is
        down, frozen or silent fails here, before coredis (which leaves a failed
        connection's streams unclosed, and whose opening no deadline of ours can enclose).
        Any reply will do (``-NOAUTH`` too): the client's PING then checks it is Redis.
        """
        parts = urlsplit(self.url)
        if parts.scheme == "unix":
            return
        try:
            with anyio.fail_after(self.timeout):
                stream = await anyio.connect_tcp(parts.hostname or "127.0.0.1", parts.port or 6379)
                async with stream:
                    if parts.scheme == "redis":  # a TLS server waits for its handshake
                        await stream.send(b"PING\r\n")
                        await stream.receive(1)
        except TimeoutError as exc:
            raise SessionStoreError(
                f"{self.where}: cannot reach the server: it did not answer within "
                f"timeout={self.timeout} s"
            ) from exc
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            raise SessionStoreError(
                f"{self.where}: cannot reach the server: {reason(exc)}"
            ) from exc

    async def aclose(self) -> None:
        """Close the connections; the store cannot be used afterwards."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await self._exit.aclose()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def client(self) -> coredis.Redis[bytes]:
        """The open client; a :class:`raf.errors.SessionStoreError` when the store is not open."""
        if self._client is None:
            state = "closed" if self._closed else "not open: use `async with` or `await open()`"
            raise SessionStoreError(f"{self.where}: the store is {state}")
        return self._client

    async def run_script(
        self, client: coredis.Redis[bytes], script: str, keys: Sequence[str], args: list[str]
    ) -> Any:
        """Run a Lua script by its SHA1, loading it first if the server does not have it."""
        # EVALSHA directly: coredis's Script wrapper costs a tenth of an append.
        sha = _SHA1.get(script) or _SHA1.setdefault(
            script, hashlib.sha1(script.encode()).hexdigest()
        )
        try:
            return await client.evalsha(sha, keys=keys, args=args)
        except NoScriptError:
            # The server never ran the command (a restart or SCRIPT FLUSH dropped the
            # script): load it and send the command again, once.
            await client.script_load(script)
            return await client.evalsha(sha, keys=keys, args=args)

    def fail(
        self, exc: BaseException, what: str, session_id: str, *, writing: str = ""
    ) -> NoReturn:
        """Raise the SessionStoreError that says what ``exc`` means for this call."""
        where = f"{self.where}, session {session_id!r}"
        if isinstance(exc, TimeoutError):
            outcome = f"; {writing}" if writing else ""
            raise SessionStoreError(
                f"{where}: cannot {what}: the server did not answer within "
                f"timeout={self.timeout} s{outcome}"
            ) from exc
        if isinstance(exc, WrongTypeError) or "WRONGTYPE" in str(exc):
            raise SessionStoreError(
                f"{where}: cannot {what}: a key of the session holds another type of value "
                f"({reason(exc)}); it was left as it is"
            ) from exc
        if isinstance(exc, CONNECTION_FAILURES):
            outcome = f"; {writing}" if writing else ""
            raise SessionStoreError(
                f"{where}: the connection failed while trying to {what}: {reason(exc)}{outcome}"
            ) from exc
        raise SessionStoreError(f"{where}: cannot {what}: {reason(exc)}") from exc


def reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def redacted(url: str) -> str:
    """The URL without its password, for messages and reprs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))
