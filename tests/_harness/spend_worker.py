"""Another process that spends a budget (``python -m tests._harness.spend_worker``).

    python -m tests._harness.spend_worker STORE SCOPE

Builds an agent whose one model call costs exactly $0.01 (10 tokens in at $1,000 per
million, none out), under ``raf.SpendLimits([Budget("0.01", "day", SCOPE-function)],
store=STORE)``, prints ``ready``, waits for a line on stdin (the start), runs one turn and
prints ``sent`` or ``refused``. The model takes a moment to answer, so the call's hold is
in flight while the other process reserves.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import anyio

from raf import (
    Agent,
    AgentResponse,
    Budget,
    BudgetExceeded,
    ChatMessage,
    ChatOptions,
    Invocation,
    Prices,
    ScriptedChatClient,
    SpendLimits,
    Usage,
)

PRICES = Prices(overrides={"house": {"input": 1000, "output": 1000}})


async def main(store: str, scope: str) -> None:
    async def answer(messages: Sequence[ChatMessage], options: ChatOptions) -> AgentResponse:
        await anyio.sleep(0.3)
        return AgentResponse((ChatMessage.assistant("ok"),), Usage(10, 0))

    def whose(invocation: Invocation | None) -> str:
        return scope

    client = ScriptedChatClient([answer])
    client.model = "house"  # type: ignore[attr-defined]
    client.count_tokens = lambda messages, tools=(): 10  # type: ignore[attr-defined]
    limits = SpendLimits([Budget("0.01", "day", whose)], store=store, prices=PRICES)
    async with Agent(client, chat_stack=[limits]) as agent:
        await limits.open()  # connect before the start, so both reserve at the same moment
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        try:
            await agent.run("hi")
            print("sent", flush=True)
        except BudgetExceeded:
            print("refused", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
