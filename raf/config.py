"""Context providers as data: declarations, the registry of provider kinds, the builders.

``build_providers(load_provider_decls(toml))`` turns the ``[[providers]]`` of a file into
a stack; ``register_provider_kind`` adds a kind of your own beside the built-in ones.
"""

from raf._config.declarations import (
    PROVIDER_KINDS,
    ContextProviderDecl,
    ProviderOptions,
    build_provider,
    build_providers,
    load_provider_decls,
    register_provider_kind,
)
from raf._public import say_home as _say_home

__all__ = [
    "ContextProviderDecl",
    "PROVIDER_KINDS",
    "ProviderOptions",
    "build_provider",
    "build_providers",
    "load_provider_decls",
    "register_provider_kind",
]

_say_home(__name__, (globals()[name] for name in __all__))
