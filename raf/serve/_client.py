"""What a client brings to a served run: its tools, its tool choice, its output format.

A client tool is offered to the model beside the agent's own, but raf never
runs it: its ``runs_on_client`` makes the tool loop end the turn with the
call (see :func:`raf._agent.deferred.deferral`), the response carries
it, and the client's next request brings the result as a ``tool`` message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import anyio
import attrs

from raf._agent.output import OutputSpec
from raf._agent.tools import check_tool_schema
from raf._clients.openai import OpenAIChatClient
from raf._clients.responses import OpenAIResponsesClient
from raf._values.messages import AgentResponse, ToolCall
from raf._values.options import AgentRunOptions
from raf._values.protocols import Tool
from raf.errors import ToolSchemaError
from raf.serve._http import HttpError
from raf.serve._schema import check_size, client_output

__all__: list[str] = []

_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_CHOICE_WORDS: Final = frozenset({"auto", "none", "required"})
#: Separates the texts of two model calls of one turn, in the answer and in its stream.
TEXT_JOIN: Final = "\n\n"
#: The fields of a body that carry a client's JSON Schemas (tools, an output format).
_SCHEMA_FIELDS: Final = ("tools", "response_format", "text")

T = TypeVar("T")


async def parsed(parse: Callable[..., T], body: Any, *args: Any) -> T:
    """``parse(body, *args)``; in a worker thread when the body carries a client's JSON
    Schemas: checking them against their metaschema is pure Python (about 1 ms a
    property) that never runs on the event loop."""
    if isinstance(body, dict) and any(body.get(field) for field in _SCHEMA_FIELDS):
        return await anyio.to_thread.run_sync(parse, body, *args)
    return parse(body, *args)


@attrs.frozen
class ClientTool:
    """A tool of the client's: offered to the model, run by the client, never here."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    runs_on_client: bool = True

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        raise RuntimeError(f"tool {self.name!r} is the client's: the server never runs it")


def client_tools(value: Any, agent_tools: Sequence[Tool], where: str = "tools") -> tuple[Tool, ...]:
    """A request's ``tools`` (OpenAI function tools) as :class:`ClientTool`; 400 when one
    is malformed, named twice, or named like one of the agent's own."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise HttpError(400, f"'{where}' must be a list of function tools")
    taken = {tool.name for tool in agent_tools}
    check_size(value, where)  # every tool's schema is checked: their sum is bounded
    tools: dict[str, Tool] = {}
    for index, item in enumerate(value):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or item.get("type", "function") != "function":
            shape = "{type: 'function', function: {name, description, parameters}}"
            raise HttpError(400, f"{where}[{index}] must be {shape}")
        tool = _tool(function, f"{where}[{index}].function")
        if tool.name in taken:
            raise HttpError(
                400, f"{where}[{index}]: {tool.name!r} is the name of one of the agent's own tools"
            )
        if tool.name in tools:
            raise HttpError(400, f"{where}[{index}]: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tuple(tools.values())


def _tool(function: Mapping[str, Any], where: str) -> ClientTool:
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise HttpError(400, f"{where}.name must be 1 to 64 letters, digits, '_' or '-'")
    description = function.get("description") or ""
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(description, str) or not isinstance(parameters, dict):
        raise HttpError(400, f"{where}: description must be a string, parameters an object")
    try:
        check_tool_schema(name, parameters)
    except ToolSchemaError as exc:
        raise HttpError(400, f"{where}.parameters: {exc.problem:.200}") from None
    return ClientTool(name, description, parameters)


def tool_choice(value: Any, tools: Sequence[Tool]) -> str | None:
    """A request's ``tool_choice`` as raf's: a word, or the name of an offered tool."""
    if value is None:
        return None
    if isinstance(value, str) and value in _CHOICE_WORDS:
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        shape = "{type: 'function', function: {name}}"
        raise HttpError(400, f"'tool_choice' must be auto, none, required or {shape}")
    if name not in {tool.name for tool in tools}:
        raise HttpError(400, f"'tool_choice' names {name!r:.80}, which is not an offered tool")
    return name


@attrs.frozen
class _JsonObject:
    """A request's ``json_object`` format, until :func:`run_options` knows the model's API."""


#: ``response_format: {"type": "json_object"}``: the answer is a JSON object, any object.
JSON_OBJECT: Final = _JsonObject()
#: Any object: raf checks the answer is one (its properties named, here none, so the answer
#: is the object itself, not wrapped under "value"); OpenAI's JSON mode goes over it.
_ANY_OBJECT: Final = {"type": "object", "properties": {}}
#: How each OpenAI API asks for JSON mode (over the strict schema the client sends).
_JSON_MODE: Final = (
    (OpenAIChatClient, {"response_format": {"type": "json_object"}}),
    (OpenAIResponsesClient, {"text": {"format": {"type": "json_object"}}}),
)


def parallel_calls(value: Any) -> dict[str, Any]:
    """A request's ``parallel_tool_calls`` as run-option overrides: ``false`` asks the model
    for one call a turn (LangChain's ``with_structured_output`` sends it); ``true`` is what
    a model does anyway."""
    if value is None or value is True:
        return {}
    if value is not False:
        raise HttpError(400, "'parallel_tool_calls' must be a boolean")
    return {"extra": {"parallel_tool_calls": False}}


def run_options(
    base: AgentRunOptions, overrides: Mapping[str, Any], client: Any
) -> AgentRunOptions:
    """``base`` with what a request sets; a request's ``extra`` goes over ``base.extra``.

    A ``json_object`` format asks for any JSON object: with OpenAI's own JSON mode on
    its APIs, by the schema of an object elsewhere; raf checks the answer is one.

    ``parallel_tool_calls`` reaches only a client of OpenAI's APIs (chat completions,
    Responses), whose body has that field: Anthropic's switch lives inside its tool
    choice and Gemini has none, and either would refuse the unknown field.
    """
    if not overrides:
        return base
    extra = dict(overrides.get("extra", {}))
    if not isinstance(client, (OpenAIChatClient, OpenAIResponsesClient)):
        extra.pop("parallel_tool_calls", None)
    fields = {k: v for k, v in overrides.items() if k != "extra"}
    if fields.get("output_type") is JSON_OBJECT:
        # OpenAI's APIs: their JSON mode over the schema (a strict object without named
        # fields would be the empty object alone); other models get the schema.
        fields["output_type"] = client_output(_ANY_OBJECT, "json_object", "response_format")
        extra |= next((mode for kind, mode in _JSON_MODE if isinstance(client, kind)), {})
    if extra:
        fields["extra"] = {**base.extra, **extra}
    return attrs.evolve(base, **fields)


def output_type(value: Any, where: str = "response_format") -> OutputSpec | _JsonObject | None:
    """A request's ``response_format`` as a run's ``output_type`` (``None`` for text); its
    schema checked here (see :mod:`raf.serve._schema`), a 400 naming what is wrong;
    ``json_object`` is made one by :func:`run_options`, which knows the model's API."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT  # made a run's output type by run_options, for the model's API
    spec = value.get("json_schema") if kind == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(schema, dict):
        raise HttpError(
            400, f"'{where}' must be text or {{type: 'json_schema', json_schema: {{schema}}}}"
        )
    name = spec.get("name")
    return client_output(schema, name if isinstance(name, str) and name else "output", where)


def client_calls(response: AgentResponse, tools: Sequence[Tool]) -> tuple[ToolCall, ...]:
    """The calls of client tools the turn ended with (they wait for the client)."""
    names = {tool.name for tool in tools}
    last = next((m for m in reversed(response.messages) if m.role == "assistant"), None)
    if last is None or not names:
        return ()
    return tuple(call for call in last.tool_calls if call.name in names)


def turn_text(response: AgentResponse) -> str:
    """The answer's text: every assistant text of the turn, joined by a blank line.

    A structured answer is its JSON text alone (a rejected attempt is not it).
    """
    if response.output is not None:
        return response.text
    texts = [m.content for m in response.messages if m.role == "assistant" and m.content]
    return TEXT_JOIN.join(texts)
