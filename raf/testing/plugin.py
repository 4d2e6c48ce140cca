"""raf's pytest plugin: offline model fixtures, both anyio backends, no real model calls.

It is opt-in: installing raf does not load it. Enable it in a ``conftest.py``
with ``pytest_plugins = ["raf.testing.plugin"]``, or for one run with
``pytest -p raf.testing.plugin``. It gives

- ``scripted_client``: a fresh :class:`raf.ScriptedChatClient` per test; add
  its answers with ``scripted_client.script.append(...)`` /
  ``.script.extend([...])``, or parametrize it indirectly with the script:
  ``@pytest.mark.parametrize("scripted_client", [["hi", "bye"]], indirect=True)``;
- ``anyio_backend``: every ``@pytest.mark.anyio`` test runs on asyncio and
  on trio (trio when it is installed); a ``conftest.py`` fixture of the same
  name still wins;
- the marker ``@pytest.mark.raf_offline`` and the option ``--raf-offline``
  (every test): a connection to, or a name lookup of, any host that is not
  loopback fails with :class:`raf.errors.OfflineError` and fails the test, even if the
  code under test swallowed the error. A real model (``OpenAIChatClient``
  with no ``base_url`` on 127.0.0.1) cannot be called by accident; a test
  server on 127.0.0.1 still can.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from raf._clients.scripted import ScriptedChatClient
from raf.errors import OfflineError
from raf.testing import _backends

__all__: list[str] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("raf")
    group.addoption(
        "--raf-offline",
        action="store_true",
        default=False,
        help="raf: fail every test that connects to a host that is not loopback "
        "(a real model, for example), as @pytest.mark.raf_offline does for one test",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "raf_offline: the test fails if it connects to (or looks up) a host that is not "
        "loopback: no real model calls",
    )
    # Registered now, after the plugins loaded from entry points (anyio's among them) and
    # with ``-p``, so that this anyio_backend overrides anyio's default of asyncio alone.
    if not config.pluginmanager.has_plugin("raf-backends"):
        config.pluginmanager.register(_backends, "raf-backends")


@pytest.fixture
def scripted_client(request: pytest.FixtureRequest) -> ScriptedChatClient:
    """A fresh :class:`raf.ScriptedChatClient`; an indirect parameter is its script."""
    return ScriptedChatClient(getattr(request, "param", ()))


# Offline -------------------------------------------------------------------------------------


#: Set on a test whose call failed with the OfflineError: that failure already says it all.
_FAILED_OFFLINE = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if call.when == "call" and call.excinfo is not None and _offline(call.excinfo.value):
        item.stash[_FAILED_OFFLINE] = True
    return report


def _offline(error: BaseException | None, seen: frozenset[int] = frozenset()) -> bool:
    """Whether ``error`` is an OfflineError, or has one as its cause, context or member."""
    if error is None or id(error) in seen:
        return False
    if isinstance(error, OfflineError):
        return True
    seen = seen | {id(error)}
    members = error.exceptions if isinstance(error, BaseExceptionGroup) else ()
    return any(_offline(e, seen) for e in (error.__cause__, error.__context__, *members))


def _loopback(host: object) -> bool:
    if not isinstance(host, str):
        return False
    if host.lower() in ("localhost", "localhost.", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _raf_offline(request: pytest.FixtureRequest) -> Iterator[None]:
    """Refuse connections to hosts that are not loopback in a ``raf_offline`` test."""
    offline = request.node.get_closest_marker("raf_offline") is not None or bool(
        request.config.getoption("raf_offline", default=False)
    )
    if not offline:
        yield
        return
    attempts: list[str] = []

    def refuse(what: str) -> OfflineError:
        attempts.append(what)
        return OfflineError(
            f"raf_offline: this test may not reach {what}: only loopback hosts "
            "(a test server on 127.0.0.1); script the model with ScriptedChatClient"
        )

    original_connect = socket.socket.connect
    original_connect_ex = socket.socket.connect_ex
    original_getaddrinfo = socket.getaddrinfo

    def checked(method: Callable[..., Any]) -> Callable[..., Any]:
        def connect(self: socket.socket, address: Any) -> Any:
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
                raise refuse(f"{address[0]}:{address[1]}")
            return method(self, address)

        return connect

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        if host is not None and not _loopback(host):
            raise refuse(f"{host}:{port}")
        return original_getaddrinfo(host, port, *args, **kwargs)

    socket.socket.connect = checked(original_connect)  # type: ignore[method-assign]
    socket.socket.connect_ex = checked(original_connect_ex)  # type: ignore[method-assign]
    socket.getaddrinfo = getaddrinfo
    try:
        yield
    finally:
        socket.socket.connect = original_connect  # type: ignore[method-assign]
        socket.socket.connect_ex = original_connect_ex  # type: ignore[method-assign]
        socket.getaddrinfo = original_getaddrinfo
    # Reported once: a test that failed with the OfflineError itself needs no second report
    # at teardown; one whose code swallowed it fails here.
    if attempts and not request.node.stash.get(_FAILED_OFFLINE, False):
        pytest.fail(
            "raf_offline: the test tried to reach " + ", ".join(dict.fromkeys(attempts)),
            pytrace=False,
        )
