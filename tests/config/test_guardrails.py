"""[[guardrails]] in a config file: each kind built into its stack, its options checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from raf import InputGuardrail, OutputGuardrail, ToolGuardrail
from raf._cli import main
from raf._config.file import load_config
from raf.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_each_kind_goes_into_its_stack(tmp_path: Path) -> None:
    (tmp_path / "checks.py").write_text(
        "from raf import Verdict\n"
        "async def no_rm(text, context):\n"
        "    return Verdict.block('no rm') if 'rm -rf' in text else Verdict.allow()\n"
    )
    path = write(
        tmp_path,
        "[[chat_stack]]\nkind = 'logging'\n"
        "[[providers]]\nkind = 'memory'\n"
        "[[guardrails]]\nkind = 'output'\ncheck = 'pii_redactor'\nhold_back = 80\n"
        "entities = ['email']\nname = 'pii-out'\n"
        "[[guardrails]]\nkind = 'input'\ncheck = 'pii_redactor'\n"
        "[[guardrails]]\nkind = 'tool'\ncheck = 'checks:no_rm'\n",
    )
    agent = load_config(path).agent
    first, history = agent.stack
    assert isinstance(first, InputGuardrail)
    assert first.name == "pii_redactor"
    assert history.kind == "memory"
    _logging, output = agent.chat_stack
    assert isinstance(output, OutputGuardrail)
    assert (output.name, output.hold_back) == ("pii-out", 80)
    [tool] = agent.tool_stack
    assert isinstance(tool, ToolGuardrail)
    assert tool.name == "no_rm"


def test_a_declared_guardrail_rewrites_the_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[[guardrails]]\nkind = 'output'\ncheck = 'pii_redactor'\n")
    assert main(["run", str(path), "reach me at ann@example.org", "--trace"]) == 0
    out, err = capsys.readouterr()
    assert out == "reach me at [email]\n"
    assert "pii_redactor [guardrail] check" in err
    assert "(held 'reach me at ann@example.org' -> rewritten 'reach me at [email]')" in err


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("kind = 'outpt'\ncheck = 'pii_redactor'", "unknown guardrail kind 'outpt'; known kinds:"),
        ("kind = 'output'", "guardrail kind 'output': option 'check' is required"),
        (
            "kind = 'output'\ncheck = 'profanity'",
            "option 'check' must be a built-in check (pii_redactor) or an import path, "
            "got 'profanity'",
        ),
        (
            "kind = 'input'\ncheck = 'pii_redactor'\nhold_back = 10",
            "guardrail kind 'input': unknown option(s) 'hold_back'",
        ),
        (
            "kind = 'output'\ncheck = 'pii_redactor'\nentities = ['ssn']",
            "guardrail 'output': pii_redactor: unknown entities ['ssn']",
        ),
        (
            "kind = 'output'\ncheck = 'pii_redactor'\nentities = []",
            "guardrail 'output': pii_redactor: no entities: it would redact nothing",
        ),
        (
            "kind = 'output'\ncheck = 'raf:Verdict'\nentities = ['email']",
            "option 'entities' is pii_redactor's, not 'raf:Verdict''s",
        ),
        (
            "kind = 'output'\ncheck = 'nowhere.at.all:check'",
            "check 'nowhere.at.all:check': cannot import 'nowhere.at.all'",
        ),
        ("kind = 'output'\ncheck = 'pii_redactor'\nhold_back = 0", "'hold_back' must be"),
    ],
)
def test_a_wrong_guardrail_is_one_clear_error(tmp_path: Path, entry: str, message: str) -> None:
    path = write(tmp_path, f"[[guardrails]]\n{entry}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"{path}: guardrails[0]")
