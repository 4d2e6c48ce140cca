"""Agent: builds the run, chat and tool stacks once, and runs a turn through them."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from functools import partial
from itertools import chain
from typing import Any, cast

import anyio
import attrs

from raf._agent.arguments import (
    checked_tools,
    decisions_of,
    middleware_only,
    run_arguments,
    stack_keeps_history,
    with_history,
)
from raf._agent.as_tool import AgentTool, agent_tool
from raf._agent.deferred import RunDeferred, wants_approval
from raf._agent.fork import forked_prompt
from raf._agent.offers import answered_tools, offering, with_offered
from raf._agent.output import output_spec, structured_loop
from raf._agent.repair import Repairs
from raf._agent.streamed import stream_model
from raf._agent.streaming import AgentStream
from raf._agent.tool_loop import ToolStack, index_tools, invoke_tool, run_tool_loop
from raf._onion.compose import CallNext, compose, is_provider
from raf._onion.observe import checked_observers, hooks
from raf._values.client import ChatClient
from raf._values.context import ChatRequest, Invocation, ToolRequest, start_invocation
from raf._values.decision import Decision
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate
from raf._values.options import AgentRunOptions, ChatOptions
from raf._values.protocols import Session, Tool
from raf._values.run import Run
from raf.errors import ApprovalError

__all__ = ["Agent"]


@attrs.frozen(init=False, eq=False, repr=False)
class Agent:
    """An agent: a chat client, instructions, tools and the context stack.

    ``stack`` holds context providers and run middleware, outermost first;
    ``chat_stack`` holds middleware around every single model call (retry,
    logging); ``tool_stack`` holds middleware around every single tool call,
    ``async (request: ToolRequest, call_next) -> ChatMessage`` (approve or
    refuse, time out, retry, log). ``observers`` watch every run: their
    hooks wrap the run, each provider stage, model call and tool call (see
    :class:`raf.observe.Observer`). The three onions are built here, once, so an
    agent is read-only: :meth:`replace` makes a changed copy.

    A session keeps whatever a history provider gives it, and nothing on
    its own: ``history=True`` puts a :class:`raf.HistoryProvider` outermost
    in the stack, so ``agent.run(text, session=session)`` remembers the
    conversation.

    >>> import anyio
    >>> from raf import EchoChatClient
    >>> agent = Agent(EchoChatClient(), instructions="Be brief.")
    >>> anyio.run(agent.run, "hello").text
    'hello'
    """

    #: The model the agent calls.
    chat_client: ChatClient
    #: The agent's name, if it was given one.
    name: str | None
    #: The agent's own instructions: the first lines of the system message.
    instructions: str | None
    #: The agent's own tools; providers may add more per run.
    tools: tuple[Tool, ...]
    #: The run stack: providers, groups and run middleware, outermost first.
    stack: tuple[Any, ...]
    #: The middleware around each model call, outermost first.
    chat_stack: tuple[Any, ...]
    #: The middleware around each tool call, outermost first.
    tool_stack: tuple[Any, ...]
    #: How long each post stage of a cancelled run may take, in seconds.
    post_timeout: float
    #: The observers that watch every run (see :class:`raf.observe.Observer`), outermost first.
    observers: tuple[Any, ...]
    _history: Any  # the provider that history=True put outermost, or None
    _default_model: str | None  # the client's own model: what a run that names none uses
    _tool_index: Mapping[str, Tool]
    _keeps_history: bool
    _run: CallNext[Invocation]
    _chat: CallNext[ChatRequest]
    _tool_call: ToolStack
    _offering: tuple[Any, ...]  # the tool-stack items that offer tools of their own
    _repairs: Repairs  # the transcript repair of its model calls, the last step before each

    def __init__(
        self,
        chat_client: ChatClient,
        *,
        name: str | None = None,
        instructions: str | None = None,
        tools: Iterable[Tool] = (),
        stack: Sequence[Any] = (),
        chat_stack: Sequence[Any] = (),
        tool_stack: Sequence[Any] = (),
        post_timeout: float = 10.0,
        history: bool = False,
        observers: Iterable[Any] = (),
    ) -> None:
        self._build(
            chat_client,
            name=name,
            instructions=instructions,
            tools=tools,
            stack=stack,
            chat_stack=chat_stack,
            tool_stack=tool_stack,
            post_timeout=post_timeout,
            history=history,
            observers=observers,
        )

    def replace(self, **changes: Any) -> Agent:
        """A copy of the agent with the constructor arguments ``changes`` changed.

        Every other argument of :class:`Agent` is carried over as this agent
        was made with it (the list is the constructor's own, so none is ever
        left behind); an argument the constructor does not take is a
        ``TypeError`` naming it. An agent made with ``history=True`` keeps its
        history provider, outermost, whatever else changes, unless
        ``history=False`` is among the changes; ``stack=`` is then the stack
        behind it, as in the constructor.

        >>> from raf import EchoChatClient
        >>> agent = Agent(EchoChatClient(), name="a", instructions="Be brief.")
        >>> copy = agent.replace(name="b")
        >>> (copy.name, copy.instructions)
        ('b', 'Be brief.')
        """
        unknown = [name for name in changes if name not in _arguments()]
        if unknown:
            raise TypeError(
                f"Agent.replace() got argument(s) the constructor does not take: "
                f"{', '.join(map(repr, unknown))} (it takes {', '.join(_arguments())})"
            )
        arguments = {name: self._argument(name) for name in _arguments()}
        arguments.update(changes)
        copy = object.__new__(Agent)
        # The history provider this agent added is the copy's too: the same one, not a second.
        copy._build(**arguments, kept_history=self._history)
        return copy

    def _argument(self, name: str) -> Any:
        """The constructor argument ``name`` as this agent was made with it."""
        if name == "history":
            return self._history is not None
        if name == "stack" and self._history is not None:
            return self.stack[1:]  # behind the provider that history=True put outermost
        return getattr(self, name)

    def _build(
        self,
        chat_client: ChatClient,
        *,
        name: str | None,
        instructions: str | None,
        tools: Iterable[Tool],
        stack: Sequence[Any],
        chat_stack: Sequence[Any],
        tool_stack: Sequence[Any],
        post_timeout: float,
        history: bool,
        observers: Iterable[Any],
        kept_history: Any = None,
    ) -> None:
        # kept_history: the provider history=True added to the agent replace() copies.
        if not callable(getattr(chat_client, "complete", None)):
            raise TypeError(f"chat_client must have an async complete() method: {chat_client!r}")
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(
                f"instructions must be a str or None, got {type(instructions).__name__}"
            )
        if not post_timeout > 0:
            raise ValueError(f"post_timeout must be positive, got {post_timeout!r}")
        if isinstance(stack, (str, bytes)) or not isinstance(stack, Sequence):
            raise TypeError(f"stack must be a list of providers and middleware, got {stack!r}")
        checked = checked_tools(tools)
        run_stack = with_history(stack) if history else tuple(stack)
        if history and kept_history is not None:
            run_stack = (kept_history, *run_stack[1:])
        keeps = stack_keeps_history(run_stack)
        for tool in () if keeps else checked:
            if wants_approval(tool):
                raise ApprovalError(
                    f"tool {tool.name!r} needs approval, but the agent keeps no history: "
                    "add a raf.HistoryProvider to its stack (Agent(history=True)), where a "
                    "paused call waits"
                )
        chats = middleware_only(chat_stack, "chat_stack")
        tool_calls = middleware_only(tool_stack, "tool_stack")
        offerers = offering(tool_calls)
        answered = answered_tools(offerers)
        watching = checked_observers(observers)
        default_model = getattr(chat_client, "model", None)
        # The observers' hooks are the outermost layers (model_attempt the innermost chat
        # middleware); without observers, the stacks are exactly the ones given.
        run = compose(self._core, run_stack, post_timeout=post_timeout, observers=watching)
        chat = (*hooks(watching, "model_call"), *chats, *hooks(watching, "model_attempt"))
        # compose is typed for the run and chat stacks (AgentResponse out); the tool stack
        # is the same onion with a ChatMessage out.
        tool_core = cast("CallNext[ToolRequest]", invoke_tool)
        self.__attrs_init__(
            chat_client,
            name,
            instructions or None,
            checked,
            run_stack,
            chats,
            tool_calls,
            post_timeout,
            watching,
            run_stack[0] if history else None,
            default_model if isinstance(default_model, str) else None,
            index_tools(
                (*checked, *answered), ("the agent",) * len(checked), source="the tool stack"
            ),
            keeps,
            compose(run, hooks(watching, "run")),
            compose(self._call_model, chat),
            cast("ToolStack", compose(tool_core, (*hooks(watching, "tool_call"), *tool_calls))),
            offerers,
            Repairs(),
        )

    @property
    def providers(self) -> tuple[Any, ...]:
        """The context providers of the stack, outermost first."""
        return tuple(item for item in self.stack if is_provider(item))

    async def run(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage] | Decision | Sequence[Decision],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
        on_update: OnUpdate | Run | None = None,
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> AgentResponse:
        """Run one turn: the stack, the model and its tool calls, and back out.

        ``messages`` is a user message as ``str``, one ``ChatMessage`` or a
        sequence of them. ``session=None`` uses a fresh
        :class:`raf.InMemorySession`. ``on_update``, an
        ``async (Update) -> None``, streams the run: every update is awaited
        in the caller's task as it comes (see :meth:`stream` for the iterator
        form); the response is the same as without it. A caller that must
        close the run early (its client left) hands in its own
        :class:`raf.Run` instead, ``on_update=raf.Run(send)``, and calls its
        ``close``; otherwise the run makes its own (``invocation.run``).

        ``output_type`` (a pydantic model, a dataclass, a ``TypedDict``, a
        plain type) asks for structured output: the final answer is
        validated into ``response.output``, and one that does not validate is
        told to the model and asked again up to ``output_retries`` times
        (default 1), then :class:`raf.errors.OutputValidationError`. Both set the
        run's :class:`AgentRunOptions` fields of the same names.
        ``messages`` may instead be a :class:`raf.Decision`, or a sequence
        of them: the run resumes the tool calls that wait for approval in
        ``session`` (see ``docs/approvals.md``).
        """
        request, session, options, decisions = self._arguments(
            messages, session, options, output_type, output_retries
        )
        run = run_of(on_update)
        touched = await session.touch_request_hash(request)
        invocation = start_invocation(
            self, session, request, options, touched.digest, touched.repeated, run, decisions
        )
        return await self._run(invocation)

    def stream(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage] | Decision | Sequence[Decision],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> AgentStream:
        """Run one turn streamed, as an async context manager to iterate.

        ``async with agent.stream("hi") as stream: async for update in
        stream: ...``; then ``stream.response`` is the :class:`AgentResponse`
        (``None`` if the run did not complete), its ``output`` the validated
        value when ``output_type`` is given. Leaving the block early
        closes the run: its post stages see :class:`raf.StreamClosedError`.
        The arguments are those of :meth:`run`, checked here.
        """
        request, checked_session, checked_options, decisions = self._arguments(
            messages, session, options, output_type, output_retries
        )

        async def start(run: Run) -> Invocation:
            touched = await checked_session.touch_request_hash(request)
            return start_invocation(
                self,
                checked_session,
                request,
                checked_options,
                touched.digest,
                touched.repeated,
                run.start(),
                decisions,
            )

        return AgentStream(start, self._run)

    def _arguments(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage] | Decision | Sequence[Decision],
        session: Session | None,
        options: AgentRunOptions | None,
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> tuple[tuple[ChatMessage, ...], Session, AgentRunOptions, tuple[Decision, ...]]:
        decisions = decisions_of(messages)
        if decisions:
            if not self._keeps_history:
                raise ApprovalError(
                    "a Decision resumes calls that wait in the session's history, but this "
                    "agent keeps no history: add a raf.HistoryProvider (Agent(history=True))",
                    tokens=tuple(d.token for d in decisions),  # none can match a waiting call
                )
            if session is None:
                raise ApprovalError(
                    "a Decision needs the session its calls wait in: "
                    "agent.run(decision, session=session)"
                )
            return (*run_arguments((), session, options, output_type, output_retries), decisions)
        checked = run_arguments(
            cast("Any", messages), session, options, output_type, output_retries
        )
        return (*checked, ())

    def run_sync(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
        backend: str = "asyncio",
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> AgentResponse:
        """:meth:`run` from synchronous code (a script, a notebook cell without await).

        Starts an event loop for the one turn, so it cannot be called from
        inside a running one: there, ``await agent.run(...)``.

        >>> from raf import EchoChatClient
        >>> Agent(EchoChatClient()).run_sync("hello").text
        'hello'
        """
        try:
            anyio.get_current_task()
        except RuntimeError:  # no event loop is running here: start one
            pass
        else:
            raise RuntimeError(
                "run_sync() was called inside a running event loop: use 'await agent.run(...)'"
            )
        run = partial(
            self.run,
            messages,
            session=session,
            options=options,
            output_type=output_type,
            output_retries=output_retries,
        )
        return anyio.run(run, backend=backend)

    def as_tool(
        self, *, name: str | None = None, description: str | None = None, context: str = "isolated"
    ) -> AgentTool:
        """This agent as a tool another agent calls: its model writes a task, this agent
        runs it, and its answer is the call's result (see ``docs/multi-agent.md``).

        ``context="isolated"``: the agent sees only the task; ``"forked"``: its
        first prompt is the calling agent's last prompt, byte for byte (so a
        prompt cache serves it), then the task. ``name`` defaults to the
        agent's name; a name that is not a valid tool name or an unknown
        ``context`` is a ``ValueError`` here. The child's usage is part of the
        caller's, its model calls are in the caller's observers (the ledger
        names them by the tool), and a streamed caller gets its updates as
        ``"agent"`` updates tagged with the call.
        """
        return agent_tool(self, name=name, description=description, context=context)

    async def aclose(self) -> None:
        """Close the chat client and every stack item that has ``aclose()``, innermost first."""
        closables = [self.chat_client, *self.tool_stack, *self.chat_stack, *self.stack]
        errors: list[BaseException] = []
        for item in reversed(closables):
            close = getattr(item, "aclose", None)
            if not callable(close):
                continue
            try:
                await close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _core(self, invocation: Invocation) -> AgentResponse:
        """What the model sees, in the order a prompt cache serves it, then the tool loop.

        The system message (the agent's and the stable providers'
        instructions), the history, the tail (the volatile results: their
        instructions as one system message, then their messages), the request.
        """
        instructions = invocation.instructions
        if self.instructions is not None:
            instructions = (self.instructions, *instructions)
        system = (ChatMessage("system", "\n".join(instructions)),) if instructions else ()
        volatile = invocation.tail_instructions
        tail = (ChatMessage("system", "\n".join(volatile)),) if volatile else ()
        history = invocation.messages
        after = (*tail, *invocation.tail_messages, *invocation.request_messages)
        # One copy of a history that may hold 100,000 messages: tuple `+` copies it in C (a
        # third of chain's time; `tuple()` of a tuple is the tuple); with a system message in
        # front, `a + b + c` would copy it twice, chain once.
        messages = tuple(chain(system, history, after)) if system else tuple(history) + after
        options = invocation.options
        tool_index = self._tool_index
        added = invocation.tools + options.tools
        if added:
            sources = (*invocation.tool_sources, *("the run's options",) * len(options.tools))
            tool_index = index_tools(added, sources, tool_index)
        output = options.output_type
        chat_options = ChatOptions.from_run(
            options,
            self.tools + added,
            self._default_model,
            None if output is None or output is str else output_spec(output).schema,
            # A volatile tail ends the stable prefix too: with no history, the system
            # prompt alone (the tail goes to the user turn, not into the system field).
            history_end=len(system) + len(history)
            if history or tail or invocation.tail_messages
            else None,
            session_id=invocation.session.id,
            agent_name=self.name,
        )
        fork = invocation.run.fork
        if fork is not None:  # an agent called as a tool, forked: the parent's prompt first
            messages, chat_options, tool_index = forked_prompt(
                fork, messages, chat_options, tool_index
            )
        loop: Callable[..., Awaitable[AgentResponse]] = run_tool_loop
        if output is not None:
            loop = structured_loop(output, options.output_retries)
        # The run's deferred calls (what waits, what this run claimed): made once per run
        # and held by the run's own object; a run middleware that calls inward again (a
        # retry) meets the same calls, already opened.
        deferred = invocation.run.deferred
        if deferred is None:
            deferred = RunDeferred(
                invocation.session,
                invocation.decisions,
                self.post_timeout,
                keeps=self._keeps_history,
            )
            invocation.run.deferred = deferred
        on_update = invocation.on_update
        call = partial(self._chat_call, on_update, invocation)
        arguments = (call, messages, chat_options, tool_index, options.max_tool_iterations)
        try:
            if on_update is None:
                response = await loop(
                    *arguments, invocation=invocation, tool_stack=self._tool_call, deferred=deferred
                )
            else:
                # The core of a streamed run is what the run's early close cancels.
                response = await invocation.run.core(
                    loop,
                    *arguments,
                    on_update,
                    invocation=invocation,
                    tool_stack=self._tool_call,
                    deferred=deferred,
                )
        except BaseException as exc:
            await deferred.settle(exc)  # the calls this run claimed get their answers stored
            raise
        finally:
            # The last model call's request holds the invocation, which holds the run: let
            # go of it, or every run would leave a cycle for the garbage collector.
            invocation.run.last_call = None
        run = invocation.run
        if run.called_usage is not None:  # the agents it called as tools: their usage too
            response = run.counted(response)
        return response

    def _chat_call(
        self,
        on_update: OnUpdate | None,
        invocation: Invocation,
        messages: Sequence[ChatMessage],
        options: ChatOptions,
    ) -> Awaitable[AgentResponse]:
        if self._offering:  # e.g. read_tool_result, while a cut tool result is in view
            options = with_offered(self._offering, messages, options)
        return self._chat(ChatRequest(messages, options, on_update, invocation=invocation))

    def _call_model(self, request: ChatRequest) -> Awaitable[AgentResponse]:
        # The innermost point of the chat stack: the updates go to the on_update that
        # the chat middleware passed on (maybe wrapped), so they see them. The last step
        # before the client: the transcript repaired, whatever the history holds.
        messages = self._repairs(request.messages)
        run = None if request.invocation is None else request.invocation.run
        if run is not None:
            # As it goes to the client: what a forked agent tool starts from, byte for byte.
            sent = (
                request
                if messages is request.messages
                else attrs.evolve(request, messages=messages)
            )
            run.last_call = sent
        if request.on_update is None:
            return self.chat_client.complete(messages, request.options)
        return stream_model(self.chat_client, messages, request.options, request.on_update, run)

    def __repr__(self) -> str:
        return (
            f"<Agent name={self.name!r} client={type(self.chat_client).__name__} "
            f"stack={len(self.stack)} chat_stack={len(self.chat_stack)}>"
        )


@functools.cache
def _arguments() -> tuple[str, ...]:
    """The names of :class:`Agent`'s constructor arguments: what :meth:`Agent.replace` carries."""
    return tuple(inspect.signature(Agent.__init__).parameters)[1:]


async def enter_resources(agent: Agent, resources: AsyncExitStack) -> None:
    """Open in ``resources`` what ``agent`` holds for a whole command or server: its
    providers and chat middleware that are async context managers (an MCP server, a
    :class:`raf.SpendLimits`' store: a Redis one must be opened before its first call),
    and close its client on the way out."""
    for item in (*agent.providers, *agent.chat_stack):
        if hasattr(item, "__aenter__"):
            await resources.enter_async_context(item)
    if hasattr(agent.chat_client, "aclose"):
        resources.push_async_callback(agent.chat_client.aclose)


def run_of(on_update: OnUpdate | Run | None) -> Run:
    """The run's own :class:`Run`: the caller's (claimed for this run), or a new one around
    the caller's ``on_update``."""
    if isinstance(on_update, Run):
        return on_update.start()
    if on_update is not None and not callable(on_update):
        raise TypeError(
            f"on_update must be an async function of an Update or a raf.Run, got {on_update!r}"
        )
    return Run(on_update).start()
