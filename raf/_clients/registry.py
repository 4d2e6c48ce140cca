"""The registry of chat clients: what ``[model] client = NAME`` builds, one line per vendor.

The config's client selection, the JSON Schema of the config file and
OpenTelemetry's ``gen_ai.provider.name`` all read :data:`CLIENTS`; a new
vendor is its module and one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from raf._clients.anthropic import AnthropicChatClient
from raf._clients.echo import EchoChatClient
from raf._clients.openai import OpenAIChatClient
from raf._clients.responses import OpenAIResponsesClient
from raf._values.client import ChatClient

__all__: list[str] = []


@attrs.frozen
class ClientKind:
    """A chat client a config file can name: how it is built, and what it is called.

    ``build`` is the client's class, or a function that builds one (with the
    class's arguments): ``build(model, base_url=..., api_key=..., timeout=...,
    idle_timeout=...)``; an offline client (no ``key_env``) is built with no
    argument and needs no model.
    """

    #: The config's name of it: ``[model] client = "openai"``.
    name: str
    #: The client's class, or a function that builds one.
    build: Callable[..., ChatClient]
    #: The vendor, as OpenTelemetry's GenAI conventions name it (``gen_ai.provider.name``).
    provider_name: str
    #: The environment variables that may hold its API key (the first one set); none for an
    #: offline client.
    key_env: tuple[str, ...] = ()

    @property
    def offline(self) -> bool:
        """Whether it runs without a model, a key or the network (``"echo"``)."""
        return not self.key_env


def _gemini(model: str, **keywords: Any) -> ChatClient:
    # Imported here: its module imports google-genai, the optional extra raf-agents[gemini].
    try:
        from raf._clients.gemini import GeminiChatClient
    except ImportError as exc:
        raise ValueError(
            f'client = "gemini" needs the google-genai SDK: pip install "raf-agents[gemini]" '
            f"({exc})"
        ) from exc
    return GeminiChatClient(model, **keywords)


def _registry(*kinds: ClientKind) -> Mapping[str, ClientKind]:
    return MappingProxyType({kind.name: kind for kind in kinds})


#: Every chat client a config file can name, by its name.
CLIENTS: Final = _registry(
    ClientKind("echo", EchoChatClient, "echo"),
    ClientKind("openai", OpenAIChatClient, "openai", ("OPENAI_API_KEY",)),
    ClientKind("openai-responses", OpenAIResponsesClient, "openai", ("OPENAI_API_KEY",)),
    ClientKind("anthropic", AnthropicChatClient, "anthropic", ("ANTHROPIC_API_KEY",)),
    ClientKind("gemini", _gemini, "gcp.gemini", ("GEMINI_API_KEY", "GOOGLE_API_KEY")),
)

#: The kinds whose ``build`` is the client's class, by that class.
_BY_CLASS: Final = MappingProxyType(
    {kind.build: kind for kind in CLIENTS.values() if isinstance(kind.build, type)}
)


def client_kind(client: object) -> ClientKind | None:
    """The registry's kind of ``client``, by its exact class (a subclass is its own)."""
    return _BY_CLASS.get(type(client))
