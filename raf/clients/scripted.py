"""ScriptedChatClient: a model that plays a script, for tests and examples."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

import attrs

from raf.messages import AgentResponse, ChatMessage, ToolCall
from raf.options import ChatOptions

__all__ = ["ScriptStep", "ScriptedCall", "ScriptedChatClient"]

#: One scripted answer: a text, an assistant message, a response, an
#: exception to raise, or a function of the call that returns one of those.
_Answer = str | ChatMessage | AgentResponse
ScriptStep = (
    _Answer
    | BaseException
    | Callable[[Sequence[ChatMessage], ChatOptions], _Answer]
    | Callable[[Sequence[ChatMessage], ChatOptions], Awaitable[_Answer]]
)


@attrs.frozen(slots=True)
class ScriptedCall:
    """What the client was called with."""

    messages: tuple[ChatMessage, ...]
    options: ChatOptions


class ScriptedChatClient:
    """Answers each call with the next step of a script and records every call.

    >>> import anyio
    >>> from raf import ToolCall
    >>> client = ScriptedChatClient([ScriptedChatClient.tool_turn(ToolCall("1", "now")), "done"])
    >>> len(client.script)
    2
    """

    def __init__(self, script: Iterable[ScriptStep] = ()) -> None:
        self.script: list[ScriptStep] = list(script)
        self.requests: list[ScriptedCall] = []

    @staticmethod
    def tool_turn(*tool_calls: ToolCall, text: str | None = None) -> ChatMessage:
        """An assistant turn that asks for ``tool_calls``."""
        return ChatMessage.assistant(text, tool_calls=tool_calls)

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Record the call and play the next step."""
        self.requests.append(ScriptedCall(tuple(messages), options))
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
        if isinstance(answer, str):
            return AgentResponse((ChatMessage.assistant(answer),))
        if isinstance(answer, ChatMessage):
            return AgentResponse((answer,))
        if isinstance(answer, AgentResponse):
            return answer
        raise TypeError(f"ScriptedChatClient: unusable script step {answer!r}")
