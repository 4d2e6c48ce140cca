"""Print the order of the stages of a three-provider run on the offline client."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

import raf
from raf import AgentResponse, ChatMessage, ContextProvider, ContextResult


class Announce(ContextProvider):
    """Says when each of its stages runs."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def on_invoking(
        self, agent: object, session: object, messages: Sequence[ChatMessage], options: object
    ) -> ContextResult:
        print(f"  {self.name}.on_invoking")
        return ContextResult(instructions=f"{self.name} was here.")

    async def on_invoked(
        self,
        agent: object,
        session: object,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        outcome = f"response {response.text!r}" if response else f"error {error!r}"
        print(f"  {self.name}.on_invoked ({outcome})")


class ShowPrompt:
    """A chat client that prints what the model would see, then echoes."""

    async def complete(
        self, messages: Sequence[ChatMessage], options: raf.ChatOptions
    ) -> AgentResponse:
        print("  model sees:")
        for message in messages:
            print(f"    {message.role}: {message.content!r}")
        return await raf.EchoChatClient().complete(messages, options)


async def main() -> None:
    agent = raf.Agent(
        ShowPrompt(),
        instructions="You are the demo agent.",
        stack=[Announce("outer"), Announce("middle"), Announce("inner")],
    )
    print("run('hello'):")
    response = await agent.run("hello")
    print(f"answer: {response.text!r}")


if __name__ == "__main__":
    anyio.run(main)
