"""Structured output: a type's JSON Schema for the model, and the final answer validated
into the type (told to the model and asked again when it does not fit).

pydantic does the work (``TypeAdapter``), imported on first use: ``import raf``
never imports it, and a run without ``output_type`` never touches this module's
pydantic side.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final

import anyio
import attrs

from raf._agent.tool_loop import run_tool_loop
from raf._values.messages import AgentResponse, ChatMessage, OnUpdate, Usage
from raf._values.schema import accepts_null
from raf.errors import OutputValidationError

__all__: list[str] = []

#: The key a type that is not a JSON object (``int``, ``list[Item]``, a union) is
#: wrapped under: structured-output APIs want an object at the root.
WRAP_KEY: Final = "value"
# Names a json_schema may have at OpenAI: letters, digits, _ and -, at most 64.
_NOT_NAME: Final = re.compile(r"[^a-zA-Z0-9_-]+")
# At most this many problems are told to the model (and kept on the error).
_MAX_PROBLEMS: Final = 20
#: How much of a key, and of a problem's text, a correction quotes.
_MAX_KEY: Final = 60
_MAX_MESSAGE: Final = 200
#: The longest answer validated, in characters (far past any model's output limit): a
#: longer one is refused whole. pydantic's work holds the GIL, so a worker thread alone
#: would not keep the event loop free; this bounds it.
MAX_ANSWER: Final = 1024 * 1024
#: An answer longer than this is checked in a worker thread, off the event loop.
_INLINE: Final = 64 * 1024


@attrs.frozen(slots=True, eq=False)
class OutputSpec:
    """What raf knows of an ``output_type``: the schema the model must answer (always
    a JSON object), a name for it, and how to validate the answer's text."""

    type: Any
    schema: Mapping[str, Any]
    name: str
    wrapped: bool
    adapter: Any = attrs.field(repr=False)
    #: Checked in a worker thread whatever the answer's length: a schema a served client
    #: wrote (its validation is its own program, never run on the event loop).
    in_thread: bool = attrs.field(default=False, kw_only=True)

    def validate(self, text: str) -> Any:
        """``text`` (JSON) as a value of the type; ``pydantic.ValidationError`` if it is not.

        A ``null`` for a property that is optional and does not allow ``null``
        means "use its default": what a strict schema (every property
        required, optional ones nullable) makes a model write for a value it
        leaves out.
        """
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None  # pydantic says what is wrong with it
        else:
            if _drop_nulls(data, self.schema, self.schema.get("$defs", {})):
                text = json.dumps(data)
        value = self.adapter.validate_json(text)
        return getattr(value, WRAP_KEY) if self.wrapped else value


def _drop_nulls(data: Any, schema: Any, defs: Mapping[str, Any], depth: int = 0) -> bool:
    """Remove from ``data`` (in place) each ``null`` of an optional property whose schema
    does not allow ``null``; whether any was removed."""
    schema = _followed(schema, defs)
    if not isinstance(schema, Mapping) or depth > 64:
        return False
    changed = False
    properties = schema.get("properties")
    if isinstance(data, dict) and isinstance(properties, Mapping):
        required = schema.get("required", ())
        # The answer's keys, not the schema's: a served schema of 10,000 properties over
        # an answer of many small objects was 10,000 look-ups an object.
        for key in [key for key in data if key in properties]:
            sub = properties[key]
            if data[key] is None and not _allows_null(sub, defs) and key not in required:
                del data[key]
                changed = True
            else:
                changed |= _drop_nulls(data[key], sub, defs, depth + 1)
    elif isinstance(data, list) and isinstance(schema.get("items"), Mapping):
        for item in data:
            changed |= _drop_nulls(item, schema["items"], defs, depth + 1)
    return changed


def _allows_null(schema: Any, defs: Mapping[str, Any]) -> bool:
    return accepts_null(_followed(schema, defs))


def _followed(schema: Any, defs: Mapping[str, Any]) -> Any:
    """``schema`` with its ``$ref``s to ``defs`` followed; ``None`` at a cycle of them (a
    served client's ``{"A": {"$ref": "#/$defs/A"}}`` was followed for ever)."""
    seen: set[str] = set()
    while isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        name = schema["$ref"].rpartition("/")[2]
        if name in seen:
            return None
        seen.add(name)
        schema = defs.get(name)
    return schema


_SPECS: dict[Any, OutputSpec] = {}


def output_spec(output_type: Any) -> OutputSpec:
    """The :class:`OutputSpec` of ``output_type``, built once per type.

    A type pydantic cannot make a schema of is a ``TypeError`` that says why.
    An :class:`OutputSpec` is its own (a served client's schema comes as one).
    """
    if isinstance(output_type, OutputSpec):
        return output_type
    try:
        return _SPECS[output_type]
    except KeyError:
        pass
    except TypeError:  # an unhashable type form: built each time, not cached
        return _build(output_type)
    spec = _SPECS[output_type] = _build(output_type)
    return spec


def _build(output_type: Any) -> OutputSpec:
    import pydantic

    try:
        adapter: Any = pydantic.TypeAdapter(output_type)
        schema = adapter.json_schema()
    except (pydantic.PydanticUserError, pydantic.errors.PydanticSchemaGenerationError) as exc:
        raise TypeError(f"output_type {output_type!r} cannot be used: {exc}") from exc
    name = _name(output_type, schema)
    if schema.get("type") == "object" and "properties" in schema:
        return OutputSpec(output_type, schema, name, False, adapter)
    wrapper = pydantic.create_model(name, **{WRAP_KEY: (output_type, ...)})  # type: ignore[call-overload]
    adapter = pydantic.TypeAdapter(wrapper)
    return OutputSpec(output_type, adapter.json_schema(), name, True, adapter)


def _name(output_type: Any, schema: Mapping[str, Any]) -> str:
    """A name for the schema: a model's title, else the type's (``list[int]``: ``list_int``)."""
    title = schema.get("title")
    if isinstance(title, str) and title and schema.get("type") == "object":
        raw = title
    else:
        raw = _type_name(output_type)
    return output_name(raw)


def output_name(raw: str) -> str:
    """``raw`` as a schema's name a structured-output API takes (letters, digits, _ and -)."""
    name = _NOT_NAME.sub("_", raw).strip("_")[:64]
    return name or "output"


def _type_name(form: Any) -> str:
    args = typing.get_args(form)
    origin = typing.get_origin(form)
    if origin is None or not args:
        return str(getattr(form, "__name__", form))
    return "_".join([_type_name(origin), *(_type_name(arg) for arg in args)])


def problems_of(error: Any) -> tuple[str, ...]:
    """A ``pydantic.ValidationError`` as ``"path: what is wrong"`` lines (at most 20);
    the path is the answer's own (``value.2.qty`` for a wrapped ``list[Item]``)."""
    found: list[str] = []
    # pydantic builds every error (1M for a long wrong list); without their inputs and
    # contexts it builds them in about a third of the time.
    errors = error.errors(include_url=False, include_context=False, include_input=False)
    for item in errors[:_MAX_PROBLEMS]:
        location = [_part(part) for part in item.get("loc", ())]
        path = ".".join(location) or "(the whole answer)"
        found.append(f"{path}: {_short(str(item.get('msg', 'invalid')), _MAX_MESSAGE)}")
    return tuple(found)


def _part(part: object) -> str:
    """One step of a path, as the correction names it: a key the model made up (any
    length, any characters) is quoted and cut, so what the history stores stays short."""
    text = str(part)
    if isinstance(part, int) or (text.isidentifier() and len(text) <= _MAX_KEY):
        return text
    return repr(_short(text, _MAX_KEY))


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def correction(problems: Sequence[str], wrapped: bool) -> str:
    """What the model is told when its answer does not fit the schema."""
    lines = "\n".join(f"- {problem}" for problem in problems)
    shape = f'a JSON object {{"{WRAP_KEY}": ...}}' if wrapped else "a JSON object"
    return (
        "Your answer does not match the required JSON schema:\n"
        f"{lines}\n"
        f"Answer again with only {shape} that matches the schema, nothing else."
    )


@attrs.frozen(slots=True)
class _Rejected:
    problems: tuple[str, ...]
    error: BaseException | None


async def check_answer(spec: OutputSpec, text: str) -> Any:
    """``text`` validated into ``spec``'s type, or a :class:`_Rejected` saying why not.

    A long answer is checked in a worker thread (its JSON walk yields the GIL,
    so the event loop's other tasks go on), and one over :data:`MAX_ANSWER` is
    not checked at all: pydantic would build an error for each wrong item
    (seconds for a million) where the model is told twenty. A spec ``in_thread``
    is checked in a worker thread whatever the length.
    """
    if len(text) <= _INLINE and not spec.in_thread:
        return _check(spec, text)
    return await anyio.to_thread.run_sync(_check, spec, text)


def _check(spec: OutputSpec, text: str) -> Any:
    import pydantic

    if len(text) > MAX_ANSWER:
        problem = (
            f"(the whole answer): it is {len(text)} characters long, over the limit of "
            f"{MAX_ANSWER} characters"
        )
        return _Rejected((problem,), None)
    try:
        return spec.validate(text)
    except pydantic.ValidationError as exc:
        return _Rejected(problems_of(exc), exc)


Loop = Callable[..., Awaitable[AgentResponse]]


def structured_loop(output_type: Any, retries: int) -> Loop:
    """The tool loop of a run that asks for ``output_type``: its answer validated."""
    if output_type is str:  # the text is the output: nothing to ask for, nothing to check
        return _text_loop
    return partial(validated_loop, run_tool_loop, output_spec(output_type), retries)


async def _text_loop(*args: Any, **kwargs: Any) -> AgentResponse:
    response = await run_tool_loop(*args, **kwargs)
    return attrs.evolve(response, output=response.text)


async def validated_loop(
    loop: Loop,
    spec: OutputSpec,
    retries: int,
    chat: Any,
    messages: Sequence[ChatMessage],
    options: Any,
    tools: Mapping[str, Any],
    max_tool_iterations: int,
    on_update: OnUpdate | None = None,
    **kwargs: Any,
) -> AgentResponse:
    """The tool loop, then its final answer validated into ``spec``'s type.

    An answer that does not validate is told to the model as a user message
    naming each problem, and the loop runs again (tool calls and all), up to
    ``retries`` more times; then :class:`raf.errors.OutputValidationError`. The
    response holds every message of every attempt (the rejected answers and
    the corrections too: the model saw them, so a history must keep them) and
    the summed usage; ``output`` is the validated value.
    """
    produced: list[ChatMessage] = []
    usage: Usage | None = None
    attempt = 0
    while True:
        response = await loop(
            chat, messages, options, tools, max_tool_iterations, on_update, **kwargs
        )
        produced.extend(response.messages)
        if response.usage is not None:
            usage = response.usage if usage is None else usage + response.usage
        if response.pending:  # the run stops before calls that wait: no final answer yet
            return attrs.evolve(response, messages=tuple(produced), usage=usage)
        text = response.text
        value = await check_answer(spec, text)
        if isinstance(value, _Rejected):
            problems = value.problems
            attempt += 1
            if attempt > retries:
                raise OutputValidationError(text, problems, attempt) from value.error
            told = ChatMessage.user(correction(problems, spec.wrapped))
            produced.append(told)
            messages = (*messages, *response.messages, told)
            continue
        return AgentResponse(
            tuple(produced), usage, response.raw, output=value, model=response.model
        )


def answer_json(value: Any, spec: OutputSpec) -> str:
    """The JSON text a model answers ``value`` with under ``spec`` (what a scripted
    model says): wrapped when the type is."""
    import pydantic_core

    plain = pydantic_core.to_jsonable_python(value)
    return json.dumps({WRAP_KEY: plain} if spec.wrapped else plain)
