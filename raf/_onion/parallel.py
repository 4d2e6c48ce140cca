"""Provider groups: providers whose pre stages run concurrently, merged in declaration order.

A group is one layer of the run stack (:meth:`ProviderGroup.build_layer`): its
members' pre stages run in one task group, their results merge in declaration
order, and their post stages run on the way out, last declared first, through
the same functions as a single provider's layer (:mod:`raf._onion.compose`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import anyio
import attrs

from raf._onion.compose import CompleteInvocation, Entered, around, run_post_stages, stages_of
from raf._onion.errors import (
    merged,
    note,
    provider_name,
    raise_failures,
    stage_error,
    validate_stages,
)
from raf._onion.observe import PostStage, PreStage
from raf._values.context import Invocation
from raf._values.messages import AgentResponse
from raf.errors import ProviderError

__all__ = ["ProviderGroup", "parallel"]


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

    def build_layer(
        self,
        call_next: CompleteInvocation,
        *,
        where: str,
        post_timeout: float,
        observers: Sequence[Any] = (),
    ) -> CompleteInvocation:
        """The group as one layer: concurrent pre stages, then post stages last-first."""
        for number, member in enumerate(self.members):
            validate_stages(member, f"{where} ({self.name}) member {number}")
        members = tuple((member, *stages_of(member, observers)) for member in self.members)

        async def layer(invocation: Invocation) -> AgentResponse:
            entered: Entered = []
            try:
                inner = await _group_pre(members, invocation, entered)
            except BaseException as error:
                await run_post_stages(entered, invocation, None, error, post_timeout)
                raise
            return await around(call_next, inner, invocation, entered, post_timeout)

        return layer


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


async def _group_pre(
    members: tuple[tuple[Any, PreStage, PostStage | None], ...],
    invocation: Invocation,
    entered: Entered,
) -> Invocation:
    """The members' pre stages in one task group; the merged invocation, in declaration order.

    The first member that fails cancels the others and its ProviderError is
    raised (a BaseException that is not an Exception is raised unchanged,
    never in an exception group). Every member whose pre stage returned a
    valid result is put in ``entered`` all the same, so it gets its post
    stage with the error.
    """
    args = (
        invocation.agent,
        invocation.session,
        invocation.request_messages,
        invocation.options,
    )
    outcomes: list[Any] = [_NOT_RETURNED] * len(members)
    failures: list[ProviderError] = []
    fatal: list[BaseException] = []  # a BaseException that is neither an Exception nor a cancel

    async def run(
        index: int, provider: Any, on_invoking: PreStage, scope: anyio.CancelScope
    ) -> None:
        try:
            outcomes[index] = await on_invoking(*args)
        except Exception as exc:
            failure = stage_error(provider, "on_invoking", exc)
            failure.__cause__ = exc
            failures.append(failure)
            scope.cancel()
        except BaseException as exc:
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
            fatal.append(exc)  # kept out of the task group, which would wrap it in a group
            scope.cancel()

    def settle() -> Invocation:
        # Whatever ended the group, every member that returned is merged or failed here.
        into = invocation
        for (provider, _, on_invoked), outcome in zip(members, outcomes, strict=True):
            if outcome is _NOT_RETURNED:
                continue
            try:
                into = merged(provider_name(provider), into, outcome)
            except ProviderError as failure:
                failures.append(failure)
                continue
            if on_invoked is not None:
                entered.append((provider, on_invoked))
        return into

    try:
        async with anyio.create_task_group() as group:
            for index, (provider, on_invoking, _) in enumerate(members):
                group.start_soon(run, index, provider, on_invoking, group.cancel_scope)
    except BaseException as error:  # cancelled from outside: what failed meanwhile is not lost
        settle()
        if fatal:
            raise fatal[0]  # noqa: B904  (a BaseException beats the cancellation, unchanged)
        for failure in failures:
            note(error, failure, "in the cancelled group")
        raise
    into = settle()
    if fatal:
        raise fatal[0]
    if failures:
        raise_failures(failures, "in the same group")
    return into


_NOT_RETURNED: Any = object()
