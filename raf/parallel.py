"""Provider groups: providers whose pre stages run concurrently, merged in declaration order."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

__all__ = ["ProviderGroup", "parallel", "provider_name"]


def provider_name(provider: object) -> str:
    """The provider's ``name`` attribute, or its class name."""
    name = getattr(provider, "name", None)
    return name if isinstance(name, str) and name else type(provider).__name__


@attrs.frozen(slots=True)
class ProviderGroup:
    """Providers that the run stack treats as one step with concurrent pre stages.

    Build one with :func:`parallel`. The provider layer runs the members'
    ``on_invoking`` in one anyio task group and merges their results in
    declaration order, so a group contributes exactly what the same
    providers in sequence would. Every member whose pre stage returned gets
    its post stage, innermost (last declared) first, as in a sequence.
    """

    members: tuple[Any, ...]
    name: str
    kind: ClassVar[str] = "parallel"


def parallel(*providers: Any, name: str | None = None) -> ProviderGroup:
    """A group of providers whose ``on_invoking`` run concurrently; put it in ``Agent(stack=)``.

    Use it for providers that wait on I/O (retrieval, a database, an MCP
    server): three of them with 50 ms each take about 50 ms as a group. If
    one member's pre stage fails, the others are cancelled, the members that
    had returned get their post stage with the error, and the run raises the
    failing member's :class:`raf.ProviderError`.

    >>> from raf import ContextProvider
    >>> class A(ContextProvider): pass
    >>> class B(ContextProvider): pass
    >>> parallel(A(), B()).name
    'parallel(A, B)'
    """
    if not providers:
        raise TypeError("parallel() needs at least one provider")
    for index, provider in enumerate(providers):
        if isinstance(provider, ProviderGroup):
            raise TypeError(
                f"parallel(): member {index} is itself a group ({provider.name}); "
                "list its members in the outer group instead"
            )
        if not callable(getattr(provider, "on_invoking", None)):
            raise TypeError(
                f"parallel(): member {index} is not a context provider (no on_invoking): "
                f"{provider!r}"
            )
    if name is None:
        name = "parallel(" + ", ".join(provider_name(p) for p in providers) + ")"
    return ProviderGroup(tuple(providers), name)
