"""ScriptedChatClient: a model that plays a script, for tests and examples."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence

import attrs

from raf._values.messages import AgentResponse, ChatMessage, ToolCall, Update
from raf._values.options import ChatOptions

__all__ = ["ScriptedChatClient"]

#: One chunk of a streamed answer: a text delta, an update, or an exception to raise there.
Chunk = str | Update | BaseException
#: One scripted answer: a text, an assistant message, a response, or a list of chunks.
_Answer = str | ChatMessage | AgentResponse | list[Chunk] | tuple[Chunk, ...]
#: One step of the script: an answer, an exception to raise, or a function of the call
#: that returns an answer.
ScriptStep = (
    _Answer
    | BaseException
    | Callable[[Sequence[ChatMessage], ChatOptions], _Answer]
    | Callable[[Sequence[ChatMessage], ChatOptions], Awaitable[_Answer]]
)


@attrs.frozen(slots=True)
class ScriptedCall:
    """What the client was called with; ``streamed`` when through ``stream``."""

    messages: tuple[ChatMessage, ...]
    options: ChatOptions
    streamed: bool = attrs.field(default=False, kw_only=True)


class ScriptedChatClient:
    """Answers each call with the next step of a script and records every call.

    A step that is a list is one answer in chunks: ``stream`` sends them one
    by one (a ``str`` as a text delta, an :class:`raf.Update` as it is, an
    exception is raised at its place: a connection dropped mid-stream), and
    ``complete`` returns what they assemble to. Any other answer streams as
    its updates (a ``str`` in one delta).

    >>> import anyio
    >>> from raf import ToolCall
    >>> client = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "now")), "done"])
    >>> len(client.script)
    2
    >>> chunks = ScriptedChatClient([["Hel", "lo"]])
    >>> anyio.run(chunks.complete, [], ChatOptions()).text
    'Hello'
    """

    def __init__(self, script: Iterable[ScriptStep] = ()) -> None:
        #: The steps still to play, first first: append to it to script more answers.
        self.script: list[ScriptStep] = list(script)
        #: Every call the client got, in order, also those that raised or found no step
        #: left: the messages (a snapshot), the options (``.tools`` is what the model was
        #: offered) and whether it was ``streamed`` (recorded when its iteration starts).
        self.requests: list[ScriptedCall] = []

    @staticmethod
    def tool_turn(*tool_calls: ToolCall, text: str | None = None) -> ChatMessage:
        """An assistant turn that asks for ``tool_calls``."""
        return ChatMessage.assistant(text, tool_calls=tool_calls)

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Record the call and play the next step."""
        answer = await self._next(messages, options, streamed=False)
        if isinstance(answer, (list, tuple)):
            return AgentResponse.from_updates([_update(chunk) for chunk in answer])
        return _response(answer)

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """Record the call and play the next step, chunk by chunk."""
        answer = await self._next(messages, options, streamed=True)
        if isinstance(answer, (list, tuple)):
            for chunk in answer:
                yield _update(chunk)
        else:
            for update in _response(answer).to_updates():
                yield update

    async def _next(
        self, messages: Sequence[ChatMessage], options: ChatOptions, *, streamed: bool
    ) -> object:
        self.requests.append(ScriptedCall(tuple(messages), options, streamed=streamed))
        if not self.script:
            raise AssertionError(
                f"ScriptedChatClient: call {len(self.requests)} has no scripted answer left"
            )
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        answer: object = step
        if callable(step):
            answer = step(messages, options)
            if isinstance(answer, Awaitable):
                answer = await answer
        return answer


def _response(answer: object) -> AgentResponse:
    if isinstance(answer, str):
        return AgentResponse((ChatMessage.assistant(answer),))
    if isinstance(answer, ChatMessage):
        return AgentResponse((answer,))
    if isinstance(answer, AgentResponse):
        return answer
    raise TypeError(f"ScriptedChatClient: unusable script step {answer!r}")


def _update(chunk: object) -> Update:
    """One chunk as an update; an exception chunk is raised here, where it stands."""
    if isinstance(chunk, str):
        return Update("text", chunk)
    if isinstance(chunk, Update):
        return chunk
    if isinstance(chunk, BaseException):
        raise chunk
    raise TypeError(
        f"ScriptedChatClient: unusable chunk {chunk!r} (a str, an Update or an exception)"
    )
