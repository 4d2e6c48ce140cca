"""MCP's JSON-RPC spoken to a child process over its stdin and stdout.

raf's own small client, under :class:`raf.McpToolsProvider`. The ``mcp`` SDK's
client checks each whole message against the protocol's pydantic models on the
event loop, with no await in between (a page of 20,000 tools, 3.7 MB, stalled
every other task for a second) and no hook to avoid it. Here a line is read in
chunks (each chunk searched once for its newline), parsed by :mod:`json` in
steps (:mod:`raf._providers.json_steps`) and handed over as plain data: what a
page holds is checked by its reader, tool by tool, yielding between them.

The transport is the one the specification names for stdio: one JSON-RPC
message per line, the server's stderr left to the caller (``errlog``), and a
shutdown that closes the server's stdin, waits, then terminates and kills its
process group. Nothing here outlives :func:`open_stdio`, also when the caller is
cancelled.
"""

from __future__ import annotations

import codecs
import itertools
import json
import math
import os
import reprlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Final, TextIO

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from raf._log import log as _log
from raf._providers.json_steps import loads_in_steps

__all__: list[str] = []

#: The protocol revision raf asks for: the newest one reached by the ``initialize`` handshake.
PROTOCOL_VERSION: Final = "2025-11-25"
#: The revisions a server may answer with: tools are listed and called the same way in all.
KNOWN_PROTOCOL_VERSIONS: Final = ("2024-11-05", "2025-03-26", "2025-06-18", PROTOCOL_VERSION)
#: The longest line (one message) a server may send: a bound on what one reply can cost.
MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
#: A server's error message is quoted up to this many characters.
MAX_ERROR_CHARS: Final = 2000

#: What the server inherits of this process's environment (``env`` is added to it),
#: as the ``mcp`` SDK does: a server gets no secrets it was not given.
_INHERITED_ENV: Final = (
    (
        "APPDATA",
        "HOMEDRIVE",
        "HOMEPATH",
        "LOCALAPPDATA",
        "PATH",
        "PATHEXT",
        "PROCESSOR_ARCHITECTURE",
        "SYSTEMDRIVE",
        "SYSTEMROOT",
        "TEMP",
        "USERNAME",
        "USERPROFILE",
    )
    if sys.platform == "win32"
    else ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
)
#: The server's time to exit by itself once its stdin is closed, then after SIGTERM,
#: then after SIGKILL (the last only for a process that cannot be killed).
_EXIT_GRACE: Final = 2.0
#: The longest a message may take to be written to the server's stdin (it reads nothing).
_WRITE_BOUND: Final = 10.0
#: The most requests of the server's (pings) answered at once: a flood waits its turn.
_MAX_ANSWERING: Final = 16
#: How long a reader waits, after the server closed its stdout, to learn its exit code.
_EXIT_CODE_WAIT: Final = 1.0
_EXIT_POLL: Final = 0.01
_CLIENT_INFO: Final = {"name": "raf", "version": "1"}


def server_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """The environment of a server process: the safe part of this one, then ``env``."""
    inherited = {
        key: value
        for key in _INHERITED_ENV
        if (value := os.environ.get(key)) is not None and not value.startswith("()")
    }
    return inherited | dict(env or {})


class ServerFault(Exception):
    """What the server did wrong, as a clause about it (``it exited with code 3 ...``);
    the connection's user says what it was doing and raises :class:`McpError`."""


@attrs.define(slots=True)
class _Waiter:
    """A request waiting for its answer (or for the connection to end)."""

    done: anyio.Event = attrs.field(factory=anyio.Event)
    message: dict[str, Any] | None = None


class StdioConnection:
    """One MCP server process and the requests waiting for its answers.

    Made by :func:`open_stdio`. What goes wrong on the server's side is a
    :class:`ServerFault`.
    """

    def __init__(
        self,
        process: anyio.abc.Process,
        group: anyio.abc.TaskGroup,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.process = process
        self.protocol_version: str | None = None
        self._group = group
        self._max_message_bytes = max_message_bytes
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._writing = anyio.Lock()
        self._answering = anyio.Semaphore(_MAX_ANSWERING)
        #: How many of the server's requests were left unanswered, and how many of its lines
        #: were not JSON: a flood's warnings thin out.
        self._unanswered = self._bad_lines = 0
        #: Why the connection ended (a clause), once it has.
        self._ended: str | None = None

    async def initialize(self) -> None:
        """The ``initialize`` handshake, then ``notifications/initialized``."""
        result = await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": _CLIENT_INFO,
            },
        )
        version = result.get("protocolVersion")
        if version not in KNOWN_PROTOCOL_VERSIONS:
            raise ServerFault(
                f"it answered with protocol version {quote(version)}, which raf does not speak "
                f"(raf speaks {', '.join(KNOWN_PROTOCOL_VERSIONS)})"
            )
        self.protocol_version = version
        await self.notify("notifications/initialized")

    async def request(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Send ``method`` and wait for its result (a JSON object); an error answer,
        a result that is not an object, or the end of the connection is :class:`ServerFault`."""
        try:
            return await self._request(method, params)
        except ServerFault:
            await _cancelled_if_so()
            raise

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        """Send the notification ``method``."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = dict(params)
        try:
            await self._send(message)
        except ServerFault:
            await _cancelled_if_so()
            raise

    async def _request(self, method: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
        if self._ended is not None:
            raise ServerFault(self._ended)
        ident = next(self._ids)
        waiter = self._waiters[ident] = _Waiter()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            message["params"] = dict(params)
        try:
            await self._send(message)
            await waiter.done.wait()
        except anyio.get_cancelled_exc_class():
            if method != "initialize" and self._ended is None:
                # The caller gave up (a timeout): tell the server, so it can stop the work.
                with anyio.move_on_after(_EXIT_GRACE, shield=True):
                    await self._send_quietly(
                        {
                            "jsonrpc": "2.0",
                            "method": "notifications/cancelled",
                            "params": {"requestId": ident, "reason": "the caller gave up"},
                        }
                    )
            raise
        finally:
            del self._waiters[ident]
        return _result(waiter.message, self._ended)

    async def _send(self, message: Mapping[str, Any]) -> None:
        # ASCII: a lone surrogate (json.loads makes one of "\\ud800") cannot be encoded otherwise.
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        stdin = self.process.stdin
        assert stdin is not None  # opened with a pipe
        async with self._writing:
            if self._ended is not None:  # (asyncio warns of each write to a closed pipe)
                raise ServerFault(self._ended)
            # A message cut off by a caller's cancellation would garble every later one: it is
            # written whole, or, when the server reads nothing for a while, the connection ends.
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + _WRITE_BOUND
                try:
                    await stdin.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    raise ServerFault(self._ended or _closed(self.process, "its stdin")) from exc
            if scope.cancelled_caught:
                self._end(f"it read nothing of its stdin for {_WRITE_BOUND:g}s")
                raise ServerFault(self._ended or "")

    async def _send_quietly(self, message: Mapping[str, Any]) -> None:
        with suppress(ServerFault):
            await self._send(message)

    async def read(self) -> None:
        """Read the server's stdout until it ends, then fail every waiting request."""
        stdout = self.process.stdout
        assert stdout is not None  # opened with a pipe
        line = bytearray()
        why: str | None = None
        try:
            while why is None:
                chunk = await stdout.receive()
                start = 0
                # Only the new chunk is searched: a long line costs its length, once.
                while (end := chunk.find(b"\n", start)) >= 0:
                    if len(line) + end - start > self._max_message_bytes:
                        break
                    line += chunk[start:end]
                    await self._dispatch(bytes(line))
                    line.clear()
                    start = end + 1
                else:
                    line += memoryview(chunk)[start:]
                    if len(line) <= self._max_message_bytes:
                        continue
                why = (
                    f"it sent a message of more than {self._max_message_bytes:,} bytes "
                    "(the bound of one message); it was stopped"
                )
                # The rest of that message is unread: the server cannot go on, so stop it now.
                _signal(self.process, hard=True)
                await _exited(self.process, _EXIT_GRACE)  # reaped (on trio, by asking)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await _exited(self.process, _EXIT_CODE_WAIT)
            why = _closed(self.process, "its stdout")
        except Exception as exc:  # a bug here must not cancel the caller's task (the group's)
            _log.exception("mcp.read_failed")
            why = f"reading its output failed: {type(exc).__name__}: {exc}"
        finally:
            self._end(why or "the connection was closed")

    def _end(self, why: str) -> None:
        if self._ended is None:
            self._ended = why
        for waiter in self._waiters.values():
            waiter.done.set()

    async def _dispatch(self, line: bytes) -> None:
        """One line of the server's stdout: an answer, a request to answer, or a notification."""
        await anyio.lowlevel.checkpoint()
        if not line.strip():
            return
        try:
            message = await loads_in_steps(line.decode())
        except (ValueError, RecursionError) as exc:
            # Not a message (a server that prints to stdout): skipped, as no request is its.
            self._bad_lines += 1
            if _thinned(self._bad_lines):
                _log.warning(
                    "mcp.bad_line",
                    reason=str(exc),
                    line=quote(line[:200].decode(errors="replace")),
                    bad_lines=self._bad_lines,
                )
            return
        for index, one in enumerate(message if isinstance(message, list) else [message]):
            if isinstance(one, dict):
                self._handle(one)
            # A pause after each message of a batch (20,000 held the loop 0.4 s); what is
            # not a message costs little, and pauses less often.
            if message is not one and (isinstance(one, dict) or index % 4096 == 4095):
                await anyio.lowlevel.checkpoint()

    def _handle(self, message: dict[str, Any]) -> None:
        method, ident = message.get("method"), message.get("id")
        if isinstance(method, str):
            if ident is None:
                if method == "notifications/message":
                    _log.debug("mcp.server_log", params=quote(message.get("params")))
                return
            if self._answering.value:
                # Answered from a task of its own, so the reader never waits on the server's stdin;
                # a server that sends more at once than it reads the answers of is answered less.
                self._answering.acquire_nowait()
                self._group.start_soon(self._answer, ident, method)
            else:
                self._unanswered += 1
                if _thinned(self._unanswered):
                    _log.warning(
                        "mcp.request_unanswered", method=quote(method), unanswered=self._unanswered
                    )
            return
        waiter = self._waiters.get(ident) if type(ident) is int else None
        if waiter is not None and not waiter.done.is_set():
            waiter.message = message
            waiter.done.set()

    async def _answer(self, ident: object, method: str) -> None:
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": ident}
        if method == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {
                "code": -32601,
                "message": f"raf's client does not offer {quote(method)}",
            }
        try:
            await self._send_quietly(reply)
        finally:
            self._answering.release()


@asynccontextmanager
async def open_stdio(
    command: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    errlog: TextIO,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> AsyncIterator[StdioConnection]:
    """Start ``command args...`` and yield its connection (not yet initialized); on the
    way out the server is stopped, also when the caller is cancelled.

    Starting it may raise :class:`OSError` (no such command, ...).
    """
    copied = not _has_file(errlog)  # a StringIO, pytest's capsys: its stderr is copied into it
    process = await anyio.open_process(
        [command, *args],
        env=server_environment(env),
        cwd=cwd,
        stderr=subprocess.PIPE if copied else errlog,
        # Its own process group: a server's children (npx's node, ...) are stopped with it.
        start_new_session=sys.platform != "win32",
    )
    failure: Exception | None = None
    try:  # from here on, the server is stopped whatever happens
        async with anyio.create_task_group() as group:
            connection = StdioConnection(process, group, max_message_bytes=max_message_bytes)
            group.start_soon(connection.read)
            if copied:
                group.start_soon(_copy, process.stderr, errlog)
            try:
                yield connection
            except Exception as exc:
                # Raised as it is below, not inside the task group's exception group.
                failure = exc
            finally:
                # Nothing more is written to it (the pings still read are not answered).
                connection._end("the connection was closed")
                with anyio.CancelScope(shield=True):
                    await _stop(process)
                group.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:  # the task group was never entered
                await _stop(process)
            await _close(process)
    if failure is not None:
        raise failure


async def _stop(process: anyio.abc.Process) -> None:
    """Close the server's stdin, give it time to exit, then terminate it, then kill it
    (the order of the specification's stdio shutdown)."""
    if process.stdin is not None:
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await process.stdin.aclose()
    for hard in (False, True):
        if await _exited(process, _EXIT_GRACE):
            break
        _signal(process, hard=hard)
    else:
        if not await _exited(process, _EXIT_GRACE):
            _log.warning("mcp.server_not_stopped", pid=process.pid)
            return
    # Children it left behind (its group outlives it) are stopped too.
    _signal(process, hard=False)


def _thinned(count: int) -> bool:
    """Whether the ``count``-th of a kind of warning is logged: the 1st, 2nd, 4th, 8th..."""
    return count & (count - 1) == 0


def _has_file(stream: TextIO) -> bool:
    """Whether ``stream`` has a file descriptor behind it (a child process can write to it)."""
    try:
        stream.fileno()
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return False
    return True


async def _copy(source: anyio.abc.ByteReceiveStream | None, errlog: TextIO) -> None:
    """Copy the server's stderr into ``errlog``, as it comes, until it ends."""
    assert source is not None  # opened with a pipe
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        while True:
            text = decoder.decode(await source.receive())
            with suppress(OSError, ValueError):  # a closed errlog: read on, or the server blocks
                errlog.write(text)


async def _cancelled_if_so() -> None:
    """Wait for the caller's cancellation when its scope is cancelled. That scope holds the
    connection's reader too: the reader, cancelled first, may end the connection before the
    caller's own cancellation lands (asyncio), which is then no fault of the server's."""
    if anyio.current_effective_deadline() == -math.inf:
        await anyio.sleep_forever()


async def _exited(process: anyio.abc.Process, within: float) -> bool:
    """Whether the server exited within ``within`` seconds; its return code is polled, as
    asyncio's ``wait()`` also waits for pipes that a child of the server may hold open."""
    with anyio.move_on_after(within):
        while process.returncode is None:  # noqa: ASYNC110 (no event to wait for)
            await anyio.sleep(_EXIT_POLL)
    return process.returncode is not None


def _signal(process: anyio.abc.Process, *, hard: bool) -> None:
    """SIGTERM (or SIGKILL) to the server's process group; on Windows, the process alone."""
    with suppress(ProcessLookupError, PermissionError):
        if sys.platform == "win32":
            process.kill() if hard else process.terminate()
        else:
            os.killpg(process.pid, signal.SIGKILL if hard else signal.SIGTERM)


async def _close(process: anyio.abc.Process) -> None:
    """Release the pipes of a stopped server (a child of it may still hold them open)."""
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await stream.aclose()
    # asyncio keeps the subprocess transport open until every pipe end is closed; a child
    # of the server holding one would leave it open (and warning at exit). No public way.
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()


def _result(message: dict[str, Any] | None, ended: str | None) -> dict[str, Any]:
    """The result of an answer; its error, a malformed one, or no answer is :class:`ServerFault`."""
    if message is None:
        raise ServerFault(ended or "the connection was closed")
    error = message.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise ServerFault(f"it answered with a malformed error: {quote(error)}")
        text = error.get("message")
        text = text if isinstance(text, str) else quote(text)
        text = cut(text, MAX_ERROR_CHARS)
        raise ServerFault(f"it answered with error {quote(error.get('code'))}: {text}")
    result = message.get("result")
    if not isinstance(result, dict):
        raise ServerFault(f"it answered with a result that is not an object: {quote(result)}")
    return result


def _closed(process: anyio.abc.Process, pipe: str) -> str:
    code = process.returncode
    if code is None:
        return f"it closed {pipe} (did it exit? its stderr shows why)"
    return f"it exited with code {code} (its stderr shows why)"


def cut(text: str, most: int) -> str:
    """``text`` of the server's, for a message or a warning, cut after ``most`` characters."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text) - most:,} more characters)"


def quote(value: object) -> str:
    """A value of the server's, for a message: bounded, and costing as little (a list of a
    million items is not written out to be cut)."""
    return _REPR.repr(value)


_REPR: Final = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 200
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = 20
