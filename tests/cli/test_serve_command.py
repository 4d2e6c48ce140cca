"""``raf serve`` usage mistakes (issue 32): one line on stderr and exit 2, no traceback;
keys from a file and the environment, not only argv (a real uvicorn process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx2 as httpx
import pytest

from tests._harness.process import free_port
from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

ROOT = Path(__file__).resolve().parents[2]


def config(tmp_path: Path) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text('[agent]\nname = "word-agent"\n[model]\nclient = "echo"\n')
    return path


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--port", "99999"], "raf: --port must be 0 to 65535, got 99999"),
        (["--db", f"redis://127.0.0.1:{free_port()}/0"], "redis://127.0.0.1:"),
        (["--api-key-file", "no-such-file"], "raf: --api-key-file no-such-file: cannot be read"),
        (["--write-timeout", "0"], "raf: write_timeout must be a positive number of seconds"),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2(
    tmp_path: Path, extra: list[str], said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "raf", "serve", str(config(tmp_path)), *extra],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("raf: ")
    assert said in line
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_keys_come_from_a_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("from-file\n\n")
    monkeypatch.setenv("RAF_API_KEYS", "from-env-1, from-env-2")
    command = [sys.executable, "-m", "raf", "serve", str(config(tmp_path))]
    with ServedAgent(command=[*command, "--api-key-file", str(keys)]) as served:
        for key, status in (("from-file", 200), ("from-env-2", 200), ("other", 401)):
            reply = httpx.get(
                f"{served.url}/v1/models", headers={"authorization": f"Bearer {key}"}, verify=TLS
            )
            assert reply.status_code == status


def test_serve_without_the_serve_extra_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # As --db redis:// without the redis extra: a hint, not a ModuleNotFoundError (exit 1).
    hidden = "import sys\nfor m in ('starlette', 'uvicorn'): sys.modules[m] = None\n"
    run = f"{hidden}from raf._cli import main\nsys.exit(main(['serve', {str(config(tmp_path))!r}]))"
    done = subprocess.run(
        [sys.executable, "-c", run], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("raf: raf serve needs the serve extra: pip install 'raf-agents[serve]'")
    assert "Traceback" not in done.stderr
