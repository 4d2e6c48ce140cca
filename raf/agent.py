"""Agent: builds the run and chat stacks once, and runs a turn through them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, cast, runtime_checkable

from raf.context import Invocation
from raf.messages import AgentResponse, ChatMessage, Messages, checked_messages, join_messages
from raf.options import AgentRunOptions, ChatOptions
from raf.pipeline import ChatRequest, Complete, compose, is_provider
from raf.sessions.base import Session
from raf.sessions.memory import InMemorySession
from raf.tool_loop import index_tools, run_tool_loop
from raf.tools import Tool

__all__ = ["Agent", "ChatClient"]

_DEFAULT_OPTIONS = AgentRunOptions()


@runtime_checkable
class ChatClient(Protocol):
    """A chat model: messages and options in, the model's turn out.

    The response's ``messages`` hold the assistant turn (text, tool calls or
    both); failures are :class:`raf.errors.ChatClientError` subclasses.
    """

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse: ...


class Agent:
    """An agent: a chat client, instructions, tools and the context stack.

    ``stack`` holds context providers and run middleware, outermost first;
    ``chat_stack`` holds middleware around every single model call (retry,
    logging). Both onions are built here, once.

    >>> import anyio
    >>> from raf import EchoChatClient
    >>> agent = Agent(EchoChatClient(), instructions="Be brief.")
    >>> anyio.run(agent.run, "hello").text
    'hello'
    """

    def __init__(
        self,
        chat_client: ChatClient,
        *,
        name: str | None = None,
        instructions: str | None = None,
        tools: Iterable[Tool] = (),
        stack: Sequence[Any] = (),
        chat_stack: Sequence[Any] = (),
        post_timeout: float = 10.0,
    ) -> None:
        if not callable(getattr(chat_client, "complete", None)):
            raise TypeError(f"chat_client must have an async complete() method: {chat_client!r}")
        if instructions is not None and not isinstance(instructions, str):
            raise TypeError(
                f"instructions must be a str or None, got {type(instructions).__name__}"
            )
        if not post_timeout > 0:
            raise ValueError(f"post_timeout must be positive, got {post_timeout!r}")
        self.chat_client = chat_client
        self.name = name
        self.instructions = instructions or None
        self.tools: tuple[Tool, ...] = tuple(tools)
        for index, tool in enumerate(self.tools):
            if not isinstance(getattr(tool, "name", None), str) or not callable(
                getattr(tool, "invoke", None)
            ):
                raise TypeError(f"tools[{index}] is not a Tool: {tool!r}")
        self._tool_index = index_tools(self.tools, source="the agent")
        self.stack: tuple[Any, ...] = tuple(stack)
        self.chat_stack: tuple[Any, ...] = tuple(chat_stack)
        for index, item in enumerate(self.chat_stack):
            if is_provider(item) or not callable(item):
                raise TypeError(
                    f"chat_stack[{index}] must be middleware (async (request, call_next)); "
                    f"context providers go in stack: {item!r}"
                )
        self.post_timeout = post_timeout
        self._run = compose(self._core, self.stack, post_timeout=post_timeout)
        self._chat: Complete[ChatRequest] | None = (
            compose(self._call_model, self.chat_stack) if self.chat_stack else None
        )
        # The chat options of the last run that added no tools, by its run options:
        # most runs of an agent share one options object, and so share these.
        self._chat_options: tuple[AgentRunOptions, ChatOptions] | None = None

    @property
    def providers(self) -> tuple[Any, ...]:
        """The context providers of the stack, outermost first."""
        return tuple(item for item in self.stack if is_provider(item))

    async def run(
        self,
        messages: str | ChatMessage | Sequence[ChatMessage],
        *,
        session: Session | None = None,
        options: AgentRunOptions | None = None,
    ) -> AgentResponse:
        """Run one turn: the stack, the model and its tool calls, and back out.

        ``messages`` is a user message as ``str``, one ``ChatMessage`` or a
        sequence of them. ``session=None`` uses a fresh
        :class:`raf.InMemorySession`.
        """
        request = _request_messages(messages)
        if session is None:
            session = InMemorySession()
        if options is None:
            options = _DEFAULT_OPTIONS
        elif type(options) is not AgentRunOptions:
            raise TypeError(f"options must be AgentRunOptions, got {type(options).__name__}")
        await session.touch_request_hash(request)
        return await self._run(Invocation(self, session, request, options))

    async def _core(self, invocation: Invocation) -> AgentResponse:
        """What the model sees, then the tool loop."""
        instructions = invocation.instructions
        if self.instructions is not None:
            instructions = (self.instructions, *instructions)
        # Joined, not copied: a long injected history is shared as it is (raf.Messages).
        messages: Sequence[ChatMessage]
        if instructions:
            system = ChatMessage("system", "\n".join(instructions))
            messages = join_messages((system,), invocation.messages, invocation.request_messages)
        elif invocation.messages:
            messages = join_messages(invocation.messages, invocation.request_messages)
        else:
            messages = invocation.request_messages
        options = invocation.options
        if invocation.tools:
            tool_index = index_tools(invocation.tools, self._tool_index)
            chat_options = ChatOptions.from_run(options, self.tools + invocation.tools)
        else:
            tool_index = self._tool_index
            cached = self._chat_options
            if cached is not None and cached[0] is options:
                chat_options = cached[1]
            else:
                chat_options = ChatOptions.from_run(options, self.tools)
                self._chat_options = (options, chat_options)
        return await run_tool_loop(
            self._chat_call, messages, chat_options, tool_index, options.max_tool_iterations
        )

    def _chat_call(self, messages: Sequence[ChatMessage], options: ChatOptions) -> Any:
        if self._chat is None:  # no chat middleware: no ChatRequest to build and unpack
            return self.chat_client.complete(messages, options)
        return self._chat(ChatRequest(messages, options))

    def _call_model(self, request: ChatRequest) -> Any:
        return self.chat_client.complete(request.messages, request.options)

    def __repr__(self) -> str:
        return (
            f"<Agent name={self.name!r} client={type(self.chat_client).__name__} "
            f"stack={len(self.stack)} chat_stack={len(self.chat_stack)}>"
        )


def _request_messages(
    messages: str | ChatMessage | Sequence[ChatMessage],
) -> tuple[ChatMessage, ...]:
    if isinstance(messages, str):
        return (ChatMessage("user", messages),)
    if type(messages) is ChatMessage:
        return (messages,)
    if type(messages) is Messages:
        return tuple(messages)
    if isinstance(messages, Sequence):
        return checked_messages(cast("Sequence[ChatMessage]", messages), "run(messages): Messages")
    raise TypeError(
        "run(messages) takes a str, a ChatMessage or a sequence of ChatMessage, "
        f"got {type(messages).__name__}"
    )
