"""Every exception raf raises, each saying what went wrong and where.

The hierarchy (``except`` a branch to catch everything below it)::

    AgentError
    ├── ProviderError                 a provider's stage failed (.provider, .stage)
    ├── ContextResultError            a ContextResult of the wrong shape (also a TypeError)
    ├── StreamClosedError             the consumer left a streamed run early (.partial)
    ├── GuardrailError                a guardrail blocked the run (.guardrail, .where, .reason)
    ├── ApprovalError                 a decision matches no pending call, or approvals cannot wait
    ├── ConfigError                   a declaration or a config file is wrong
    ├── CompressionError              a compression strategy could not compress
    ├── McpError                      an MCP server could not be started or spoken to
    ├── SessionStoreError             a session store cannot be opened or read
    ├── EmbeddingError                an embedder's vectors cannot be used (count, dimension)
    ├── SessionExistsError            a fork's new id already holds messages (.session_id)
    ├── DurableError                  a run cannot be durable (trio, a memory session, ...)
    ├── OfflineError                  a raf_offline test reached out (also a ConnectionRefusedError)
    ├── UsageLimitExceeded            a run's next model call would pass a UsageLimits limit
    ├── BudgetExceeded                a spending budget has no room for the next call (.resets_at)
    ├── OutputError                   the final answer is not the structured output asked for
    │   ├── OutputValidationError     it does not validate, retries included (.text, .problems)
    │   └── OutputRefusedError        the model refused to answer (.refusal)
    ├── ToolError                     a tool failed, or the run's tools or tool loop did
    │   ├── ToolArgumentsError        a call's arguments do not fit (also a ValueError)
    │   ├── ToolSchemaError           a tool's parameters schema is invalid (also a ValueError)
    │   ├── PathError                 a file tool refused a path
    │   ├── ToolConflictError         two tools of one run share a name
    │   └── ToolLoopError             still asking for tools after max_tool_iterations
    └── ChatClientError               the model could not answer (.retryable, .status_code)
        ├── RateLimitError            HTTP 429
        ├── ChatTimeoutError          HTTP 408 or a client-side timeout (also a TimeoutError)
        ├── ChatConnectionError       the server could not be reached
        ├── ServerError               HTTP 5xx or 409
        ├── ChatProtocolError         an answer that is not in the protocol
        ├── IncompleteResponseError   the model did not finish its answer (.reason, .partial)
        └── BadRequestError           other HTTP 4xx
            ├── AuthenticationError   HTTP 401/403
            └── ContextOverflowError  the prompt is over the model's window (.input_tokens)

A tool's own failure (a :class:`ToolError`, or any exception) and the
:class:`ToolArgumentsError` / :class:`ToolSchemaError` of a call are told to
the model as that call's tool message, and the run goes on; a
:class:`ToolConflictError` or a :class:`ToolLoopError` ends the run.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

__all__ = [
    "AgentError",
    "ApprovalError",
    "AuthenticationError",
    "BadRequestError",
    "BudgetExceeded",
    "ChatClientError",
    "ChatConnectionError",
    "ChatProtocolError",
    "ChatTimeoutError",
    "CompressionError",
    "ConfigError",
    "ContextOverflowError",
    "ContextResultError",
    "DurableError",
    "EmbeddingError",
    "GuardrailError",
    "IncompleteResponseError",
    "McpError",
    "OfflineError",
    "OutputError",
    "OutputRefusedError",
    "OutputValidationError",
    "PathError",
    "ProviderError",
    "RateLimitError",
    "ServerError",
    "SessionExistsError",
    "SessionStoreError",
    "StreamClosedError",
    "ToolArgumentsError",
    "ToolConflictError",
    "ToolError",
    "ToolLoopError",
    "ToolSchemaError",
    "UsageLimitExceeded",
]

Stage = Literal["on_invoking", "on_invoked"]


class AgentError(Exception):
    """Base class of every error raf raises on purpose.

    Every raf error survives pickling (a worker process, a task queue): it
    is rebuilt with its message, its attributes and its notes.
    """

    def __reduce__(self) -> tuple[object, ...]:
        # The subclasses' __init__ take other arguments than the message they pass on,
        # so the default (cls, self.args) cannot rebuild them: restore the state instead.
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(
    cls: type[AgentError], args: tuple[object, ...], state: dict[str, object]
) -> AgentError:
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class ProviderError(AgentError):
    """A context provider failed in one of its stages.

    ``provider`` is the provider's name, ``stage`` is ``"on_invoking"`` or
    ``"on_invoked"``; the provider's own exception is ``__cause__``.
    ``field`` names the offending ``ContextResult`` field when the provider
    returned a malformed result.
    """

    def __init__(
        self, provider: str, stage: Stage, detail: str, *, field: str | None = None
    ) -> None:
        self.provider = provider
        self.stage = stage
        self.field = field
        self.detail = detail
        where = f"{provider}.{stage}" + (f" (field {field!r})" if field else "")
        super().__init__(f"context provider {where} failed: {detail}")


class StreamClosedError(AgentError):
    """The consumer of a streamed run left before its end: what the post stages see then.

    Raised inside the run when the consumer leaves ``async with
    agent.stream(...)`` early; every entered provider's
    ``on_invoked`` gets it as ``error``. ``partial`` is the
    :class:`raf.AgentResponse` assembled from the updates the consumer
    received. The post stages that failed on the way out are in the run's
    own ``invocation.run.failures`` (the innermost first), which the
    ``async with`` raises as after a successful run; the consumer, gone,
    never sees the error itself.
    """

    # ``partial`` is typed Any: the errors sit below the values and name none of them.
    def __init__(self, partial: Any) -> None:
        self.partial = partial
        received = self.partial.messages
        what = (
            "nothing"
            if not received
            else f"{len(received)} message{'s' if len(received) != 1 else ''} "
            f"(text {_short(self.partial.text)})"
        )
        super().__init__(
            f"the consumer of the streamed run left before its end, having received {what}"
        )

    @property
    def post_failures(self) -> Any:
        """Moved: a run's failed post stages are ``invocation.run.failures``."""
        raise AttributeError(
            "StreamClosedError.post_failures was removed: the post stages that failed are "
            "the run's own, in invocation.run.failures (raf.Run.failures)"
        )


#: Where a guardrail checks: the request, the answer, a tool call's arguments or its result.
GuardrailWhere = Literal["input", "output", "tool_arguments", "tool_result"]


class GuardrailError(AgentError):
    """A guardrail blocked the run: its check answered ``Verdict.block(reason)``.

    ``guardrail`` names it, ``where`` says what it was checking (``"input"``:
    the request messages, before any model call; ``"output"``: the model's
    answer), ``reason`` is the check's own words. The post stages see it as
    the run's error. ``partial`` is the :class:`raf.AgentResponse` the
    consumer of a streamed answer had received of the run when it was
    stopped (the turns of a tool loop before the blocked model call, then
    what was released of it; ``None`` when nothing was streamed): never a
    character of the held text.
    """

    def __init__(
        self, guardrail: str, where: GuardrailWhere, reason: str, *, partial: Any = None
    ) -> None:
        self.guardrail = guardrail
        self.where = where
        self.reason = reason
        self.partial = partial
        what = {"input": "the request", "output": "the answer"}.get(where, where)
        super().__init__(f"guardrail {guardrail!r} blocked {what}: {reason}")


class ApprovalError(AgentError):
    """An approval cannot be applied, or a tool that needs one cannot wait for it.

    Raised by ``agent.run(raf.Decision(...), session=s)`` before any model
    call or tool runs, when a decision's token matches no pending call of
    that session (unknown, already decided, another session's, or the
    call's arguments changed): then none of the decisions applies. Also
    raised when a tool that needs approval is offered to an agent whose
    stack has no :class:`raf.HistoryProvider` (a paused call must be
    stored to wait). ``tokens`` are the tokens that matched nothing.
    """

    def __init__(self, message: str, *, tokens: tuple[str, ...] = ()) -> None:
        self.tokens = tokens
        super().__init__(message)


class ContextResultError(AgentError, TypeError):
    """A ``ContextResult`` (or what stood in its place) has a wrong type.

    Raised by :func:`raf.merge`; the provider layer turns it into a
    :class:`ProviderError` that also names the provider.
    """

    def __init__(self, field: str, expected: str, got: object) -> None:
        self.field = field
        self.expected = expected
        self.got = got
        super().__init__(f"{field}: expected {expected}, got {_describe(got)}")


class ToolError(AgentError):
    """Something about tools went wrong: the base of the ``Tool*Error`` classes.

    Raised as it is by a tool to report that it failed, with a message
    written for the model to read (the tool loop tells it to the model as
    the call's tool message).
    """


class ToolConflictError(ToolError):
    """Two tools offered to the model in one run share a name."""

    def __init__(self, name: str, first: str, second: str) -> None:
        self.name = name
        #: Who offered each tool: ``"the agent"``, ``"provider 'x'"``, ``"the run's options"``.
        self.first = first
        self.second = second
        super().__init__(
            f"two tools are named {name!r}: one from {first}, one from {second}; "
            "tool names must be unique within a run"
        )


class ToolLoopError(ToolError):
    """The model still asked for tools after ``max_tool_iterations`` calls."""

    def __init__(self, max_tool_iterations: int, pending: tuple[str, ...]) -> None:
        self.max_tool_iterations = max_tool_iterations
        self.pending = pending
        super().__init__(
            f"the model still asked for tools ({', '.join(pending)}) after "
            f"{max_tool_iterations} model calls (AgentRunOptions.max_tool_iterations)"
        )


class ToolArgumentsError(ToolError, ValueError):
    """The arguments of a tool call do not fit the tool's parameters.

    ``tool`` is the tool's name; ``problems`` lists each misfit as
    ``"path: what is wrong"`` (``"items[2].qty: Input should be greater than
    or equal to 1"``). Raised by :meth:`raf.FunctionTool.invoke` and
    :func:`raf.check_tool_arguments`; the tool loop tells it to the model as the
    call's tool message, and the run goes on.
    """

    def __init__(self, tool: str, problems: tuple[str, ...]) -> None:
        self.tool = tool
        self.problems = problems
        super().__init__(f"invalid arguments for {tool!r}: " + "; ".join(problems))


class ToolSchemaError(ToolError, ValueError):
    """A tool's ``parameters`` is not a valid JSON Schema.

    ``tool`` is the tool's name, ``problem`` what is wrong and where in the
    schema. Raised when such a tool is built (:class:`raf.FunctionTool`,
    :func:`raf.check_tool_schema`); a tool that reaches the model anyway
    (a hand-made ``Tool``) is refused when the model calls it: the model is
    told, and the run goes on.
    """

    def __init__(self, tool: str, problem: str) -> None:
        self.tool = tool
        self.problem = problem
        super().__init__(f"tool {tool!r} has an invalid parameters schema: {problem}")


class ConfigError(AgentError):
    """A declaration or a configuration file is wrong; the message says where."""


class CompressionError(AgentError):
    """A compression strategy could not compress (its summary call failed) or
    returned a history that splits a tool call from its results."""


class McpError(AgentError):
    """An MCP server could not be started or spoken to."""


class PathError(ToolError):
    """A file tool refused a path (outside its folder, absolute, too big, ...).

    The message names the path as the model gave it and never the folder's
    absolute location, so it can be shown to the model as it is.
    """


class SessionStoreError(AgentError):
    """A session store cannot be opened or read (corrupt or foreign data)."""


class EmbeddingError(AgentError):
    """An embedder answered vectors that cannot be used: not one per text, not numbers,
    or of a dimension other than its earlier ones (a model changed behind the same name)."""


class SessionExistsError(AgentError):
    """``store.fork(session_id, new_id)``: ``new_id`` already holds messages; nothing was
    written (a fork never overwrites a session)."""

    def __init__(self, session_id: str, held: int, where: str) -> None:
        self.session_id = session_id
        #: How many messages the session held.
        self.held = held
        super().__init__(
            f"{where}: cannot fork into session {session_id!r}: it already holds {held} "
            f"message{'s' if held != 1 else ''} (a fork never overwrites; choose another id)"
        )


class DurableError(AgentError):
    """A run cannot be durable: on trio, with a session no other process can reopen,
    an agent name no durable agent of this process has, or DBOS not configured."""


class OfflineError(AgentError, ConnectionRefusedError):
    """A ``raf_offline`` test tried to reach (or look up) a host that is not loopback.

    Raised by raf's pytest plugin where the connection would have been
    made; a ``ConnectionRefusedError`` too, so the code under test fails as
    on a refused connection (the test fails even if that code swallows it).
    """


class UsageLimitExceeded(AgentError):
    """A run's next model call would pass a limit of :class:`raf.UsageLimits`: not sent.

    ``limit`` names it (``"max_requests"``, ``"max_input_tokens"``,
    ``"max_output_tokens"``, ``"max_total_tokens"``, ``"max_cost"``,
    ``"max_request_input_tokens"``); ``spent`` is the run's usage so far
    (a :class:`raf.Usage`), ``cost`` what it cost in USD (``None`` when
    unpriced), ``requests`` its model calls so far.
    """

    def __init__(
        self, limit: str, detail: str, *, spent: Any, cost: Any = None, requests: int = 0
    ) -> None:
        self.limit = limit
        self.spent = spent
        self.cost = cost
        self.requests = requests
        super().__init__(f"usage limit {limit}: {detail}; the call was not sent")


class BudgetExceeded(AgentError):
    """A spending budget (:class:`raf.Budget` of :class:`raf.SpendLimits`) has no room for
    the next model call: it was not sent.

    ``budget`` is the budget, ``spent`` what its window has spent and holds
    for calls in flight (a ``Decimal``, USD), ``resets_at`` when its window
    ends (an aware ``datetime``, UTC), ``scope`` whose budget it is (the
    session id, the agent's name, the key...). Served, it is a 429 with
    ``Retry-After``.
    """

    def __init__(self, budget: Any, spent: Any, resets_at: Any, *, scope: str = "") -> None:
        self.budget = budget
        self.spent = spent
        self.resets_at = resets_at
        self.scope = scope
        usd, per = getattr(budget, "usd", "?"), getattr(budget, "per", "?")
        super().__init__(
            f"budget ${usd} per {per} of {scope or 'everyone'} is spent "
            f"(${spent} spent or held); it resets at {resets_at:%Y-%m-%d %H:%M:%S} UTC"
        )

    @property
    def retry_after(self) -> float:
        """Seconds until the budget's window ends (what a served 429 says in Retry-After)."""
        left: float = (self.resets_at - datetime.now(UTC)).total_seconds()
        return max(0.0, left)


class OutputError(AgentError):
    """The run asked for structured output (``output_type``) and did not get it."""


class OutputValidationError(OutputError):
    """The model's final answer does not validate into the run's ``output_type``.

    Raised once the answer failed ``attempts`` times (the first answer and
    ``output_retries`` more, each told what was wrong). ``text`` is the last
    answer as the model wrote it; ``problems`` lists each misfit as
    ``"path: what is wrong"``; the pydantic ``ValidationError`` is ``__cause__``.
    """

    def __init__(self, text: str, problems: tuple[str, ...], attempts: int) -> None:
        self.text = text
        self.problems = problems
        self.attempts = attempts
        tries = f"{attempts} answer{'s' if attempts != 1 else ''}"
        super().__init__(
            f"the model's answer does not match the output type ({tries}, the last "
            f"{_short(text)}): " + "; ".join(problems)
        )


class OutputRefusedError(OutputError):
    """The model refused to give the structured output (OpenAI's ``refusal``).

    ``refusal`` is the model's explanation, ``model`` the model that refused.
    Not a validation failure: asking again the same way is unlikely to help,
    so it is not retried.
    """

    def __init__(self, refusal: str, *, model: str | None = None) -> None:
        self.refusal = refusal
        self.model = model
        who = f"model {model!r}" if model else "the model"
        super().__init__(f"{who} refused to answer with the output type: {refusal}")


class ChatClientError(AgentError):
    """The chat model could not answer.

    ``retryable`` says whether sending the same request again can help
    (rate limits, timeouts, server errors) or not (bad request, auth).
    ``status_code`` is the HTTP status when there was one. ``retry_after`` is
    how long the server asked us to wait before trying again, in seconds (its
    ``Retry-After`` or ``retry-after-ms`` header), or ``None`` when it said
    nothing; :class:`raf.RetryMiddleware` honours it.
    """

    retryable: bool = False

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        # The keywords live in __dict__, which pickling restores next to args.
        self.status_code = status_code
        self.retry_after = retry_after
        super().__init__(message)


class RateLimitError(ChatClientError):
    """The provider asked us to slow down (HTTP 429)."""

    retryable = True


class ChatTimeoutError(ChatClientError, TimeoutError):
    """The request timed out (HTTP 408 or a client-side timeout)."""

    retryable = True


class ChatConnectionError(ChatClientError):
    """The server could not be reached."""

    retryable = True


class ServerError(ChatClientError):
    """The server failed (HTTP 5xx) or reported a conflict (HTTP 409)."""

    retryable = True


class ChatProtocolError(ChatClientError):
    """The server answered, but not in the protocol: a reply that is not JSON,
    lacks a field raf needs, holds a field of the wrong type, or is larger
    than the client's size bound. The message names the field. Not retryable:
    the same server is likely to answer the same way."""


class IncompleteResponseError(ChatClientError):
    """The model did not finish its answer: what it said is never passed off as complete.

    ``reason`` says why, in the server's words: chat completions'
    ``finish_reason`` (``"length"``: it reached ``max_tokens``;
    ``"content_filter"``: a filter stopped it), a Responses reply's
    ``incomplete_details.reason`` (``"max_output_tokens"``,
    ``"content_filter"``), or the ``status`` of a Responses reply that is not
    finished (``"in_progress"``, ``"queued"``). ``partial`` is the
    :class:`raf.AgentResponse` of what the model did say (its text, its
    complete tool calls, the usage), for a caller that wants to show it
    marked as cut. Both OpenAI clients raise it, plain and streamed (a
    stream's text updates went out before it). Not retryable: the same
    request ends the same way (raise ``max_tokens``, or change the request).
    """

    def __init__(self, message: str, *, reason: str, partial: Any) -> None:
        self.reason = reason
        self.partial = partial  # an AgentResponse; Any, as the errors name no value
        super().__init__(message)


class BadRequestError(ChatClientError):
    """The request was refused as malformed or not allowed (other 4xx)."""


class AuthenticationError(BadRequestError):
    """The credentials were missing or refused (HTTP 401/403)."""


class ContextOverflowError(BadRequestError):
    """The server refused the prompt as longer than the model's context window.

    What each client makes of its server's "too long" answer: OpenAI's
    ``context_length_exceeded`` (chat completions and Responses), Anthropic's
    ``prompt is too long``, Gemini's ``INVALID_ARGUMENT`` on the input token count.
    ``input_tokens`` and ``max_tokens`` are the prompt's size and the window's, in
    the server's count, when it said them (else ``None``). Not retryable: the same
    prompt is as long the next time; a shorter one (a new turn, or a compacted
    history, see :class:`raf.CompactionMiddleware`) goes through.
    """

    def __init__(
        self,
        message: str,
        *,
        input_tokens: int | None = None,
        max_tokens: int | None = None,
        status_code: int | None = None,
    ) -> None:
        self.input_tokens = input_tokens
        self.max_tokens = max_tokens
        super().__init__(message, status_code=status_code)


def _short(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."


def _describe(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
