"""The registry of chat clients: the config, its schema and OpenTelemetry agree with it."""

from __future__ import annotations

from pathlib import Path

import pytest

import raf.otel
from raf import EchoChatClient, OpenAIChatClient, ScriptedChatClient
from raf._clients.registry import CLIENTS, ClientKind, client_kind
from raf._config.file import load_agent
from raf._config.models import config_schema
from raf.errors import ConfigError


def _config(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(f'[model]\nclient = "{name}"\nmodel = "m-1"\n')
    return path


@pytest.mark.parametrize("kind", list(CLIENTS.values()), ids=list(CLIENTS))
def test_the_config_builds_each_client_otel_names_it_as_the_registry_says(
    kind: ClientKind, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in kind.key_env:
        monkeypatch.setenv(variable, "k-test")
    client = load_agent(_config(tmp_path, kind.name)).chat_client
    assert raf.otel.gen_ai_provider_name(client) == kind.provider_name
    # raf's clients also say it themselves (the read-only provider_name): the same name.
    assert getattr(client, "provider_name", kind.provider_name) == kind.provider_name
    if isinstance(kind.build, type):
        assert type(client) is kind.build
        assert client_kind(client) is kind


def test_a_key_of_each_client_is_asked_for_by_the_registrys_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kind in CLIENTS.values():
        for variable in kind.key_env:
            monkeypatch.delenv(variable, raising=False)
        if kind.offline:
            continue
        with pytest.raises(ConfigError, match=f"needs {' or '.join(kind.key_env)} set"):
            load_agent(_config(tmp_path, kind.name))


def test_the_schema_offers_the_registrys_clients() -> None:
    client = config_schema()["$defs"]["ModelTable"]["properties"]["client"]
    assert client["enum"] == list(CLIENTS)
    assert client["default"] == "echo"


def test_a_client_the_registry_does_not_know_is_refused_naming_those_it_knows(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_agent(_config(tmp_path, "mistral"))
    assert str(caught.value).endswith(
        " or ".join(f'"{name}"' for name in CLIENTS) + ", got 'mistral'"
    )


def test_client_kind_is_by_exact_class() -> None:
    assert client_kind(EchoChatClient()) is CLIENTS["echo"]
    assert client_kind(ScriptedChatClient()) is None

    class Azure(OpenAIChatClient):
        provider_name = "azure.ai.openai"  # type: ignore[misc]  # a subclass says its own

    azure = Azure("m", api_key="k")
    assert client_kind(azure) is None
    assert raf.otel.gen_ai_provider_name(azure) == "azure.ai.openai"
