"""The knobs of a run (AgentRunOptions) and of one model call (ChatOptions)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from raf._values.protocols import Tool

__all__ = ["AgentRunOptions", "ChatOptions"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _frozen_mapping(value: Mapping[str, Any]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"extra must be a mapping, got {type(value).__name__}")
    return MappingProxyType(dict(value)) if value else _EMPTY


def _tools(value: Iterable[Tool]) -> tuple[Tool, ...]:
    return tuple(value)


def _not_negative(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be an int >= 0, got {value!r}")


def _positive(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


@attrs.frozen(slots=True)
class AgentRunOptions:
    """Options of one run; ``None`` leaves the choice to the chat client.

    ``max_tool_iterations`` counts model calls: a run makes at most that many.
    ``extra`` is passed through to the chat client untouched.

    ``output_type`` asks for structured output (``agent.run(..., output_type=T)``
    sets it): a pydantic model, a dataclass, a ``TypedDict`` or a plain type
    (``int``, ``list[Item]``); the chat client gets its JSON Schema as
    :attr:`ChatOptions.output_schema`. ``output_retries`` is how many more
    times a final answer that does not validate is told to the model and
    asked for again (see ``docs/structured-output.md``). ``tool_choice``
    applies to the first model call of the run; the later calls of its tool
    loop are ``"auto"``, so a required tool cannot loop forever.

    ``tools`` are offered to the model in this run only, beside the agent's
    and its providers' (a served agent's client tools); a name taken already
    is a :class:`raf.errors.ToolConflictError`.

    >>> AgentRunOptions(model="gpt-4o-mini", temperature=0.0).max_tool_iterations
    10
    """

    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    max_tool_iterations: int = attrs.field(default=10, validator=_positive)
    extra: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    output_type: Any = None
    output_retries: int = attrs.field(default=1, validator=_not_negative)
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_tools)

    def __reduce__(self) -> tuple[Any, ...]:
        # extra is a read-only mapping proxy, which cannot pickle (a durable run's options
        # cross DBOS pickled): rebuilt from a dict, through the converter.
        fields = (self.model, self.temperature, self.max_tokens, self.tool_choice)
        output = (self.output_type, self.output_retries, self.tools)
        return (AgentRunOptions, (*fields, self.max_tool_iterations, dict(self.extra), *output))


@attrs.frozen(slots=True)
class ChatOptions:
    """What a chat client gets with the messages: the run's options and the tools.

    ``output_schema``, when set, is the JSON Schema (an object) the final
    answer must match (the run's ``output_type``): a client that can ask the
    model for it does (OpenAI's structured outputs); others ignore it, and
    raf validates the answer either way.

    ``history_end`` is the index, in the messages the client receives, just
    past the last history message (the messages the providers injected):
    where the volatile tail, or else the request, begins (a tail without
    history: just past the system message); ``None`` when nothing was
    injected. Everything before it is the stable prefix a provider can serve
    from its cache: a client that places cache
    breakpoints puts the last one before the volatile part here. The tool
    loop keeps it as it is across its calls. ``session_id`` and
    ``agent_name`` say whose call this is (the OpenAI clients derive their
    ``prompt_cache_key`` from them); all three are ``None`` for a call made
    outside a run.

    ``compact_threshold`` asks a client whose server compacts a conversation
    itself (:class:`raf.OpenAIResponsesClient`, :class:`raf.AnthropicChatClient`)
    to have it compacted once the prompt passes that many tokens (see
    :class:`raf.CompactionMiddleware`, which sets it); other clients ignore it.
    """

    model: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    tool_choice: str | Mapping[str, Any] | None = None
    extra: Mapping[str, Any] = attrs.field(default=_EMPTY, converter=_frozen_mapping)
    tools: tuple[Tool, ...] = ()
    output_schema: Mapping[str, Any] | None = None
    history_end: int | None = attrs.field(default=None, kw_only=True)
    session_id: str | None = attrs.field(default=None, kw_only=True)
    agent_name: str | None = attrs.field(default=None, kw_only=True)
    compact_threshold: int | None = attrs.field(default=None, kw_only=True)

    @classmethod
    def from_run(
        cls,
        options: AgentRunOptions,
        tools: tuple[Tool, ...],
        default_model: str | None = None,
        output_schema: Mapping[str, Any] | None = None,
        *,
        history_end: int | None = None,
        session_id: str | None = None,
        agent_name: str | None = None,
    ) -> ChatOptions:
        """The chat options for a run with ``options`` offering ``tools``.

        ``default_model`` (the client's own) stands in for a run that names
        none, so the chat stack sees the model the call will use;
        ``output_schema`` is the schema of ``options.output_type``, made by
        the agent (a value does not build schemas); the keywords are the
        fields of the same names.
        """
        return cls(
            options.model if options.model is not None else default_model,
            options.temperature,
            options.max_tokens,
            options.tool_choice,
            options.extra,
            tools,
            output_schema,
            history_end=history_end,
            session_id=session_id,
            agent_name=agent_name,
        )
