"""A forked child's prompt: the parent's last prompt byte for byte, then the child's own.

An agent called as a tool with ``context="forked"`` (``agent.as_tool()``)
starts from the prompt of the parent's model call that asked for it: the
same tools in the same order, the same messages (system prompt, history,
tail, request, the tool loop's turns so far). A prompt cache keyed by the
prefix (OpenAI's, Anthropic's, Gemini's) then serves all of it. What is the
child's own comes after: its tools that the parent does not have (after the
parent's: they change the tools block, which the ledger shows), then its own
messages as it would send them alone (its system message, its history, its
tail, the task). The calls carry the parent's ``session_id`` and
``agent_name``, so the OpenAI clients send the parent's ``prompt_cache_key``
and the provider routes the child to the cache its parent filled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from raf._values.context import ChatRequest
from raf._values.messages import ChatMessage
from raf._values.options import ChatOptions
from raf._values.protocols import Tool
from raf.errors import ToolConflictError, ToolError

__all__: list[str] = []


def forked_prompt(
    fork: ChatRequest,
    messages: Sequence[ChatMessage],
    options: ChatOptions,
    tools: Mapping[str, Tool],
) -> tuple[tuple[ChatMessage, ...], ChatOptions, dict[str, Tool]]:
    """The child's first prompt (``messages``, ``options``) behind the parent's ``fork``,
    and the tools the child may call by name.

    The parent's tools are offered as they were; a call of one that is not
    the child's own (by name, and the same definition) is answered with an
    error: a child runs only the tools it was given, through its own tool
    stack. A tool of the child's that has a parent's name with another
    definition is a :class:`raf.errors.ToolConflictError`.
    """
    prefix = tuple(fork.messages)
    offered = list(fork.options.tools)
    index: dict[str, Tool] = {}
    for tool in offered:
        own = tools.get(tool.name)
        if own is None:
            index[tool.name] = NotTheChilds(tool)
        elif own is tool or _definition(own) == _definition(tool):
            index[tool.name] = own
        else:
            raise ToolConflictError(tool.name, "the forked parent's prompt", "the child agent")
    for name, tool in tools.items():
        if name not in index:
            offered.append(tool)
            index[name] = tool
    own_end = options.history_end
    forked = attrs.evolve(
        options,
        tools=tuple(offered),
        history_end=len(prefix) + (own_end or 0),
        session_id=fork.options.session_id,
        agent_name=fork.options.agent_name,
    )
    return prefix + tuple(messages), forked, index


def _definition(tool: Tool) -> tuple[str, str, Any]:
    return (tool.name, tool.description, tool.parameters)


@attrs.frozen(slots=True)
class NotTheChilds:
    """A parent's tool in a forked child's prompt that the child was not given: offered
    as the parent offered it (the same bytes), refused when called."""

    tool: Tool

    @property
    def name(self) -> str:
        """The parent's tool's name."""
        return self.tool.name

    @property
    def description(self) -> str:
        """The parent's tool's description."""
        return self.tool.description

    @property
    def parameters(self) -> Mapping[str, Any]:
        """The parent's tool's parameters."""
        return self.tool.parameters

    async def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Refuse: the tool is the parent's."""
        raise ToolError(
            f"{self.tool.name!r} is a tool of the agent this one was forked from, and this "
            "agent may not call it: use your own tools, or answer with what you know"
        )
