"""raf-agents as a user gets it: the wheel, installed in a fresh virtualenv with an extra."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import raf

ROOT = Path(__file__).resolve().parents[2]


def test_the_version_is_the_installed_distributions() -> None:
    assert raf.__version__ == importlib.metadata.version("raf-agents")
    assert "__version__" not in raf.__all__


def test_the_metadata_names_the_docs_site_and_the_extras() -> None:
    meta = importlib.metadata.metadata("raf-agents")
    urls = dict(url.split(", ", 1) for url in meta.get_all("Project-URL") or [])
    assert urls["Documentation"].startswith("https://")
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"redis", "postgres", "otel", "mcp", "testing", "docs", "test"} <= extras
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH: what runs is what was installed, not this checkout.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_the_wheel_installs_in_a_fresh_virtualenv_and_runs_offline(tmp_path: Path) -> None:
    wheels = tmp_path / "dist"
    run(sys.executable, "-m", "build", "--wheel", "--outdir", wheels, ROOT, cwd=tmp_path)
    (wheel,) = wheels.glob("raf_agents-*.whl")
    assert wheel.name.startswith(f"raf_agents-{raf.__version__}-py3-none-any")
    env_dir = tmp_path / "env"
    # A virtualenv without a pip of its own, filled by this pip (`--python`): what gets installed
    # is the same, without ensurepip copying pip into it (about 4 s of CPU) and a second pip.
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # --no-compile: the check is what gets installed and that it runs, not pip compiling
    # every dependency (most of this test's time).
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-compile",
        f"raf-agents[otel] @ {wheel.as_uri()}",
        cwd=tmp_path,
    )

    done = run(env_dir / "bin" / "raf", "--version", cwd=tmp_path)
    assert done.stdout.strip() == f"raf {raf.__version__}"
    done = run(
        python,
        "-c",
        "import raf, raf.otel; print(raf.__version__, raf.__file__, raf.otel.instrument.__name__)",
        cwd=tmp_path,
    )
    version, where, instrument = done.stdout.split()
    assert version == raf.__version__
    assert Path(where).is_relative_to(env_dir)  # the installed package, not this checkout
    assert instrument == "instrument"  # the extra's dependency is there

    config = tmp_path / "agent.toml"
    config.write_text(
        "[agent]\nname = 'first'\n\n[model]\nclient = 'echo'\n\n[[providers]]\nkind = 'memory'\n"
    )
    done = run(env_dir / "bin" / "raf", "run", config, "hello from the wheel", cwd=tmp_path)
    assert done.stdout == "hello from the wheel\n"
    # The files the wheel must carry besides the code.
    done = run(env_dir / "bin" / "raf", "schema", cwd=tmp_path)
    assert '"title": "RafConfig"' in done.stdout
    assert (Path(where).parent / "py.typed").exists()


def test_the_install_docs_say_how_to_install_before_raf_is_on_the_index() -> None:
    # `pip install raf-agents` finds nothing today: a checkout, or git, and where the docs are.
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        text = page.read_text()
        assert "pip install '.[serve]'" in text, page
        assert "@ git+" in text, page
        assert "make docs" in text, page
