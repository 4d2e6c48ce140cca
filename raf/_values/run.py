"""Run: the one object that holds what a single run needs (its sink, its close, its failures)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, ParamSpec, TypeVar

import anyio
import attrs

from raf._values.messages import AgentResponse, OnUpdate, ToolCall, Update
from raf._values.usage import Usage
from raf.errors import ProviderError, StreamClosedError

__all__ = ["Run"]

#: The key of ``Run.state`` under which a served run keeps its caller's key scope (see
#: :func:`key_scope`): what a key's budget spends, what scopes its long-term memories.
KEY_SCOPE: Final = "raf.serve.key"


def key_scope(api_key: str) -> str:
    """The scope of a served caller's API key: a digest, never the key itself.

    >>> len(key_scope("secret"))
    24
    """
    import hashlib  # here: `import raf` does not import it

    return hashlib.sha256(api_key.encode()).hexdigest()[:24]


P = ParamSpec("P")
T = TypeVar("T")


@attrs.define(eq=False, slots=True)
class Run:
    """What one run needs that no layer owns (ASGI keeps it in the ``scope``): one per run.

    ``agent.run(...)`` and ``agent.stream(...)`` make it, and every
    :class:`raf.Invocation` of the run carries it as ``invocation.run``; a
    caller that must close a streamed run early (a server whose client
    left) makes its own and hands it in as ``on_update``::

        run = raf.Run(send)             # send: the caller's own sink of updates
        ... agent.run(text, on_update=run) ...
        run.close(partial)              # elsewhere, when the client has gone

    It holds:

    - the run's sink of updates (ASGI's ``send``): :meth:`send` passes an
      update to ``sink``, and raises :attr:`closed` once the consumer has
      left; ``Invocation.on_update`` starts as :meth:`send`, and stays the
      per-layer view a middleware may wrap;
    - the run's close: :meth:`close` cancels the core of the run (its tool
      loop, entered through :meth:`core`); the core then raises
      :attr:`closed`, a :class:`raf.StreamClosedError` with the partial
      answer, which every entered provider's post stage sees;
    - :attr:`deferred`, the run's deferred calls: those that wait for a
      person's decision or a client's result, and those this run claimed;
    - :attr:`state`, what middleware keep for this run under keys of their own;
    - :attr:`failures`, the post stages that failed in this run, innermost
      first: the outermost provider layer raises them once the run
      succeeded, or notes them on the run's error; after an early close,
      ``agent.stream`` raises them from its block;
    - for an agent called as another's tool (``agent.as_tool()``), whose run
      it is: :attr:`parent` and :attr:`call`, :attr:`fork` when the child
      starts from the parent's prompt; and for every run, what a child
      needs of it: :attr:`last_call`, and :attr:`called_usage`, the usage
      of its children, which joins the run's own in its response.

    Not frozen, unlike the values around it: it is the run's own mutable
    state (a close arrives from another task, failures arrive as the post
    stages run), shared by every layer's copy of the invocation, so that no
    context variable, exception attribute or global has to carry it. A
    ``Run`` serves one run.
    """

    #: Where the run's updates go (``None``: the run is not streamed).
    sink: OnUpdate | None = None
    #: The post stages that failed in this run, innermost first (each a ProviderError).
    failures: list[ProviderError] = attrs.field(factory=list, init=False)
    #: Set by :meth:`close`: what the core, and every send after it, raise.
    closed: StreamClosedError | None = attrs.field(default=None, init=False)
    #: The run's deferred calls (the tool calls the loop does not run itself: what waits
    #: for a decision or a client, what this run claimed), made by the agent's core when
    #: it first starts; ``None`` before.
    deferred: Any = attrs.field(default=None, init=False)
    #: What middleware keep for this run and no layer owns (ASGI's ``scope["state"]``),
    #: under a key of their own (``"raf.durable.batch"``): a middleware's per-run state
    #: travels here, never in a context variable or a module's table.
    state: dict[str, Any] = attrs.field(factory=dict, init=False, repr=False)
    #: The run whose tool call started this one (an agent called as a tool), else ``None``.
    parent: Run | None = attrs.field(default=None, kw_only=True, repr=False)
    #: The parent's tool call that started this run, else ``None``.
    call: ToolCall | None = attrs.field(default=None, kw_only=True)
    #: A forked run's start: the parent's last model call (a :class:`raf.ChatRequest`),
    #: whose tools and messages every prompt of this run begins with, byte for byte.
    fork: Any = attrs.field(default=None, kw_only=True, repr=False)
    #: The run's last model call as it went to the chat client (a :class:`raf.ChatRequest`),
    #: set by the agent: what a forked child starts from.
    last_call: Any = attrs.field(default=None, init=False, repr=False)
    #: The usage of the model calls of the runs this run's tools started, not yet in a
    #: response (see :meth:`counted`).
    called_usage: Usage | None = attrs.field(default=None, init=False, repr=False)
    _scopes: list[anyio.CancelScope] = attrs.field(factory=list, init=False, repr=False)
    _started: bool = attrs.field(default=False, init=False, repr=False)

    @property
    def streamed(self) -> bool:
        """Whether the run has a sink of updates."""
        return self.sink is not None

    def start(self) -> Run:
        """Claim this object for one run; a second run with it is a ``RuntimeError``."""
        if self._started:
            raise RuntimeError("a raf.Run serves one run: make a new one for each run")
        self._started = True
        return self

    async def send(self, update: Update) -> None:
        """Pass ``update`` to the sink; after an early close, raise :attr:`closed` instead.

        Also raised when the consumer left while the sink had the update:
        nothing more of the run goes out.
        """
        if self.closed is None and self.sink is not None:
            await self.sink(update)
        if self.closed is not None:
            raise self.closed

    @property
    def lineage(self) -> tuple[ToolCall, ...]:
        """The tool calls that started this run and its ancestors, outermost first."""
        calls: list[ToolCall] = []
        run: Run | None = self
        while run is not None and run.call is not None:
            calls.append(run.call)
            run = run.parent
        return tuple(reversed(calls))

    def spend(self, usage: Usage) -> None:
        """Count ``usage``, of one model call of this run, in every ancestor's
        :attr:`called_usage` (a run counts its own calls itself)."""
        run = self.parent
        while run is not None:
            run.called_usage = usage if run.called_usage is None else run.called_usage + usage
            run = run.parent

    def counted(self, response: AgentResponse) -> AgentResponse:
        """``response`` with :attr:`called_usage` added to its usage (then reset: a run
        middleware that calls inward again counts each child once)."""
        spent, self.called_usage = self.called_usage, None
        if spent is None:
            return response
        usage = spent if response.usage is None else response.usage + spent
        return attrs.evolve(response, usage=usage)

    def close(self, partial: AgentResponse) -> None:
        """Close the run early: its consumer left, having received ``partial``. Once only.

        The core is cancelled wherever it is and raises :attr:`closed`; a
        core not entered yet raises it at once; a run already past its core
        is not touched (it completes, and its sends raise).
        """
        if self.closed is None:
            self.closed = StreamClosedError(partial)
            for scope in self._scopes:
                scope.cancel()

    async def core(
        self, function: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``await function(*args, **kwargs)`` as the run's core: in the cancel scope that
        :meth:`close` cancels, the cancellation coming out as :attr:`closed`."""
        if self.closed is None:
            with anyio.CancelScope() as scope:
                self._scopes.append(scope)
                try:
                    result = await function(*args, **kwargs)
                finally:
                    self._scopes.remove(scope)
                if self.closed is None:
                    return result
        # Closed before the core, or meanwhile: what the consumer got is the partial answer.
        closed = self.closed
        assert closed is not None
        raise closed

    def __repr__(self) -> str:
        state = "closed" if self.closed is not None else "streamed" if self.streamed else "plain"
        return f"<Run {state} failures={len(self.failures)}>"
