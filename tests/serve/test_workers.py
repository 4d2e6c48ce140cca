"""Served agents in real processes on one real Redis: any worker serves any turn; SIGTERM drains."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import uuid
from pathlib import Path

import anyio
import httpx2 as httpx
import pytest

from raf import RedisSessionStore
from tests._harness.openai_server import OpenAIServer, Reply, text_stream
from tests._harness.redis_server import RedisServer
from tests._harness.tls import TLS
from tests._harness.uvicorn_server import ServedAgent, started

pytestmark = pytest.mark.slow


def turn(url: str, text: str, session: str) -> str:
    reply = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "word-agent", "messages": [{"role": "user", "content": text}]},
        headers={"X-Session-Id": session},
        timeout=10,
        verify=TLS,
    )
    assert reply.status_code == 200, reply.text
    content: str = reply.json()["choices"][0]["message"]["content"]
    return content


def test_two_servers_on_one_redis_serve_any_turn_of_a_conversation(
    redis_server: RedisServer,
) -> None:
    session = uuid.uuid4().hex
    with started(ServedAgent(db=redis_server.url), ServedAgent(db=redis_server.url)) as (one, two):
        answers = [turn(server.url, f"turn{i}", session) for i, server in enumerate([one, two] * 2)]
    # Each turn saw every turn before it, whichever process served it.
    assert answers == [f"seen {1 + 2 * i}: turn{i} " for i in range(4)]


def test_raf_serve_with_workers_drains_a_stream_on_sigterm(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAF_TEST_KEY", "unused")
    # The upstream model: a scripted OpenAI server on loopback, the long answer 10 ms a word.
    upstream = OpenAIServer()
    upstream.answer(content="hi back")
    long = text_stream(*[f"w{i} " for i in range(200)])
    upstream.reply(Reply(events=long, pause=0.01))
    config = tmp_path / "relay.toml"
    config.write_text(
        '[agent]\nname = "word-agent"\n'
        f'[model]\nclient = "openai"\nmodel = "m"\nbase_url = "{upstream.base_url}"\n'
        'api_key_env = "RAF_TEST_KEY"\n'
        '[[providers]]\nkind = "memory"\npersist_partial = true\n'
    )
    command = [sys.executable, "-m", "raf", "serve", str(config), "--workers", "2"]
    served = ServedAgent(command=[*command, "--db", redis_server.url, "--grace", "20"])
    with contextlib.closing(upstream), served:
        session = uuid.uuid4().hex
        assert turn(served.url, "hello", session) == "hi back"
        body = {
            "model": "word-agent",
            "stream": True,
            "messages": [{"role": "user", "content": "long"}],
        }
        words: list[str] = []
        done = signalled = False
        with httpx.stream(
            "POST", f"{served.url}/v1/chat/completions", json=body,
            headers={"X-Session-Id": session}, timeout=60, verify=TLS,
        ) as stream:  # fmt: skip
            for line in stream.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    if chunk["choices"]:
                        words += (chunk["choices"][0]["delta"].get("content") or "").split()
                if len(words) >= 10 and not signalled:
                    assert served.process is not None
                    served.process.send_signal(signal.SIGTERM)  # mid-stream, once
                    signalled = True
        assert served.process is not None
        status = served.process.wait(60)
        # The stream in flight finished: all 200 words, then [DONE]; then the server ended.
        assert done
        assert words == [f"w{i}" for i in range(200)]
        assert status == 0, served.log()

    async def stored() -> list[str]:
        async with RedisSessionStore(redis_server.url) as store:
            messages = await (await store.get(session)).get_messages()
        return [f"{m.role}: {m.content}" for m in messages]

    # What it stored is there for any other process: the turn drained whole.
    history = anyio.run(stored)
    assert history[:2] == ["user: hello", "assistant: hi back"]
    assert history[2:] == ["user: long", "assistant: " + " ".join(words) + " "]
