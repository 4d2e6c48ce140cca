"""GeminiChatClient: a chat model behind Gemini's ``generateContent`` (the google-genai SDK)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Final, Self

import anyio
import httpx2
import pydantic
from google import genai
from google.genai import types

from raf._clients._gemini_http import BoundedTransport
from raf._clients._gemini_reply import (
    MADE_ID,
    SDK_ERRORS,
    SOURCE,
    StreamState,
    call_name,
    error_from_genai,
    response_from_reply,
)
from raf._clients._reply import DRAIN_GRACE, Budget, quote
from raf._clients._sdk import DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT, plain, tls_context
from raf._values.compacted import for_wire
from raf._values.messages import AgentResponse, ChatMessage, Update
from raf._values.options import ChatOptions
from raf._values.protocols import Tool
from raf.errors import AuthenticationError, BadRequestError, ChatClientError, ChatTimeoutError

__all__ = ["GeminiChatClient"]

#: ``tool_choice`` words as Gemini's function calling modes.
_MODES: Final = {
    "auto": types.FunctionCallingConfigMode.AUTO,
    "none": types.FunctionCallingConfigMode.NONE,
    "required": types.FunctionCallingConfigMode.ANY,
}
#: The variables a key is read from, in this order, when none is given.
KEY_VARIABLES: Final = ("GEMINI_API_KEY", "GOOGLE_API_KEY")


class GeminiChatClient:
    """A :class:`raf.StreamingChatClient` on Gemini's ``generateContent`` (the
    ``google-genai`` SDK, extra ``raf-agents[gemini]``). **asyncio only**: the SDK's
    async client is bound to asyncio, and a call on trio raises a
    :class:`raf.ChatClientError` that says so.

    ``model`` is used unless a run's ``AgentRunOptions.model`` names another.
    ``api_key`` defaults to ``GEMINI_API_KEY``, then ``GOOGLE_API_KEY``;
    ``base_url`` to the SDK's (``GOOGLE_GEMINI_BASE_URL``, else Google's);
    ``api_version`` the API's version in its paths (``"v1alpha"``, ``"v1"``),
    default the SDK's (``v1beta``).
    ``max_retries`` is the SDK's own retry budget (408, 429, 5xx and dropped
    connections). ``timeout`` bounds a whole plain call (the SDK's retries
    included) and a stream until its first chunk; ``idle_timeout`` each wait on
    a stream's next chunk; ``max_response_bytes`` a reply, and a whole stream, in
    bytes once decoded (past it: a :class:`raf.errors.ChatProtocolError`). ``client`` is a
    ``google.genai.Client`` you built (closed by you; ``api_key``, ``base_url``,
    ``api_version`` and the bound of its replies then belong to it).

    System messages before ``ChatOptions.history_end`` (or, with nothing injected,
    the leading ones) are the ``system_instruction``; a later one (the volatile
    tail) is text at the start of the following user turn. Tool calls and
    results are ``functionCall`` and ``functionResponse`` parts. The thought
    signatures (and thoughts) of a turn are kept on its message as
    :class:`raf.Reasoning` (source ``"gemini"``) and sent back unchanged.

        async with GeminiChatClient("gemini-2.5-flash") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    #: The provider, as the OpenTelemetry GenAI conventions name the Gemini Developer API.
    provider_name: Final = "gcp.gemini"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_version: str | None = None,
        max_retries: int = 2,
        timeout: float | None = DEFAULT_TIMEOUT,
        idle_timeout: float | None = DEFAULT_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        client: genai.Client | None = None,
    ) -> None:
        name = "GeminiChatClient"
        if not isinstance(model, str) or not model:
            raise ValueError(f"{name}: model must be a non-empty str, got {model!r}")
        if type(max_retries) is not int or max_retries < 0:
            raise ValueError(f"{name}: max_retries must be an int >= 0, got {max_retries!r}")
        for keyword, value in (("timeout", timeout), ("idle_timeout", idle_timeout)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
            ):  # not value > 0 also refuses NaN
                raise ValueError(
                    f"{name}: {keyword} must be a number of seconds > 0 or None, got {value!r}"
                )
        if type(max_response_bytes) is not int or max_response_bytes < 1:
            raise ValueError(
                f"{name}: max_response_bytes must be an int >= 1, got {max_response_bytes!r}"
            )
        if api_version is not None and (not isinstance(api_version, str) or not api_version):
            raise ValueError(f"{name}: api_version must be a non-empty str, got {api_version!r}")
        if client is not None and (
            base_url is not None or api_key is not None or api_version is not None
        ):
            raise ValueError(
                f"{name}: pass base_url, api_key and api_version to the google.genai.Client "
                f"you give as client=, not to {name}"
            )
        self.model = model
        self.timeout = timeout
        self.idle_timeout = idle_timeout
        self._owns_client = client is None
        self.client: genai.Client | None = client
        if client is None:
            key = api_key or next(filter(None, map(os.environ.get, KEY_VARIABLES)), None)
            if key is not None:
                self.client = _new_client(
                    key, base_url, api_version, max_retries, max_response_bytes
                )

    # --- complete and stream ------------------------------------------------------------

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one ``generateContent`` request and return the model's turn.

        A ``MAX_TOKENS`` ending is an :class:`raf.errors.IncompleteResponseError` with
        ``.partial``; a blocked prompt or a safety stop (``SAFETY``,
        ``RECITATION``, ``PROHIBITED_CONTENT``, ...) a :class:`raf.ChatClientError`
        that names it (not retryable).
        """
        model, contents, config = self.request(messages, options)
        where = call_name(model)
        models = self._models(where)
        with anyio.move_on_after(self.timeout):
            try:
                response = await models.generate_content(
                    model=model, contents=contents, config=config
                )
            except SDK_ERRORS as exc:
                raise error_from_genai(exc, where) from exc
            return response_from_reply(response, where)
        # Only the deadline's own cancellation lands here: any other one propagates.
        raise ChatTimeoutError(
            f"{where} did not finish within {self.timeout} s "
            f"(GeminiChatClient(timeout={self.timeout}), the SDK's retries included)"
        )

    async def stream(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AsyncIterator[Update]:
        """The model's turn as it comes (``streamGenerateContent``, SSE), update by update.

        Text as it comes; the tool calls and the usage once a chunk carries the
        ``finishReason``. A stream that ends before one is a
        :class:`raf.errors.ChatConnectionError`; the endings as for :meth:`complete`;
        after the ending, nothing changes the answer.
        """
        model, contents, config = self.request(messages, options)
        where = call_name(model)
        models = self._models(where)
        state = StreamState(where)
        start = Budget(
            self.timeout,
            f"{where} did not start streaming within {self.timeout} s "
            f"(GeminiChatClient(timeout={self.timeout}), the SDK's retries included)",
        )
        idle = Budget(
            self.idle_timeout,
            f"{where}: the stream sent nothing for {self.idle_timeout} s of waiting "
            f"(GeminiChatClient(idle_timeout={self.idle_timeout}))",
        )
        opened = functools.partial(
            models.generate_content_stream, model=model, contents=contents, config=config
        )
        responses: list[httpx2.Response] = []
        try:
            chunks = await start.run(_watched, responses, opened)
        except SDK_ERRORS as exc:
            raise error_from_genai(exc, where) from exc
        budget = start
        # Closed here, not left to the garbage collector, when the consumer stops early:
        # the SDK's generator does not close the generators it reads from, so the HTTP
        # responses it opened are closed too (else the connection stays open until a GC).
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(_close_all, responses)
            stack.push_async_callback(chunks.aclose)
            while True:
                try:
                    chunk = await budget.run(_watched, responses, _next, chunks)
                except (*SDK_ERRORS, ChatTimeoutError) as exc:
                    if state.done:
                        break  # past the answer, nothing is an error
                    if isinstance(exc, ChatClientError):
                        raise
                    raise error_from_genai(exc, where) from exc
                if chunk is None:
                    break
                budget = idle
                done = state.done
                updates = state.feed(chunk)
                if state.done and not done:
                    # What follows the answer gets a moment, not the budget.
                    idle.cap(DRAIN_GRACE)
                for update in updates:
                    yield update
        state.finish()

    # --- the request --------------------------------------------------------------------

    def request(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> tuple[str, list[types.Content], types.GenerateContentConfig]:
        """The model, the contents and the config of one call.

        ``options.extra`` is merged into the config last: any field of the SDK's
        ``GenerateContentConfig`` (``thinking_config``, ``safety_settings``,
        ``top_k``, ``stop_sequences``, ``http_options``, ...); another key is a
        :class:`raf.errors.BadRequestError` naming it.
        """
        where = "GeminiChatClient"
        model = options.model or self.model
        if not isinstance(model, str) or not model:
            raise BadRequestError(f"{where}: model must be a non-empty str, got {model!r}")
        # No compaction of its own: another wire's summary stands in for what it replaced.
        system, contents = wire_contents(*for_wire(messages, SOURCE, options.history_end))
        fields: dict[str, Any] = {
            "system_instruction": types.Content(parts=system) if system else None,
            "temperature": options.temperature,
            "max_output_tokens": options.max_tokens,
            "tools": [types.Tool(function_declarations=[declaration(t) for t in options.tools])]
            if options.tools
            else None,
            "tool_config": tool_config(options.tool_choice),
            # raf's tool loop runs the tools: the SDK's own calling of Python functions is off.
            "automatic_function_calling": types.AutomaticFunctionCallingConfig(disable=True),
        }
        if options.output_schema is not None:
            fields["response_mime_type"] = "application/json"
            fields["response_json_schema"] = plain(options.output_schema)
        known = types.GenerateContentConfig.model_fields
        for key, value in options.extra.items():
            if key not in known:
                raise BadRequestError(
                    f"{where}: extra option {key!r} is not a field of Gemini's "
                    "GenerateContentConfig (thinking_config, safety_settings, top_k, ...)"
                )
            fields[key] = value
        try:
            config = types.GenerateContentConfig.model_validate(
                {key: value for key, value in fields.items() if value is not None}
            )
        except pydantic.ValidationError as exc:
            raise BadRequestError(f"{where}: the request's options do not fit: {exc}") from None
        return model, contents, config

    def _models(self, where: str) -> Any:
        """The SDK's async models API, after the checks a call needs first."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise ChatClientError(
                f"{where}: GeminiChatClient runs on asyncio only (google-genai's async client "
                "is bound to asyncio); run it with anyio.run(..., backend='asyncio') or "
                "asyncio.run()"
            ) from None
        if self.client is None:
            raise AuthenticationError(
                f"{where}: no API key (pass api_key= or set GEMINI_API_KEY or GOOGLE_API_KEY)"
            )
        return self.client.aio.models

    # --- closing ------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client and self.client is not None:
            await self.client.aio.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"GeminiChatClient(model={self.model!r})"


#: The HTTP responses the SDK opened for the stream being opened in this context.
_OPENED: ContextVar[list[httpx2.Response] | None] = ContextVar("raf_gemini_opened", default=None)


async def _keep_response(response: httpx2.Response) -> None:
    opened = _OPENED.get()
    if opened is not None:
        opened.append(response)


def _new_client(
    api_key: str,
    base_url: str | None,
    api_version: str | None,
    max_retries: int,
    max_response_bytes: int,
) -> genai.Client:
    # A transport of raf's own: the SDK then speaks httpx (not aiohttp, when installed),
    # whose errors raf maps, through one pool. The hook hands a stream its responses.
    # The transport, and the SDK (its httpx clients: verify; its websockets: ssl), take raf's
    # one TLS context: each would read the whole certificate store otherwise (three times per
    # client, about 0.1 s of CPU).
    options = types.HttpOptions(
        base_url=base_url,
        api_version=api_version,
        async_client_args={
            "transport": BoundedTransport(max_response_bytes),
            "event_hooks": {"response": [_keep_response]},
            "verify": tls_context(),
            "ssl": tls_context(),
        },
        retry_options=types.HttpRetryOptions(attempts=max_retries + 1) if max_retries else None,
    )
    return genai.Client(api_key=api_key, vertexai=False, http_options=options)


async def _next(chunks: AsyncIterator[types.GenerateContentResponse]) -> Any:
    return await anext(chunks, None)


async def _watched(responses: list[httpx2.Response], function: Any, *args: Any) -> Any:
    """``await function(*args)``, the HTTP responses the SDK opens meanwhile put in
    ``responses`` (by the client's hook: not with a ``client=`` of yours)."""
    token = _OPENED.set(responses)
    try:
        return await function(*args)
    finally:
        _OPENED.reset(token)


async def _close_all(responses: list[httpx2.Response]) -> None:
    for response in responses:
        await response.aclose()


# --- Messages to the wire ---------------------------------------------------------------


def wire_contents(
    messages: Sequence[ChatMessage],
    history_end: int | None,
) -> tuple[list[types.Part], list[types.Content]]:
    """The parts of the ``system_instruction`` and the ``contents`` of a conversation.

    System messages before ``history_end`` (with none, the leading ones) are the
    system instruction; any other is text in the following user turn. Consecutive
    turns of one role are one turn: the results of parallel calls share one.

    >>> messages = [ChatMessage.system("Be brief."), ChatMessage.user("hi")]
    >>> system, contents = wire_contents(messages, None)
    >>> [part.text for part in system], [(c.role, c.parts[0].text) for c in contents]
    (['Be brief.'], [('user', 'hi')])
    """
    system: list[types.Part] = []
    contents: list[types.Content] = []
    names: dict[str, str] = {}  # call id -> the function it called
    leading = True
    for index, message in enumerate(messages):
        if type(message) is not ChatMessage:
            raise BadRequestError(
                f"messages[{index}] must be a ChatMessage, got {type(message).__name__}"
            )
        leading = leading and message.role == "system"
        stable = leading if history_end is None else index < history_end
        if message.role == "system" and stable:
            if message.content:
                system.append(types.Part(text=message.content))
            continue
        if message.role == "assistant":
            role = "model"
            names |= {call.id: call.name for call in message.tool_calls}
            parts = model_parts(message, index)
        elif message.role == "tool":
            role = "user"
            parts = [_function_response(message, index, names)]
        else:
            role = "user"
            parts = [types.Part(text=message.content)] if message.content else []
        if not parts:
            continue
        if contents and contents[-1].role == role:
            contents[-1].parts = [*(contents[-1].parts or ()), *parts]
        else:
            contents.append(types.Content(role=role, parts=parts))
    if contents and contents[0].role == "model" and _calls_in(contents[0]):
        # Gemini takes a turn of function calls only after a user turn (or the function
        # responses of one): a history cut before its first user message opens with one.
        contents.insert(0, types.Content(role="user", parts=[types.Part(text=EARLIER)]))
    return system, contents


#: The user turn before a history that opens with the model's function calls.
EARLIER: Final = "(The conversation before this point is not shown.)"


def _calls_in(content: types.Content) -> bool:
    return any(part.function_call is not None for part in content.parts or ())


def _function_response(message: ChatMessage, index: int, names: Mapping[str, str]) -> types.Part:
    call_id = message.tool_call_id
    if call_id is None:
        raise BadRequestError(
            f"messages[{index}]: a tool message needs a tool_call_id (the id of the call it "
            "answers)"
        )
    name = names.get(call_id) or message.name
    if not name:
        raise BadRequestError(
            f"messages[{index}]: tool message {call_id!r} answers no call of an earlier "
            "message and has no name; Gemini's functionResponse needs the function's name"
        )
    response = types.FunctionResponse(
        id=None if call_id.startswith(MADE_ID) else call_id,
        name=name,
        response={"output": message.content or ""},
    )
    return types.Part(function_response=response)


def _function_call(call_id: str, name: str, arguments: str, index: int) -> types.Part:
    try:
        args = json.loads(arguments)
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise BadRequestError(
            f"messages[{index}]: the arguments of tool call {call_id!r} are not a JSON "
            f"object, which Gemini's functionCall args must be: {arguments[:80]!r}"
        )
    # An id raf made (the API gave none) is not the API's to see.
    made = call_id.startswith(MADE_ID)
    call = types.FunctionCall(id=None if made else call_id, name=name, args=args)
    return types.Part(function_call=call)


def model_parts(message: ChatMessage, index: int) -> list[types.Part]:
    """The parts of an assistant message: its text and its calls, in the order they came
    with their thought signatures and thoughts when its reasoning is Gemini's (and names
    its calls as they are); reasoning of another source is left out."""
    text = [types.Part(text=message.content)] if message.content else []
    calls = {
        call.id: _function_call(call.id, call.name, call.arguments, index)
        for call in message.tool_calls
    }
    order = _order(message, index)
    if order is None:
        return [*text, *calls.values()]
    parts: list[types.Part] = []
    for entry in order:
        signature = _signature_of(entry, index)
        kind = entry.get("type")
        if kind == "thought":
            parts.append(
                types.Part(
                    text=str(entry.get("text", "")), thought=True, thought_signature=signature
                )
            )
        elif kind == "text" and text:
            parts.append(text.pop().model_copy(update={"thought_signature": signature}))
        elif kind == "call":
            parts.append(calls[entry["id"]].model_copy(update={"thought_signature": signature}))
    if text:  # text the reply did not have: before the calls
        first = next((i for i, p in enumerate(parts) if p.function_call), len(parts))
        parts[first:first] = text
    return parts


def _order(message: ChatMessage, index: int) -> list[dict[str, Any]] | None:
    """The order a Gemini turn kept (see ``_gemini_reply.Reading``), or ``None`` for
    no reasoning, another source's, or a turn whose calls changed since."""
    reasoning = message.reasoning
    if reasoning is None or reasoning.source != SOURCE:
        return None
    try:
        order = json.loads(reasoning.data)
        named = [entry["id"] for entry in order if entry["type"] == "call"]
    except (ValueError, TypeError, KeyError):
        raise BadRequestError(
            f"messages[{index}]: the reasoning (source 'gemini') is not the JSON list of "
            f"entries the Gemini client keeps: {quote(reasoning.data)}"
        ) from None
    if named != [call.id for call in message.tool_calls]:
        return None
    return order if all(isinstance(entry, dict) for entry in order) else None


def _signature_of(entry: Mapping[str, Any], index: int) -> bytes | None:
    signature = entry.get("signature")
    if signature is None:
        return None
    try:
        return base64.b64decode(signature, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise BadRequestError(
            f"messages[{index}]: a thought signature of the reasoning is not base64: "
            f"{quote(str(signature))}"
        ) from None


def declaration(tool: Tool) -> types.FunctionDeclaration:
    """A raf :class:`raf.Tool` as a Gemini function declaration (its JSON schema as is)."""
    return types.FunctionDeclaration(
        name=tool.name,
        description=tool.description or None,
        parameters_json_schema=plain(tool.parameters),
    )


def tool_config(choice: str | Mapping[str, Any] | None) -> types.ToolConfig | None:
    """``options.tool_choice`` as Gemini's function calling config: ``"auto"``,
    ``"none"``, ``"required"`` (mode ``ANY``), a tool's name (``ANY`` with that function
    alone allowed), or a mapping as the ``function_calling_config``."""
    if choice is None:
        return None
    if not isinstance(choice, str):
        return types.ToolConfig(function_calling_config=plain(choice))
    if choice in _MODES:
        mode = _MODES[choice]
        return types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode=mode))
    config = types.FunctionCallingConfig(
        mode=types.FunctionCallingConfigMode.ANY, allowed_function_names=[choice]
    )
    return types.ToolConfig(function_calling_config=config)
