"""A turn over a long history through OpenAIChatClient (and OpenAIResponsesClient), against
its floor: ``json.dumps`` of the same body and a plain httpx POST.

One loopback HTTP server in a child process (so it does not share the GIL with
what is measured) answers every POST with the same small chat completion. In
this process, side by side and interleaved, for a stored history of 1,000 and
10,000 messages:

- ``floor`` (``json.dumps`` + POST): the body raf sends for that turn, as plain
  dicts, encoded with ``json.dumps`` and POSTed with a plain ``httpx2.AsyncClient``,
  the reply decoded with ``json.loads``;
- ``raf turn`` (warm): ``agent.run(...)`` of an ``Agent`` with instructions and an
  ``HistoryProvider``, ``OpenAIChatClient`` underneath: the next turn of one
  conversation whose session holds the history (it grows by two messages a turn);
- ``raf turn, new objects``: the same, with the session's history rebuilt as new
  message objects before each turn (as a store that decodes rows each turn gives
  them), so no message is the object the client saw before;
- ``raf streamed turn``: ``agent.run(..., on_update=...)``, ``OpenAIChatClient.stream``
  underneath, against the streamed floor (the same body with ``"stream": true``,
  POSTed with ``httpx2.AsyncClient.stream``, each event's data decoded with
  ``json.loads``; the server answers with 20 text chunks, the finish and the usage);
- ``SDK create``: ``AsyncOpenAI.chat.completions.create`` with the messages as
  dicts, which runs the SDK's request transform over every message (for scale).

With ``--clients chat responses`` the same rows are measured for
``OpenAIResponsesClient`` too (``POST /responses``; the server answers with a
response object, or with the events of one: 20 text deltas and
``response.completed``); the SDK row is then ``AsyncOpenAI.responses.create``.

Budget (docs/performance.md): each raf row at most 5x its floor.

    python benchmarks/bench_openai.py                    # both sizes, asyncio
    python benchmarks/bench_openai.py --repeats 15 --backend trio
    python benchmarks/bench_openai.py --sizes 1000 --sdk-repeats 0   # skip the slow SDK rows
    python benchmarks/bench_openai.py --clients chat responses        # both clients
    RAF_SOURCE=../other-checkout python benchmarks/bench_openai.py  # measure another raf
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("RAF_SOURCE", str(ROOT)))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Samples, fmt, ratio, run_async, table  # noqa: E402

REPLY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Noted.", "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }
).encode()


def _event(chunk: dict[str, Any]) -> bytes:
    data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        if usage is None
        else [],
        "usage": usage,
    }


#: The streamed answer: a role chunk, 20 words, the finish, the usage, [DONE]; chunked.
STREAM_REPLY = (
    b"".join(
        [
            _event(_chunk({"role": "assistant", "content": ""})),
            *(_event(_chunk({"content": f"word{n} "})) for n in range(20)),
            _event(_chunk({}, "stop")),
            _event(_chunk({}, usage={"prompt_tokens": 10, "completion_tokens": 20})),
        ]
    )
    + b"%x\r\n%s\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")
    + b"0\r\n\r\n"
)

RESPONSE = {
    "id": "resp_bench",
    "object": "response",
    "created_at": 1700000000,
    "model": "bench-model",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "id": "msg_bench",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Noted.", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12,
    },
}
RESPONSES_REPLY = json.dumps(RESPONSE).encode()


def _response_event(event: dict[str, Any]) -> bytes:
    data = b"event: %s\ndata: %s\n\n" % (event["type"].encode(), json.dumps(event).encode())
    return b"%x\r\n%s\r\n" % (len(data), data)


_STREAMED_TEXT = "".join(f"word{n} " for n in range(20))
_STREAMED_RESPONSE = {
    **RESPONSE,
    "output": [
        {
            **RESPONSE["output"][0],  # type: ignore[index]
            "content": [{"type": "output_text", "text": _STREAMED_TEXT, "annotations": []}],
        }
    ],
}

#: The streamed response: created, 20 text deltas, completed (the deltas' text); chunked.
RESPONSES_STREAM_REPLY = (
    b"".join(
        [
            _response_event({"type": "response.created", "response": RESPONSE}),
            *(
                _response_event(
                    {
                        "type": "response.output_text.delta",
                        "item_id": "msg_bench",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": f"word{n} ",
                    }
                )
                for n in range(20)
            ),
            _response_event({"type": "response.completed", "response": _STREAMED_RESPONSE}),
        ]
    )
    + b"0\r\n\r\n"
)

# --- The server (a child process) ----------------------------------------------------------


async def _serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: keep-alive\r\n\r\n" % len(REPLY)
    )
    responses_head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: keep-alive\r\n\r\n" % len(RESPONSES_REPLY)
    )
    stream_head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
    )
    try:
        while True:
            request = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in request.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            # raf's body says "stream" last (after the messages), with or without a space.
            streamed = b'"stream":true' in body[-200:] or b'"stream": true' in body[-200:]
            if request.split(b" ", 2)[1].endswith(b"/responses"):
                if streamed:
                    writer.write(stream_head + RESPONSES_STREAM_REPLY)
                else:
                    writer.write(responses_head + RESPONSES_REPLY)
            elif streamed:
                writer.write(stream_head + STREAM_REPLY)
            else:
                writer.write(head + REPLY)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    except asyncio.CancelledError:
        return  # the server is stopping with this connection still open: nothing to report
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_serve_one, "127.0.0.1", 0, limit=1 << 20)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    # The parent closes our stdin when it is done: then we stop.
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    server.close()


def start_server() -> tuple[subprocess.Popen[str], str]:
    """The server process and its base URL."""
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    port = int(child.stdout.readline())
    return child, f"http://127.0.0.1:{port}/v1"


# --- What is measured ----------------------------------------------------------------------

_TEXT = (
    "the quick brown fox jumps over a lazy dog while the agent reads its long history "
    "and answers questions about invoices addresses statuses and classes"
)
WORDS = _TEXT.split()


def history(size: int) -> list[Any]:
    """``size`` messages: user and assistant turns, a tool call and its result now and then."""
    from raf import ChatMessage, ToolCall

    messages: list[Any] = []
    turn = 0
    while len(messages) < size:
        words = [WORDS[(turn * 7 + i) % len(WORDS)] for i in range(18)]
        messages.append(ChatMessage.user(f"Question {turn}: " + " ".join(words) + "?"))
        if turn % 10 == 9:
            call = ToolCall(f"call_{turn}", "lookup", json.dumps({"query": words[0], "n": turn}))
            messages.append(ChatMessage.assistant(None, tool_calls=[call]))
            messages.append(ChatMessage.tool(call.id, json.dumps({"hits": words[:6]})))
        messages.append(ChatMessage.assistant("Answer: " + " ".join(words * 2) + "."))
        turn += 1
    return messages[:size]


def copies(messages: Sequence[Any]) -> list[Any]:
    """The same messages as new objects, as a store that decodes rows gives them."""
    from raf import ChatMessage

    return [ChatMessage.from_dict(m.to_dict()) for m in messages]


async def timed(operation: Callable[[], Awaitable[Any]]) -> float:
    gc.collect()
    started = time.perf_counter()
    await operation()
    return (time.perf_counter() - started) * 1e3


async def measure(
    base_url: str, size: int, repeats: int, sdk_repeats: int, kind: str = "chat"
) -> dict[str, Samples]:
    import httpx2
    import openai

    from raf import Agent, ChatMessage, ChatOptions, HistoryProvider, InMemorySession
    from raf._clients.openai import OpenAIChatClient
    from raf._clients.responses import OpenAIResponsesClient

    stored = history(size)
    question = "And what about the next one?"
    instructions = "You answer questions about the history. Be brief."
    client_class = OpenAIChatClient if kind == "chat" else OpenAIResponsesClient
    path = "/chat/completions" if kind == "chat" else "/responses"
    model = client_class("bench-model", base_url=base_url, api_key="sk-bench", max_retries=0)
    agent = Agent(model, instructions=instructions, stack=[HistoryProvider()])
    # The floor's body is what raf sends for a turn, as plain dicts.
    turn_messages = [ChatMessage.system(instructions), *stored, ChatMessage.user(question)]
    builder = client_class("bench-model", api_key="sk-bench")
    _, body_dict, _ = builder.request_body(turn_messages, ChatOptions())
    _, streamed_dict, _ = builder.request_body(turn_messages, ChatOptions(), stream=True)
    plain = httpx2.AsyncClient(base_url=base_url)
    headers = {"authorization": "Bearer sk-bench", "content-type": "application/json"}
    sdk = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)

    async def session_with(messages: Sequence[Any]) -> Any:
        session = InMemorySession("bench")
        await session.add_messages(messages)
        return session

    async def floor() -> None:
        reply = await plain.post(path, content=json.dumps(body_dict).encode(), headers=headers)
        json.loads(reply.content)

    async def sdk_create() -> None:
        if kind == "chat":
            await sdk.chat.completions.create(model="bench-model", messages=body_dict["messages"])
        else:
            await sdk.responses.create(
                model="bench-model",
                input=body_dict["input"],
                store=False,
                include=["reasoning.encrypted_content"],
            )

    async def floor_stream() -> None:
        content = json.dumps(streamed_dict).encode()
        async with plain.stream("POST", path, content=content, headers=headers) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    json.loads(line[6:])

    async def on_update(update: Any) -> None:
        pass

    contenders: dict[str, Callable[[], Awaitable[Any]]] = {
        "floor": floor,
        "streamed floor": floor_stream,
    }
    samples: dict[str, Samples] = {name: [] for name in contenders}
    samples["raf turn"] = []
    samples["raf turn, new objects"] = []
    samples["raf streamed turn"] = []
    samples["SDK create"] = []

    async with plain, sdk, model:
        conversation = await session_with(stored)
        # Warm-up: connections, imports, and the conversation's first turn.
        for operation in contenders.values():
            await operation()
        await agent.run(question, session=conversation)
        await agent.run(question, session=conversation, on_update=on_update)
        for _ in range(repeats):
            for name, operation in contenders.items():
                samples[name].append(await timed(operation))
            samples["raf turn"].append(
                await timed(lambda: agent.run(question, session=conversation))
            )
            # The same conversation, decoded anew (not timed): equal messages, new objects.
            decoded = await session_with(copies(await conversation.get_messages()))
            samples["raf turn, new objects"].append(
                await timed(lambda s=decoded: agent.run(question, session=s))
            )
            samples["raf streamed turn"].append(
                await timed(lambda: agent.run(question, session=conversation, on_update=on_update))
            )
        for _ in range(sdk_repeats):
            samples["SDK create"].append(await timed(sdk_create))
    return samples


#: The rows measured against their floor, in the order of the table.
RAF_ROWS = ("raf turn", "raf turn, new objects", "raf streamed turn", "SDK create")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--sdk-repeats", type=int, default=3)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--clients", nargs="+", default=["chat"], choices=["chat", "responses"])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return

    import openai

    child, base_url = start_server()
    try:
        rows = []
        for kind in args.clients:
            for size in args.sizes:
                samples = run_async(
                    lambda size=size, kind=kind: measure(
                        base_url, size, args.repeats, args.sdk_repeats, kind
                    ),
                    args.backend,
                )
                prefix = "" if kind == "chat" else "responses: "
                for name in RAF_ROWS:
                    figure = samples[name]
                    floor = samples["streamed floor" if "stream" in name else "floor"]
                    shown: Samples | str = figure if figure else "not run"
                    best = f"x{min(figure) / min(floor):.2f}" if figure else "-"
                    ratios = [ratio(shown, floor), best]
                    rows.append([f"{size:,}", prefix + name, fmt(shown), fmt(floor), *ratios])
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)

    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, openai {openai.__version__}, "
        f"backend {args.backend}, {args.repeats} repeats ({args.sdk_repeats} for the SDK)"
    )
    headers = ["history", "what", "ms median (min-max)", "floor ms", "vs floor", "best vs best"]
    print(table(headers, rows))
    print("(floor: json.dumps of the same body + httpx POST; streamed: + httpx stream POST)")


if __name__ == "__main__":
    main()
