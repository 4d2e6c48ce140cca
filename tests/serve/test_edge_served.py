"""The browser rules of the serving edge over a real uvicorn process (issue 32)."""

from __future__ import annotations

import httpx2 as httpx
import pytest

from tests._harness.uvicorn_server import ServedAgent

pytestmark = pytest.mark.slow
CHAT = {"model": "word-agent", "messages": [{"role": "user", "content": "hi"}]}


def test_another_sites_page_and_a_rebinding_host_are_refused() -> None:
    with ServedAgent() as served:
        url = f"{served.url}/v1/chat/completions"
        assert httpx.post(url, json=CHAT).status_code == 200
        rebound = httpx.post(url, json=CHAT, headers={"host": "attacker.example"})
        assert rebound.status_code == 400
        other = httpx.post(url, json=CHAT, headers={"origin": "https://attacker.example"})
        assert other.status_code == 403
        simple = httpx.post(
            url, content=b'{"model": "word-agent"}', headers={"content-type": "text/plain"}
        )
        assert simple.status_code == 415
        for reply in (rebound, other, simple):
            assert reply.json()["error"]["request_id"] == reply.headers["x-request-id"]
        page = httpx.get(served.url)
        assert page.headers["content-security-policy"] == "frame-ancestors 'none'"
