"""``raf chat`` says what each turn cost, on stderr, when its model's price is known;
``raf run --trace=context`` shows the ledger in money."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._harness.cli import run_raf
from tests._harness.openai_server import OpenAIServer, Reply, completion, text_stream

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent.toml"


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpenAIServer]:
    monkeypatch.setenv("RAF_TEST_KEY", "sk-test")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    server = OpenAIServer()
    yield server
    server.close()


def config(tmp_path: Path, server: OpenAIServer, model: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(
        f"[agent]\ninstructions = 'Be brief.'\n\n[model]\nclient = 'openai'\nmodel = '{model}'\n"
        f"base_url = '{server.base_url}'\napi_key_env = 'RAF_TEST_KEY'\n"
    )
    return path


def test_chat_says_what_each_turn_cost(
    tmp_path: Path,
    server: OpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server.reply(Reply(events=text_stream("Hello", usage=(1000, 200))))
    server.reply(Reply(events=text_stream("Again", usage=(2000, 100))))
    lines = iter(["hi", "more", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert run_raf(["chat", str(config(tmp_path, server, "gpt-4o-mini"))]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello\nAgain\n"
    # gpt-4o-mini: $0.15 in, $0.60 out per million tokens.
    assert "(1 model call: 1000 in, 200 out, $0.000270)" in err
    assert "(1 model call: 2000 in, 100 out, $0.000360)" in err


def test_chat_says_nothing_of_money_for_a_model_of_no_known_price(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = iter(["hi", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert run_raf(["chat", str(EXAMPLE)]) == 0
    assert "$" not in capsys.readouterr().err


def test_trace_context_shows_the_ledger_in_money(
    tmp_path: Path, server: OpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.answer(completion("Hello", usage=(1000, 200)))
    path = config(tmp_path, server, "gpt-4o-mini")
    assert run_raf(["run", str(path), "hi", "--trace=context"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].split()[-1] == "cost"
    assert err[1].split()[-1] == "$0.000270"
    assert "cost by layer (1 priced calls; gpt-4o-mini):" in err


SPEND = """
[[chat_stack]]
kind = "spend_limits"
store = "{store}"
budgets = [{{usd = "0.00027", per = "day", scope = "agent"}}]

[[chat_stack]]
kind = "usage_limits"
max_requests = 1
"""


@pytest.mark.parametrize("where", ["sqlite", "redis"])
def test_declared_spend_limits_count_in_their_store_and_refuse_the_call_with_no_room(
    tmp_path: Path,
    server: OpenAIServer,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    # A Redis store must be opened before the first call: raf run opens the chat stack's
    # stores with the providers' resources (it was refused at the first call before).
    store = "spend.db" if where == "sqlite" else request.getfixturevalue("redis_server").url
    path = config(tmp_path, server, "gpt-4o-mini")
    path.write_text(path.read_text() + SPEND.format(store=store))
    server.answer(completion("Hello", usage=(1000, 200)))  # $0.000270: the whole budget
    assert run_raf(["run", str(path), "hi"]) == 0
    capsys.readouterr()
    assert run_raf(["run", str(path), "hi again"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raf: budget $0.00027 per day of everyone is spent"), err
    assert len(server.requests) == 1  # the second call was never sent
    if where == "sqlite":  # the path starts at the config's folder
        with sqlite3.connect(tmp_path / "spend.db") as db:
            [(spent,)] = db.execute("SELECT spent FROM raf_spend").fetchall()
        assert spent == 270_000  # nano-dollars
