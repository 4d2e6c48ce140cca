"""raf's pytest plugin, run in a pytest of its own; and what ScriptedChatClient records."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import anyio
import pytest

from raf import Agent, ChatMessage, ChatOptions, ScriptedChatClient, ToolCall

ROOT = Path(__file__).resolve().parents[2]


#: An install of raf from before the plugin was opt-in still has its entry point: blocked.
#: langsmith's plugin (langchain's, installed for the driver tests) is blocked as in
#: pyproject.toml: it has nothing to do with raf's and costs each pytest ~0.8 s of CPU.
NO_ENTRY_POINT = ["-p", "no:raf", "-p", "no:langsmith_plugin"]


def run_pytest(
    folder: Path, test: str, *args: str, enabled: bool = True
) -> subprocess.CompletedProcess[str]:
    """``test`` as test_it.py in ``folder``, under a pytest with raf's plugin (no conftest)."""
    (folder / "test_it.py").write_text(textwrap.dedent(test))
    plugin = ["-p", "raf.testing.plugin"] if enabled else []
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NO_ENTRY_POINT]
        + [*plugin, *args],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=120,
    )


def test_installing_raf_registers_no_pytest_plugin() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "pytest11" not in project.get("entry-points", {})


SEES_THE_PLUGIN = """
    import pytest

    def test_what_the_plugin_gives(request):
        try:
            client = request.getfixturevalue("scripted_client") is not None
        except pytest.FixtureLookupError:
            client = False
        marker = any(m.startswith("raf_offline:") for m in request.config.getini("markers"))
        print("scripted_client:", client, "raf_offline:", marker)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "active"),
    [("not enabled", False), ("-p", True), ("pytest_plugins", True)],
)
def test_the_plugin_is_active_only_when_enabled(tmp_path: Path, how: str, active: bool) -> None:
    if how == "pytest_plugins":
        (tmp_path / "conftest.py").write_text('pytest_plugins = ["raf.testing.plugin"]\n')
    done = run_pytest(tmp_path, SEES_THE_PLUGIN, "-s", enabled=how == "-p")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"scripted_client: {active} raf_offline: {active}" in done.stdout, done.stdout


@pytest.mark.slow
def test_the_fixtures_run_each_anyio_test_on_both_backends_with_a_fresh_client(
    tmp_path: Path,
) -> None:
    done = run_pytest(
        tmp_path,
        """
        import pytest
        import sniffio
        from raf import Agent

        seen = []

        @pytest.mark.anyio
        async def test_a_run(scripted_client):
            scripted_client.script.append("hello")
            assert (await Agent(scripted_client).run("hi")).text == "hello"
            assert [r.messages[-1].content for r in scripted_client.requests] == ["hi"]
            seen.append(sniffio.current_async_library())

        @pytest.mark.parametrize("scripted_client", [["one", "two"]], indirect=True)
        def test_a_script_by_parameter(scripted_client):
            assert scripted_client.script == ["one", "two"]

        def test_both_backends_ran():
            assert sorted(seen) == ["asyncio", "trio"]
        """,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


@pytest.mark.slow
def test_a_conftest_anyio_backend_wins(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef anyio_backend():\n    return 'trio'\n"
    )
    done = run_pytest(
        tmp_path,
        """
        import pytest, sniffio

        @pytest.mark.anyio
        async def test_trio_only():
            assert sniffio.current_async_library() == "trio"
        """,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


OFFLINE_TESTS = """
    import socket
    import pytest
    from raf import Agent, OpenAIChatClient, ChatClientError

    @pytest.mark.anyio
    async def test_a_real_model(anyio_backend):
        if anyio_backend == "trio":
            pytest.skip("the OpenAI SDK runs on asyncio")
        client = OpenAIChatClient("gpt-4o-mini", api_key="sk-test", max_retries=0)
        with pytest.raises(ChatClientError):
            await Agent(client).run("hi")

    def test_a_socket_to_another_host():
        with pytest.raises(ConnectionRefusedError, match="raf_offline: this test may not reach"):
            socket.create_connection(("192.0.2.1", 443), timeout=5)

    def test_loopback_is_allowed():
        server = socket.create_server(("127.0.0.1", 0))
        with server, socket.create_connection(server.getsockname(), timeout=5):
            pass
"""


@pytest.mark.slow
def test_raf_offline_fails_a_test_that_reaches_a_model(tmp_path: Path) -> None:
    marked = textwrap.dedent(OFFLINE_TESTS).replace(
        "import pytest\n", "import pytest\npytestmark = pytest.mark.raf_offline\n", 1
    )
    for args, test in ((["--raf-offline"], OFFLINE_TESTS), ([], marked)):
        done = run_pytest(tmp_path, test, "-p", "no:randomly", *args)
        out = done.stdout
        assert done.returncode == 1, out + done.stderr
        # The model call and the socket are refused, and each test fails even though the
        # code under test caught the error; loopback works.
        assert "raf_offline: the test tried to reach api.openai.com:443" in out, out
        assert "raf_offline: the test tried to reach 192.0.2.1:443" in out, out
        # (a test that fails at teardown counts as passed and as an error)
        assert "3 passed, 1 skipped, 2 errors" in out, out


@pytest.mark.slow
def test_a_raf_offline_violation_is_reported_once(tmp_path: Path) -> None:
    done = run_pytest(
        tmp_path,
        """
        import socket
        import pytest

        @pytest.mark.raf_offline
        def test_uncaught():
            socket.create_connection(("192.0.2.1", 443), timeout=5)

        @pytest.mark.raf_offline
        def test_in_a_chain():
            try:
                socket.create_connection(("192.0.2.2", 443), timeout=5)
            except OSError as exc:
                raise RuntimeError("no model") from exc
        """,
        "-p",
        "no:randomly",
        "-rN",  # no short summary: under CI, pytest prints it whole, a second copy
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    # The test fails with the OfflineError (or what it caused), and its teardown adds no
    # second report of the same violation.
    assert "2 failed in" in out, out
    assert "error" not in out.splitlines()[-1], out
    assert out.count("raf_offline: this test may not reach 192.0.2.1:443") == 1, out


@pytest.mark.slow
def test_without_raf_offline_nothing_is_patched(tmp_path: Path) -> None:
    done = run_pytest(
        tmp_path,
        """
        import socket

        def test_untouched():
            assert socket.getaddrinfo.__module__ == "socket"
            assert socket.socket.connect.__qualname__ != "checked.<locals>.connect"
        """,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ScriptedChatClient records every call -------------------------------------------------------


@pytest.mark.anyio
async def test_the_scripted_client_records_every_call_streamed_or_not() -> None:
    call = ToolCall("c1", "echo", '{"text": "x"}')
    client = ScriptedChatClient(
        [ScriptedChatClient.tool_turn(call), ["stre", "amed"], RuntimeError("down")]
    )
    from raf.testing.strategies import make_tool

    agent = Agent(client, tools=[make_tool("echo")])
    seen: list[str] = []

    async def on_update(update: object) -> None:
        seen.append(getattr(update, "kind", ""))

    asked = [ChatMessage.user("go")]
    response = await agent.run(asked, on_update=on_update)
    assert response.text == "streamed"
    asked.append(ChatMessage.user("changed afterwards"))  # the record is a snapshot
    with pytest.raises(RuntimeError, match="down"):
        await client.complete([ChatMessage.user("again")], ChatOptions(model="m"))
    first, second, third = client.requests
    assert first.messages == (ChatMessage.user("go"),)
    assert [t.name for t in first.options.tools] == ["echo"]
    assert second.messages[-1] == ChatMessage.tool("c1", "x", name="echo")
    assert (first.streamed, second.streamed, third.streamed) == (True, True, False)
    assert third.options == ChatOptions(model="m")
    assert client.script == []
    await anyio.lowlevel.checkpoint()
