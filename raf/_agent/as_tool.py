"""AgentTool: an agent as a tool another agent calls (``agent.as_tool()``).

The calling agent's model writes a task; the tool runs the agent on it, as a
run of its own nested in the caller's tool call, and answers with its final
text. What the child needs of its caller comes from the call's
:class:`raf.ToolRequest`: the caller's run (:class:`raf.Run`), whose sink
the child's updates go to, tagged with the call, whose usage the child's
model calls join, whose last prompt a forked child starts from
(``raf._agent.fork``), and whose served key scope (``KEY_SCOPE``) scopes the child's
memories and budgets too. The child's runs also pass through the caller's
observers that watch agent tools (``Observer.watches_agent_tools``), so the
caller's :class:`raf.observe.ContextLedger` records them under the tool's
name.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Final, Literal, Protocol

import attrs

from raf._sessions.fork import carry_spilled
from raf._sessions.memory import InMemorySession
from raf._values.context import ChatRequest, ToolRequest
from raf._values.messages import AgentResponse, OnUpdate, ToolCall, Update
from raf._values.run import KEY_SCOPE, Run
from raf.errors import ToolArgumentsError, ToolError

__all__ = ["AgentTool"]

Context = Literal["isolated", "forked"]
CONTEXTS: Final = ("isolated", "forked")
# What every vendor takes as a function's name (OpenAI, Anthropic, Gemini alike).
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Copies of the child kept per set of callers' observers (a handful in a real program).
_MAX_COPIES: Final = 8


class RunsAgent(Protocol):
    """What an :class:`AgentTool` needs of the agent it runs (:class:`raf.Agent` is one)."""

    @property
    def name(self) -> str | None: ...

    @property
    def observers(self) -> tuple[Any, ...]: ...

    @property
    def chat_stack(self) -> tuple[Any, ...]: ...

    def replace(self, **changes: Any) -> Any: ...

    async def run(self, messages: str, *, session: Any = ..., on_update: Any = ...) -> Any: ...


@attrs.frozen(eq=False, repr=False)
class AgentTool:
    """An agent as a :class:`raf.Tool` another agent calls; made by :meth:`raf.Agent.as_tool`.

    Its one parameter is ``task``, the text the calling model writes: the
    child's request. Its result is the child's final answer text. With
    ``context="isolated"`` the child sees nothing but the task (its own
    instructions, tools and providers around it, in a session of its own
    for this call); with ``"forked"`` its prompts begin with the caller's
    last prompt, byte for byte, then the task (see ``docs/multi-agent.md``
    for what the child's own instructions and tools do there).

    Inside a run (the tool stack's core calls :meth:`invoke_request`), the
    child's model calls count in the caller's usage, pass through the
    caller's observers that watch agent tools (its context ledger) and,
    streamed, reach the caller's consumer as ``"agent"`` updates tagged
    with the call; a cancelled or closed caller
    cancels the child, whose post stages run. What fails in the child is
    told to the calling model as the call's error, by raf's tool rules.
    """

    #: The agent that runs the task.
    agent: RunsAgent
    #: The tool's name, as the calling model sees it.
    name: str
    #: What the calling model reads about the tool.
    description: str
    #: ``"isolated"`` or ``"forked"``.
    context: Context
    #: The JSON Schema of the arguments: ``{"task": str}``.
    parameters: Mapping[str, Any]
    # The child with a caller's observers: per tuple of those observers' ids, with them.
    _copies: dict[tuple[int, ...], tuple[tuple[Any, ...], Any]] = attrs.field(
        factory=dict, init=False
    )

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Run the agent on ``arguments["task"]`` outside any run of a caller (isolated)."""
        task = _task(self.name, arguments)
        if self.context == "forked":
            raise ToolError(
                f"{self.name!r} is forked from its caller's prompt: it runs only as the tool "
                "of an agent's run"
            )
        return _answer(self.name, await self.agent.run(task, session=InMemorySession()))

    async def invoke_request(self, request: ToolRequest) -> str:
        """Run the agent on the task of ``request``, nested in the caller's run."""
        task = _task(self.name, request.arguments)
        caller = request.invocation
        parent = caller.run
        if any(call.name == self.name for call in parent.lineage):
            raise ToolError(
                f"{self.name!r} is already running further up this chain of agents: "
                "an agent does not call itself"
            )
        fork: ChatRequest | None = None
        if self.context == "forked":
            fork = parent.last_call
            if fork is None:
                raise ToolError(
                    f"{self.name!r} forks its caller's last prompt, and there is none yet "
                    "(a call resumed before any model call)"
                )
        sink = caller.on_update
        run = Run(
            None if sink is None else partial(_tagged, sink, request.call),
            parent=parent,
            call=request.call,
            fork=fork,
        )
        if KEY_SCOPE in parent.state:  # a served caller's key scopes its child's memories too
            run.state[KEY_SCOPE] = parent.state[KEY_SCOPE]
        child = self._child(getattr(caller.agent, "observers", ()))
        session = InMemorySession()
        if fork is not None:  # the cut results in the prompt it forks are read back from here
            await carry_spilled(caller.session, session, fork.messages)
        return _answer(self.name, await child.run(task, session=session, on_update=run))

    def _child(self, inherited: tuple[Any, ...]) -> Any:
        """The agent with the caller's observers that watch agent tools after its own
        (each once), and the middleware that counts its model calls in its callers' usage."""
        own = self.agent.observers
        extra = tuple(
            observer
            for observer in inherited
            if getattr(observer, "watches_agent_tools", False) is True
            and not any(observer is mine for mine in own)
        )
        key = tuple(map(id, extra))
        kept = self._copies.get(key)
        if kept is not None:
            return kept[1]
        copy = self.agent.replace(
            observers=(*own, *extra), chat_stack=(_count_usage, *self.agent.chat_stack)
        )
        if len(self._copies) >= _MAX_COPIES:
            self._copies.clear()
        self._copies[key] = (extra, copy)  # the observers kept alive: their ids stay theirs
        return copy

    def __repr__(self) -> str:
        return f"<AgentTool {self.name!r} context={self.context!r} agent={self.agent!r}>"


def agent_tool(
    agent: RunsAgent, *, name: str | None, description: str | None, context: str
) -> AgentTool:
    """:meth:`raf.Agent.as_tool`, its arguments checked here."""
    if context not in CONTEXTS:
        raise ValueError(f"as_tool(context=...) must be 'isolated' or 'forked', got {context!r}")
    if name is None:
        name = agent.name
        if name is None:
            raise ValueError(
                "as_tool() needs a name: give the agent one (Agent(name=...)) or pass "
                "as_tool(name=...)"
            )
        where = f"the agent's name {name!r} is not a valid tool name: pass as_tool(name=...)"
    else:
        where = f"as_tool(name=...) must be a valid tool name, got {name!r}"
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise ValueError(f"{where} (1 to 64 of A-Z a-z 0-9 _ -)")
    if description is not None and not isinstance(description, str):
        raise TypeError(f"as_tool(description=...) must be a str, got {description!r:.80}")
    forked = context == "forked"
    if description is None:
        sees = (
            "it reads this conversation so far, then works on the task alone"
            if forked
            else "it sees only the task you write, none of this conversation"
        )
        description = f"Give the agent {name!r} a task: {sees}, and answers with its result."
    task = (
        "The task. The agent has read this conversation up to this call."
        if forked
        else "The task, complete in itself: the agent sees nothing else of this conversation."
    )
    parameters = {
        "type": "object",
        "properties": {"task": {"type": "string", "minLength": 1, "description": task}},
        "required": ["task"],
        "additionalProperties": False,
    }
    return AgentTool(agent, name, description, "forked" if forked else "isolated", parameters)


def _task(name: str, arguments: Mapping[str, Any]) -> str:
    task = arguments.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ToolArgumentsError(name, ("task: a non-empty string is required",))
    return task


def _answer(name: str, response: AgentResponse) -> str:
    """The child's final text; a child that stopped for approval cannot answer."""
    if response.pending:
        waiting = ", ".join(call.call.name for call in response.pending)
        raise ToolError(
            f"the agent {name!r} stopped: its tool calls ({waiting}) wait for a person's "
            "approval, which an agent called as a tool cannot wait for"
        )
    return response.text


async def _tagged(send: OnUpdate, call: ToolCall, update: Update) -> None:
    """The child's sink: each of its updates to the caller's, tagged with the call."""
    await send(Update.of_agent(call, update))


async def _count_usage(
    request: ChatRequest, call_next: Callable[[ChatRequest], Awaitable[AgentResponse]]
) -> AgentResponse:
    """The child's outermost chat middleware: each model call's usage joins its callers'."""
    response = await call_next(request)
    if response.usage is not None and request.invocation is not None:
        request.invocation.run.spend(response.usage)
    return response
