"""count_tokens on the OpenAI clients: the model's own encoding, read from files on disk
(bpe-openai's wheel), with no network; approximate for a model raf does not know."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raf import Agent, ChatMessage, OpenAIChatClient, OpenAIResponsesClient, ToolCall, tool
from raf._clients._tokens import encoding_name, text_counter
from raf._sessions.window import client_counter
from raf._values.tokens import approximate_prompt_tokens

# Found, not imported: importing bpe-openai builds its encodings (about 0.4 s of CPU), which
# only the pytest worker that runs these tests needs, not every worker at collection.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bpe_openai") is None, reason="bpe-openai is not installed"
)

Client = type[OpenAIChatClient] | type[OpenAIResponsesClient]
CLIENTS = [OpenAIChatClient, OpenAIResponsesClient]
JAPANESE = "こんにちは、世界。今日はいい天気ですね。"


@tool
def lookup(order: str) -> str:
    """Look an order up."""
    return order


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("gpt-4.1-nano", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5-mini", "o200k_base"),
        ("o1", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("o4-mini", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("llama-3.1-8b", None),
        ("omni", None),
        ("test-model", None),
    ],
)
def test_the_encoding_of_a_model(model: str, encoding: str | None) -> None:
    assert encoding_name(model) == encoding


@pytest.mark.parametrize("cls", CLIENTS)
def test_the_count_is_the_models_encoding_with_the_chat_framing(cls: Client) -> None:
    new = cls("gpt-4o-mini", api_key="sk-test")
    old = cls("gpt-4", api_key="sk-test")
    assert (new.token_encoding, old.token_encoding) == ("o200k_base", "cl100k_base")
    hello = [ChatMessage.user("Hello, world!")]
    # 3 a message, "user" 1, the text 4, 3 to prime the reply: OpenAI's own recipe.
    assert new.count_tokens(hello) == old.count_tokens(hello) == 11
    # The two encodings really differ: o200k_base is the denser on Japanese.
    assert (text_counter("o200k_base")(JAPANESE), text_counter("cl100k_base")(JAPANESE)) == (
        10,
        17,
    )
    japanese = [ChatMessage.user(JAPANESE)]
    assert new.count_tokens(japanese) < old.count_tokens(japanese)


@pytest.mark.parametrize("cls", CLIENTS)
def test_tools_and_tool_calls_are_counted(cls: Client) -> None:
    client = cls("gpt-4o", api_key="sk-test")
    question = [ChatMessage.user("where is it?")]
    assert client.count_tokens(question, [lookup]) > client.count_tokens(question)
    called = ChatMessage.assistant(tool_calls=[ToolCall("1", "lookup", "{}")])
    assert client.count_tokens([*question, called]) > client.count_tokens(question)


@pytest.mark.parametrize("cls", CLIENTS)
def test_an_unknown_model_counts_approximately(cls: Client) -> None:
    client = cls("llama-3.1-8b", api_key="sk-test")
    messages = [ChatMessage.system("Be brief."), ChatMessage.user("Hello, world!")]
    assert client.token_encoding == "approximate"
    assert client.count_tokens(messages, [lookup]) == approximate_prompt_tokens(messages, [lookup])


def test_a_token_window_counts_with_the_agents_client() -> None:
    client = OpenAIChatClient("gpt-4o", api_key="sk-test")
    message = ChatMessage.user(JAPANESE)
    assert client_counter(Agent(client))(message) == client.count_tokens([message])


@pytest.mark.slow
def test_counting_needs_no_network(tmp_path: Path) -> None:
    # A fresh process whose sockets all refuse to connect, and an empty cache folder for
    # tiktoken-style downloads: the encodings come from the installed package's files.
    script = textwrap.dedent(
        """
        import socket

        def refuse(*args, **kwargs):
            raise OSError("no network in this test")

        socket.socket.connect = refuse
        socket.create_connection = refuse
        from raf import ChatMessage, OpenAIChatClient

        for model in ("gpt-4o", "gpt-4"):
            client = OpenAIChatClient(model, api_key="sk-test")
            print(client.token_encoding, client.count_tokens([ChatMessage.user("Hello, world!")]))
        """
    )
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "TIKTOKEN_CACHE_DIR": str(tmp_path),
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["o200k_base 11", "cl100k_base 11"]
