"""``raf serve --mcp --a2a``: the command's agent also served as an MCP server and over A2A
(a real uvicorn process)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx2 as httpx
import pytest

from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent

pytestmark = pytest.mark.slow


def test_the_flags_serve_mcp_and_a2a(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nname = "word-agent"\n[model]\nclient = "echo"\n')
    command = [sys.executable, "-m", "raf", "serve", str(config), "--mcp", "--a2a"]
    with ServedAgent(command=command) as served:
        card = httpx.get(f"{served.url}/.well-known/agent-card.json", verify=TLS).json()
        listed = httpx.post(
            f"{served.url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={"accept": "application/json, text/event-stream"},
            verify=TLS,
        )
    assert card["name"] == "word-agent"
    assert card["supportedInterfaces"][0]["url"] == f"{served.url}/a2a"
    assert listed.status_code == 200
    assert '"name":"word-agent"' in listed.text


def test_public_url_is_the_address_the_card_names(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nname = "word-agent"\n[model]\nclient = "echo"\n')
    command = [sys.executable, "-m", "raf", "serve", str(config), "--a2a"]
    public = ["--public-url", "https://agents.example.com/team"]
    with ServedAgent(command=[*command, *public]) as served:
        card = httpx.get(f"{served.url}/.well-known/agent-card.json", verify=TLS).json()
    assert card["supportedInterfaces"][0]["url"] == "https://agents.example.com/team/a2a"


def test_without_the_flags_neither_is_served(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nname = "word-agent"\n[model]\nclient = "echo"\n')
    with ServedAgent(command=[sys.executable, "-m", "raf", "serve", str(config)]) as served:
        card = httpx.get(f"{served.url}/.well-known/agent-card.json", verify=TLS)
        mcp = httpx.post(f"{served.url}/mcp", json={}, verify=TLS)
    assert (card.status_code, mcp.status_code) == (404, 404)
