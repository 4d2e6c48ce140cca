"""Agent: builds the run and chat stacks once, and runs a turn through them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from typing import Any, cast

import anyio
import attrs

from raf._agent.approvals import Decision, RunApprovals, wants_approval
from raf._agent.streamed import stream_model, streamed_core
from raf._agent.streaming import AgentStream
from raf._agent.tool_loop import ToolRequest, ToolStack, index_tools, invoke_tool, run_tool_loop
from raf._agent.tools import Tool
from raf._errors import ApprovalError
from raf._onion.observe import checked_observers, hooks
from raf._onion.parallel import is_provider
from raf._onion.pipeline import CallNext, ChatRequest, compose
from raf._sessions.base import Session
from raf._sessions.memory import InMemorySession
from raf._values.context import Invocation, start_invocation
from raf._values.messages import AgentResponse, ChatClient, ChatMessage, OnUpdate, checked_messages
from raf._values.options import AgentRunOptions, ChatOptions

__all__ = ["Agent"]

_DEFAULT_OPTIONS = AgentRunOptions()


class Agent:
    """An agent: a chat client, instructions, tools and the context stack.

    ``stack`` holds context providers and run middleware, outermost first;
    ``chat_stack`` holds middleware around every single model call (retry,
    logging); ``tool_stack`` holds middleware around every single tool call,
    ``async (request: ToolRequest, call_next) -> ChatMessage`` (approve or
    refuse, time out, retry, log). ``observers`` watch every run: their
    hooks wrap the run, each provider stage, model call and tool call (see
    :class:`raf.Observer`). The three onions are built here, once, so an
    agent is read-only: build another one to change it.

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

    __slots__ = (
        "_chat",
        "_chat_client",
        "_chat_options",
        "_chat_stack",
        "_default_model",
        "_instructions",
        "_keeps_history",
        "_name",
        "_observers",
        "_post_timeout",
        "_run",
        "_stack",
        "_tool_call",
        "_tool_index",
        "_tool_stack",
        "_tools",
    )

    _chat: CallNext[ChatRequest] | None
    _chat_client: ChatClient
    _chat_options: tuple[AgentRunOptions, ChatOptions] | None
    _default_model: str | None
    _chat_stack: tuple[Any, ...]
    _instructions: str | None
    _keeps_history: bool
    _name: str | None
    _observers: tuple[Any, ...]
    _post_timeout: float
    _run: CallNext[Invocation]
    _stack: tuple[Any, ...]
    _tool_call: ToolStack
    _tool_index: dict[str, Tool]
    _tool_stack: tuple[Any, ...]
    _tools: tuple[Tool, ...]

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
        if history:
            stack = _with_history(stack)
        set_ = object.__setattr__
        set_(self, "_chat_client", chat_client)
        # The client's own model, if it says: what a run that names none will use.
        default_model = getattr(chat_client, "model", None)
        set_(self, "_default_model", default_model if isinstance(default_model, str) else None)
        set_(self, "_name", name)
        set_(self, "_instructions", instructions or None)
        set_(self, "_tools", _checked_tools(tools))
        set_(self, "_tool_index", index_tools(self._tools, (), source="the agent"))
        set_(self, "_stack", tuple(stack))
        set_(self, "_keeps_history", _keeps_history(self._stack))
        if not self._keeps_history:
            for tool in self._tools:
                if wants_approval(tool):
                    raise ApprovalError(
                        f"tool {tool.name!r} needs approval, but the agent keeps no history: "
                        "add a raf.HistoryProvider to its stack (Agent(history=True)), where a "
                        "paused call waits"
                    )
        set_(self, "_chat_stack", _middleware_only(chat_stack, "chat_stack"))
        set_(self, "_tool_stack", _middleware_only(tool_stack, "tool_stack"))
        set_(self, "_post_timeout", post_timeout)
        observing = checked_observers(observers)
        set_(self, "_observers", observing)
        # The observers' hooks are the outermost layers (model_attempt the innermost chat
        # middleware); without observers, the stacks are exactly the ones given.
        run = compose(self._core, self._stack, post_timeout=post_timeout, observers=observing)
        set_(self, "_run", compose(run, hooks(observing, "run")))
        chat = (
            *hooks(observing, "model_call"),
            *self._chat_stack,
            *hooks(observing, "model_attempt"),
        )
        set_(self, "_chat", compose(self._call_model, chat) if chat else None)
        # compose is typed for the run and chat stacks (AgentResponse out); the tool stack
        # is the same onion with a ChatMessage out.
        tool_core = cast("CallNext[ToolRequest]", invoke_tool)
        tool_stack = (*hooks(observing, "tool_call"), *self._tool_stack)
        set_(self, "_tool_call", cast("ToolStack", compose(tool_core, tool_stack)))
        # The chat options of the last run that added no tools, by its run options:
        # most runs of an agent share one options object, and so share these.
        set_(self, "_chat_options", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(
            f"Agent is read-only (its stacks are built once): to change {name!r}, build a new Agent"
        )

    @property
    def chat_client(self) -> ChatClient:
        """The model the agent calls."""
        return self._chat_client

    @property
    def name(self) -> str | None:
        """The agent's name, if it was given one."""
        return self._name

    @property
    def instructions(self) -> str | None:
        """The agent's own instructions: the first lines of the system message."""
        return self._instructions

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The agent's own tools; providers may add more per run."""
        return self._tools

    @property
    def stack(self) -> tuple[Any, ...]:
        """The run stack: providers, groups and run middleware, outermost first."""
        return self._stack

    @property
    def chat_stack(self) -> tuple[Any, ...]:
        """The middleware around each model call, outermost first."""
        return self._chat_stack

    @property
    def tool_stack(self) -> tuple[Any, ...]:
        """The middleware around each tool call, outermost first."""
        return self._tool_stack

    @property
    def observers(self) -> tuple[Any, ...]:
        """The observers that watch every run (see :class:`raf.Observer`), outermost first."""
        return self._observers

    @property
    def post_timeout(self) -> float:
        """How long each post stage of a cancelled run may take, in seconds."""
        return self._post_timeout

    @property
    def providers(self) -> tuple[Any, ...]:
        """The context providers of the stack, outermost first."""
        return tuple(item for item in self._stack if is_provider(item))

    async def run(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage] | Decision | Sequence[Decision],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
        on_update: OnUpdate | None = None,
        output_type: Any = None,
        output_retries: int | None = None,
    ) -> AgentResponse:
        """Run one turn: the stack, the model and its tool calls, and back out.

        ``messages`` is a user message as ``str``, one ``ChatMessage`` or a
        sequence of them. ``session=None`` uses a fresh
        :class:`raf.InMemorySession`. ``on_update``, an
        ``async (Update) -> None``, streams the run: every update is awaited
        in the caller's task as it comes (see :meth:`stream` for the iterator
        form); the response is the same as without it.

        ``output_type`` (a pydantic model, a dataclass, a ``TypedDict``, a
        plain type) asks for structured output: the final answer is
        validated into ``response.output``, and one that does not validate is
        told to the model and asked again up to ``output_retries`` times
        (default 1), then :class:`raf.OutputValidationError`. Both set the
        run's :class:`AgentRunOptions` fields of the same names.
        ``messages`` may instead be a :class:`raf.Decision`, or a sequence
        of them: the run resumes the tool calls that wait for approval in
        ``session`` (see ``docs/approvals.md``).
        """
        request, session, options, decisions = self._arguments(
            messages, session, options, output_type, output_retries
        )
        if on_update is not None and not callable(on_update):
            raise TypeError(f"on_update must be an async function of an Update, got {on_update!r}")
        touched = await session.touch_request_hash(request)
        invocation = start_invocation(
            self, session, request, options, touched.digest, touched.repeated, on_update, decisions
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

        async def start(on_update: OnUpdate) -> Invocation:
            touched = await checked_session.touch_request_hash(request)
            return start_invocation(
                self,
                checked_session,
                request,
                checked_options,
                touched.digest,
                touched.repeated,
                on_update,
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
        decisions = _decisions(messages)
        if decisions:
            if not self._keeps_history:
                raise ApprovalError(
                    "a Decision resumes calls that wait in the session's history, but this "
                    "agent keeps no history: add a raf.HistoryProvider (Agent(history=True))"
                )
            if session is None:
                raise ApprovalError(
                    "a Decision needs the session its calls wait in: "
                    "agent.run(decision, session=session)"
                )
            return (*_arguments((), session, options, output_type, output_retries), decisions)
        checked = _arguments(cast("Any", messages), session, options, output_type, output_retries)
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

    async def aclose(self) -> None:
        """Close the chat client and every stack item that has ``aclose()``, innermost first."""
        closables = [self._chat_client, *self._tool_stack, *self._chat_stack, *self._stack]
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
        """What the model sees, then the tool loop."""
        instructions = invocation.instructions
        if self._instructions is not None:
            instructions = (self._instructions, *instructions)
        messages: Sequence[ChatMessage]
        injected = invocation.messages
        if type(injected) is not tuple:
            injected = tuple(injected)
        # `+` of tuples: a history that may hold 100,000 messages is copied once (twice
        # with a system message), where `(*a, *b)` builds a list and then copies that.
        messages = injected + invocation.request_messages
        if instructions:
            messages = (ChatMessage("system", "\n".join(instructions)),) + messages
        options = invocation.options
        if invocation.tools:
            tool_index = index_tools(invocation.tools, invocation.tool_sources, self._tool_index)
            chat_options = ChatOptions.from_run(
                options, self._tools + invocation.tools, self._default_model
            )
        else:
            tool_index = self._tool_index
            cached = self._chat_options
            if cached is not None and cached[0] is options:
                chat_options = cached[1]
            else:
                chat_options = ChatOptions.from_run(options, self._tools, self._default_model)
                object.__setattr__(self, "_chat_options", (options, chat_options))
        on_update = invocation.on_update
        loop: Callable[..., Awaitable[AgentResponse]] = run_tool_loop
        if options.output_type is not None:
            from raf._agent.output import structured_loop  # loaded by the first run that asks

            loop = structured_loop(options.output_type, options.output_retries)
        approvals = (
            RunApprovals(invocation.session, invocation.decisions, self._post_timeout)
            if self._keeps_history
            else None
        )
        if on_update is None:
            return await loop(
                self._chat_call,
                messages,
                chat_options,
                tool_index,
                options.max_tool_iterations,
                invocation=invocation,
                tool_stack=self._tool_call,
                approvals=approvals,
            )
        return await streamed_core(
            loop,
            partial(self._streamed_chat_call, on_update),
            messages,
            chat_options,
            tool_index,
            options.max_tool_iterations,
            on_update,
            invocation=invocation,
            tool_stack=self._tool_call,
            approvals=approvals,
        )

    def _chat_call(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        if self._chat is None:  # no chat middleware: no ChatRequest to build and unpack
            return self._chat_client.complete(messages, options)
        return self._chat(ChatRequest(messages, options))

    def _streamed_chat_call(
        self, on_update: OnUpdate, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> Any:
        if self._chat is None:
            return stream_model(self._chat_client, messages, options, on_update)
        return self._chat(ChatRequest(messages, options, on_update))

    def _call_model(self, request: ChatRequest) -> Any:
        # The innermost point of the chat stack: the updates go to the on_update that
        # the chat middleware passed on (maybe wrapped), so they see them.
        if request.on_update is None:
            return self._chat_client.complete(request.messages, request.options)
        return stream_model(self._chat_client, request.messages, request.options, request.on_update)

    def __repr__(self) -> str:
        return (
            f"<Agent name={self._name!r} client={type(self._chat_client).__name__} "
            f"stack={len(self._stack)} chat_stack={len(self._chat_stack)}>"
        )


def _middleware_only(items: Iterable[Any], where: str) -> tuple[Any, ...]:
    """The chat or tool stack, checked: middleware callables, nothing else."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(f"{where} must be a list of middleware, got {items!r}")
    checked = tuple(items)
    for index, item in enumerate(checked):
        if is_provider(item) or not callable(item) or isinstance(item, type):
            raise TypeError(
                f"{where}[{index}] must be middleware (async (request, call_next)); "
                f"context providers go in stack: {item!r}"
            )
    return checked


def _with_history(stack: Sequence[Any]) -> tuple[Any, ...]:
    """``stack`` with a :class:`raf.HistoryProvider` outermost (``Agent(history=True)``)."""
    from raf._providers.history import HistoryProvider  # the one built-in the core offers

    for index, item in enumerate(stack):
        if getattr(item, "kind", None) == "memory":
            raise TypeError(
                f"history=True adds a history provider, but stack[{index}] is one already "
                f"({item!r}): drop one of the two"
            )
    return (HistoryProvider(), *stack)


def _keeps_history(stack: Sequence[Any]) -> bool:
    """Whether a :class:`raf.HistoryProvider` is in the stack (or one of its groups)."""
    from raf._providers.history import HistoryProvider

    for item in stack:
        if isinstance(item, HistoryProvider):
            return True
        members = getattr(item, "members", None)
        if isinstance(members, tuple) and _keeps_history(members):
            return True
    return False


def _decisions(messages: object) -> tuple[Decision, ...]:
    """The decisions of a run that resumes paused calls; ``()`` for a run of messages."""
    if type(messages) is Decision:
        return (messages,)
    # Only a sequence that starts with a decision is looked through (a long history passed
    # as the input costs nothing here); one that starts with a message is checked, item by
    # item, as messages.
    if (
        isinstance(messages, Sequence)
        and not isinstance(messages, (str, bytes))
        and messages
        and type(messages[0]) is Decision
    ):
        if all(type(item) is Decision for item in messages):
            return tuple(messages)
        raise TypeError(
            "run(messages) takes messages or decisions, not both: send the decisions first, "
            "then the new message"
        )
    return ()


_SESSION_TYPES: set[type] = set()  # session types already checked to have the methods


def _arguments(
    messages: str | ChatMessage | Sequence[ChatMessage],
    session: Session | None,
    options: AgentRunOptions | None,
    output_type: Any = None,
    output_retries: int | None = None,
) -> tuple[tuple[ChatMessage, ...], Session, AgentRunOptions]:
    """A turn's request messages, session and options, checked (``run`` and ``stream``);
    ``output_type`` and ``output_retries``, when given, go into the options."""
    request = _request_messages(messages)
    if session is None:
        session = InMemorySession()
    elif type(session) not in _SESSION_TYPES:
        _check_session(session)
    if options is None:
        options = _DEFAULT_OPTIONS
    elif type(options) is not AgentRunOptions:
        raise TypeError(f"options must be AgentRunOptions, got {type(options).__name__}")
    if output_type is not None or output_retries is not None:
        changes: dict[str, Any] = {}
        if output_type is not None:
            changes["output_type"] = output_type
        if output_retries is not None:
            changes["output_retries"] = output_retries
        options = attrs.evolve(options, **changes)
    return request, session, options


def _check_session(session: object) -> None:
    missing = [
        name
        for name in ("get_messages", "add_messages", "touch_request_hash", "request_hashes")
        if not callable(getattr(session, name, None))
    ]
    if missing or isinstance(session, (str, bytes)):
        raise TypeError(
            f"session must be a Session (raf.InMemorySession(), or 'await store.get(id)' of a "
            f"session store), got {type(session).__name__} {session!r:.60}"
        )
    _SESSION_TYPES.add(type(session))


def _checked_tools(tools: Iterable[Tool]) -> tuple[Tool, ...]:
    if isinstance(tools, (str, bytes)) or callable(tools):
        raise TypeError(f"tools must be a list of tools, got {tools!r}")
    checked = tuple(tools)
    for index, item in enumerate(checked):
        if not isinstance(getattr(item, "name", None), str) or not callable(
            getattr(item, "invoke", None)
        ):
            hint = (
                " (a plain function: decorate it with @raf.tool to make a tool of it)"
                if callable(item)
                else ""
            )
            raise TypeError(f"tools[{index}] is not a Tool: {item!r}{hint}")
    return checked


def _request_messages(
    messages: str | ChatMessage | Sequence[ChatMessage],
) -> tuple[ChatMessage, ...]:
    if isinstance(messages, str):
        return (ChatMessage("user", messages),)
    if type(messages) is ChatMessage:
        return (messages,)
    if isinstance(messages, Sequence):
        return checked_messages(cast("Sequence[ChatMessage]", messages), "run(messages)")
    raise TypeError(
        "run(messages) takes a str, a ChatMessage or a sequence of ChatMessage, "
        f"got {type(messages).__name__}"
    )
