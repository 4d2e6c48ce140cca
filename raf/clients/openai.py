"""OpenAIChatClient: a chat model behind the OpenAI chat completions API."""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from raf.errors import (
    AuthenticationError,
    BadRequestError,
    ChatClientError,
    ChatConnectionError,
    ChatTimeoutError,
    RateLimitError,
    ServerError,
)
from raf.messages import AgentResponse, ChatMessage, ToolCall, Usage
from raf.options import ChatOptions
from raf.tools import Tool

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIChatClient", "error_from_sdk", "message_to_wire", "tool_to_wire"]

# The SDK takes ~0.6 s to import; raf imports it only when a client is built.
_TOOL_CHOICE_WORDS: Final = frozenset({"auto", "none", "required"})
# Options that would make the SDK return a stream, which complete() cannot read.
_REFUSED_EXTRA: Final = frozenset({"stream", "stream_options"})


class OpenAIChatClient:
    """A :class:`raf.ChatClient` on ``openai.AsyncOpenAI`` (chat completions, tools).

    ``model`` is used unless a run's ``AgentRunOptions.model`` names another.
    ``base_url`` and ``api_key`` default to the ``OPENAI_BASE_URL`` and
    ``OPENAI_API_KEY`` environment variables, as with the SDK itself, so any
    OpenAI-compatible server works. ``max_retries`` is the SDK's own retry
    budget for rate limits, timeouts and server errors; set it to ``0`` when a
    :class:`raf.RetryMiddleware` does the retrying. ``client`` is an
    ``AsyncOpenAI`` you built yourself (timeouts, proxies, headers); raf then
    leaves closing it to you.

    Failures raise :class:`raf.ChatClientError` subclasses whose ``retryable``
    says whether trying again can help; the SDK's exception is ``__cause__``.
    Close the client with ``await client.aclose()`` or ``async with``::

        async with OpenAIChatClient("gpt-4o-mini") as model:
            agent = Agent(model, instructions="Be brief.")
            print((await agent.run("Hello!")).text)
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 2,
        client: openai.AsyncOpenAI | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"OpenAIChatClient: model must be a non-empty str, got {model!r}")
        if type(max_retries) is not int or max_retries < 0:
            raise ValueError(
                f"OpenAIChatClient: max_retries must be an int >= 0, got {max_retries!r}"
            )
        import openai

        self.model = model
        if client is None:
            try:
                client = openai.AsyncOpenAI(
                    base_url=base_url, api_key=api_key, max_retries=max_retries
                )
            except openai.OpenAIError as exc:
                raise AuthenticationError(
                    f"OpenAIChatClient({model!r}): cannot build the OpenAI client: {exc}"
                ) from exc
            self._owns_client = True
        else:
            if base_url is not None or api_key is not None:
                raise ValueError(
                    "OpenAIChatClient: pass base_url and api_key to the AsyncOpenAI client "
                    "you give as client=, not to OpenAIChatClient"
                )
            self._owns_client = False
        self.client: openai.AsyncOpenAI = client
        self._create = client.chat.completions.create
        self._known_parameters = frozenset(inspect.signature(self._create).parameters)

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        """Send one chat completion request and return the model's turn."""
        import openai

        request = self.request_parameters(messages, options)
        model = request["model"]
        try:
            completion = await self._create(**request)
        except openai.OpenAIError as exc:
            raise error_from_sdk(exc, model) from exc
        return response_from_completion(completion, model)

    def request_parameters(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for one call.

        ``options.extra`` is applied last: keys the SDK knows (``top_p``,
        ``seed``, ``response_format``, ``timeout``, ``extra_headers``...) are
        passed as they are, any other key goes into the request body.
        """
        request: dict[str, Any] = {
            "model": options.model or self.model,
            "messages": [message_to_wire(m, index) for index, m in enumerate(messages)],
        }
        if options.tools:
            request["tools"] = [tool_to_wire(t) for t in options.tools]
        if options.temperature is not None:
            request["temperature"] = options.temperature
        if options.max_tokens is not None:
            request["max_tokens"] = options.max_tokens
        if options.tool_choice is not None:
            request["tool_choice"] = _tool_choice(options.tool_choice)
        body: dict[str, Any] = {}
        for key, value in options.extra.items():
            if key in _REFUSED_EXTRA and value:
                raise BadRequestError(
                    f"OpenAIChatClient: extra option {key!r} is not supported; "
                    "raf reads whole chat completions, not streams"
                )
            if key in self._known_parameters and key != "extra_body":
                request[key] = value
            elif key == "extra_body":
                if not isinstance(value, Mapping):
                    raise BadRequestError(
                        f"OpenAIChatClient: extra option 'extra_body' must be a mapping, "
                        f"got {type(value).__name__}"
                    )
                body.update(value)
            else:
                body[key] = value
        if body:
            request["extra_body"] = body
        return request

    async def aclose(self) -> None:
        """Close the HTTP connections (not those of a ``client=`` you passed in)."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> OpenAIChatClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"OpenAIChatClient(model={self.model!r}, base_url={str(self.client.base_url)!r})"


def message_to_wire(message: ChatMessage, index: int = 0) -> dict[str, Any]:
    """One message in the OpenAI wire format.

    >>> message_to_wire(ChatMessage.tool("call_1", "42"))
    {'role': 'tool', 'tool_call_id': 'call_1', 'content': '42'}
    """
    role = message.role
    if role == "tool":
        if message.tool_call_id is None:
            raise BadRequestError(
                f"messages[{index}]: a tool message needs a tool_call_id (the id of the call "
                "it answers)"
            )
        return {
            "role": "tool",
            "tool_call_id": message.tool_call_id,
            "content": message.content or "",
        }
    wire: dict[str, Any] = {"role": role}
    if role == "assistant" and message.tool_calls:
        wire["content"] = message.content
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    else:
        wire["content"] = message.content or ""
    if message.name is not None:
        wire["name"] = message.name
    return wire


def tool_to_wire(tool: Tool) -> dict[str, Any]:
    """A raf :class:`raf.Tool` as an OpenAI function tool with its JSON Schema."""
    function: dict[str, Any] = {"name": tool.name, "parameters": _plain(tool.parameters)}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def response_from_completion(completion: Any, model: str) -> AgentResponse:
    """The assistant turn, usage and raw response of a ``ChatCompletion``."""
    if not completion.choices:
        raise ChatClientError(f"OpenAI model {model!r} returned no choices")
    message = completion.choices[0].message
    calls = []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)
        if function is None:
            raise ChatClientError(
                f"OpenAI model {model!r} returned a {call.type!r} tool call; raf supports "
                "function tool calls only"
            )
        calls.append(ToolCall(call.id, function.name, function.arguments or "{}"))
    text = message.content
    if text is None and not calls:
        # A refusal is what the user should read when there is no answer.
        text = getattr(message, "refusal", None)
    usage = None
    if completion.usage is not None:
        usage = Usage(completion.usage.prompt_tokens or 0, completion.usage.completion_tokens or 0)
    return AgentResponse((ChatMessage.assistant(text, tool_calls=calls),), usage, completion)


def error_from_sdk(exc: openai.OpenAIError, model: str) -> ChatClientError:
    """The :class:`raf.ChatClientError` for an OpenAI SDK error."""
    import openai

    where = f"OpenAI chat completion (model {model!r})"
    if isinstance(exc, openai.APITimeoutError):
        return ChatTimeoutError(f"{where} timed out: {exc}")
    if isinstance(exc, openai.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
        return ChatConnectionError(f"{where}: cannot reach {exc.request.url}: {exc}{cause}")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        text = f"{where} failed with HTTP {status}: {exc.message}"
        if status == 429:
            return RateLimitError(text, status_code=status)
        if status == 408:
            return ChatTimeoutError(text, status_code=status)
        if status == 409 or status >= 500:
            return ServerError(text, status_code=status)
        if status in (401, 403):
            return AuthenticationError(text, status_code=status)
        return BadRequestError(text, status_code=status)
    return ChatClientError(f"{where} failed: {type(exc).__name__}: {exc}")


def _tool_choice(choice: str | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice in _TOOL_CHOICE_WORDS:
            return choice
        return {"type": "function", "function": {"name": choice}}
    plain: dict[str, Any] = _plain(choice)
    return plain


def _plain(value: Any) -> Any:
    # Schemas may hold read-only mappings and tuples; the wire wants dicts and lists.
    return json.loads(json.dumps(value, default=_not_json))


def _not_json(value: object) -> Any:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON serialisable in a tool schema: {value!r}")
