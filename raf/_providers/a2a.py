"""A2AAgentTool: a remote A2A agent as a tool, called with the ``a2a-sdk`` client."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import anyio

from raf.errors import ConfigError, ToolError

if TYPE_CHECKING:
    from a2a.types import AgentCard

__all__ = ["A2AAgentTool"]

_MISSING = (
    "A2AAgentTool needs the optional 'a2a-sdk' package; install it with: "
    "pip install 'raf-agents[a2a]'"
)
#: Seconds a cancelled call gives the remote agent to hear that its task is cancelled.
CANCEL_TIMEOUT: Final = 5.0
#: The characters of a remote answer kept at most, by default (some 1 MB of text).
MAX_ANSWER_CHARS: Final = 1_000_000
_DONE = ("TASK_STATE_COMPLETED", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED")


class A2AAgentTool:
    """A remote agent, spoken to over A2A, as a :class:`raf.Tool`: the model sends it
    a message and gets its answer.

    ``url`` is where the agent is served (its card is read from
    ``url/.well-known/agent-card.json`` on the first call, then kept).
    ``name`` is the tool's (default: made from the URL, as ``a2a_host_port``);
    ``description`` what the model reads of it. ``api_key`` is sent as
    ``Authorization: Bearer KEY`` (a raf server started with keys asks for
    one), and only to the server of ``url``: a card that names another server for
    its interface is a :class:`raf.ToolError` then. ``timeout`` bounds each call,
    from the card to the last event: past it, the remote task is cancelled and
    the call is a :class:`raf.ToolError`. ``max_answer_chars`` bounds the
    answer as it streams (its text, and what the agent says of its task): past
    it, the remote task is cancelled and the call is a :class:`raf.ToolError`
    saying so. Every read is bounded before it is kept: the card at 1 MB, each
    event (and each other reply) at 8 bytes a character of ``max_answer_chars``
    and 64 KB more; a reply is asked for and taken uncompressed (a compressed
    one could inflate past any bound).

    Each call is a task of its own, in a context of its own (the remote agent
    does not see earlier calls). The answer is the text of the task's
    artifacts (streamed, when the agent streams); a task that waits for input
    returns what the agent asked. A task that failed or was rejected, a
    remote agent that does not answer or answers outside the protocol, is a
    :class:`raf.ToolError`, told to the model as any tool's failure. A run
    that is cancelled (or closed early) while the call is under way cancels
    the remote task (``tasks/cancel``, within :data:`CANCEL_TIMEOUT` seconds).
    Needs the optional ``a2a-sdk`` package (``pip install 'raf-agents[a2a]'``).

    >>> tool = A2AAgentTool("http://127.0.0.1:8000")
    >>> tool.name
    'a2a_127_0_0_1_8000'
    """

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        description: str | None = None,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_answer_chars: int = MAX_ANSWER_CHARS,
    ) -> None:
        try:
            import a2a.client  # noqa: F401
        except ImportError as exc:
            raise ConfigError(_MISSING) from exc
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"A2AAgentTool: url must be an http(s) URL, got {url!r:.200}")
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ValueError(f"A2AAgentTool: name must be 1 to 64 of A-Z a-z 0-9 _ -, got {name!r}")
        if not timeout > 0:
            raise ValueError(f"A2AAgentTool: timeout must be positive, got {timeout!r}")
        if not isinstance(max_answer_chars, int) or max_answer_chars < 1:
            raise ValueError(
                f"A2AAgentTool: max_answer_chars must be a positive int, got {max_answer_chars!r}"
            )
        self.url = url.rstrip("/")
        self.name = name or ("a2a_" + re.sub(r"[^A-Za-z0-9]+", "_", parts.netloc).strip("_"))[:64]
        self.description = description or (
            f"Send a message to the agent at {self.url} (over A2A) and get its answer."
        )
        self.parameters: Mapping[str, Any] = {
            "type": "object",
            "properties": {"message": {"type": "string", "description": "what to ask"}},
            "required": ["message"],
            "additionalProperties": False,
        }
        self.timeout = timeout
        self.max_answer_chars = max_answer_chars
        self._headers = {"Accept-Encoding": "identity"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._card: AgentCard | None = None

    def __repr__(self) -> str:
        return f"A2AAgentTool({self.url!r}, name={self.name!r})"

    async def invoke(self, arguments: Mapping[str, Any]) -> str:
        """Send ``arguments["message"]`` to the remote agent; its answer."""
        import httpx

        from raf._providers._a2a_http import BoundedTransport  # needs httpx, as a2a-sdk

        try:
            bounded = BoundedTransport(self.url, 8 * self.max_answer_chars + 65536)
            async with httpx.AsyncClient(
                headers=self._headers, timeout=self.timeout, transport=bounded
            ) as http:
                with anyio.fail_after(self.timeout):  # an answer that streams for ever ends
                    return await self._exchange(http, str(arguments["message"]))
        except (ToolError, anyio.get_cancelled_exc_class()):
            raise
        except TimeoutError:
            raise ToolError(
                f"the agent at {self.url} did not answer within {self.timeout} s"
            ) from None
        except Exception as exc:
            raise ToolError(f"the agent at {self.url} failed: {_short(exc)}") from exc

    async def _exchange(self, http: Any, text: str) -> str:
        from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
        from a2a.types import Message, Part, Role, SendMessageRequest

        if self._card is None:
            self._card = self._checked(await A2ACardResolver(http, self.url).get_agent_card())
        client = ClientFactory(ClientConfig(httpx_client=http)).create(self._card)
        message = Message(
            role=Role.ROLE_USER,
            message_id=uuid.uuid4().hex,
            context_id=uuid.uuid4().hex,
            parts=[Part(text=text)],
        )
        reply = _Reply()
        try:
            sent: Any = client.send_message(SendMessageRequest(message=message))
            async with contextlib.aclosing(sent) as events:
                async for event in events:
                    reply.take(event)
                    if reply.size > self.max_answer_chars:
                        break
        except anyio.get_cancelled_exc_class():
            if reply.task_id:
                await self._cancel(client, reply.task_id)
            raise
        if reply.size > self.max_answer_chars:
            if reply.task_id:
                await self._cancel(client, reply.task_id)
            raise ToolError(
                f"the agent at {self.url} answered more than {self.max_answer_chars} characters "
                "(max_answer_chars): its task was cancelled"
            )
        return reply.answer(self.url)

    def _checked(self, card: AgentCard) -> AgentCard:
        """``card``, unless it would send the key to another server than ``url``'s."""
        if "Authorization" in self._headers:
            own = _origin(self.url)
            for interface in card.supported_interfaces:
                if _origin(interface.url) != own:
                    raise ToolError(
                        f"the card of the agent at {self.url} names another server "
                        f"({interface.url!r:.200}): its key is not sent there"
                    )
        return card

    async def _cancel(self, client: Any, task_id: str) -> None:
        """Tell the remote agent its task is cancelled (shielded, bounded): best effort."""
        from a2a.types import CancelTaskRequest

        # A task already over, or an agent out of reach: the cancellation goes on all the same.
        shielded = anyio.CancelScope(shield=True)
        with shielded, anyio.move_on_after(CANCEL_TIMEOUT), contextlib.suppress(Exception):
            await client.cancel_task(CancelTaskRequest(id=task_id))


class _Reply:
    """What the remote agent sent for one message: its task, the answer's text, the state,
    and :attr:`size`, the characters kept of it."""

    def __init__(self) -> None:
        self.task_id: str | None = None
        self.state = ""
        self.status = ""  # the text of the last status message
        self.text: dict[str, list[str]] = {}  # artifact id -> its chunks so far
        self.message: str | None = None  # an answer given as a message, not a task
        self.size = 0  # the characters kept: what max_answer_chars bounds

    def take(self, event: Any) -> None:
        from a2a.helpers import get_message_text
        from a2a.types import TaskState

        if event.HasField("message"):
            self.size -= len(self.message or "")
            self.message = get_message_text(event.message)
            self.size += len(self.message)
        elif event.HasField("task"):
            task = event.task
            self.task_id = task.id
            self._status(task.status, TaskState, get_message_text)
            for artifact in task.artifacts:
                self._put(artifact.artifact_id, _text(artifact.parts), append=False)
        elif event.HasField("status_update"):
            self.task_id = event.status_update.task_id
            self._status(event.status_update.status, TaskState, get_message_text)
        elif event.HasField("artifact_update"):
            update = event.artifact_update
            self.task_id = update.task_id
            self._put(update.artifact.artifact_id, _text(update.artifact.parts), update.append)

    def _put(self, key: str, text: str, append: bool) -> None:
        # Chunks in a list, joined once: appending to one string copies it for each chunk.
        chunks = self.text.setdefault(key, [])
        if not append:
            self.size -= sum(map(len, chunks))
            chunks.clear()
        chunks.append(text)
        self.size += len(text)

    def _status(self, status: Any, states: Any, text_of: Any) -> None:
        self.state = states.Name(status.state)
        if status.HasField("message"):
            self.size -= len(self.status)
            self.status = text_of(status.message)
            self.size += len(self.status)

    def answer(self, url: str) -> str:
        """The answer's text, or a :class:`ToolError` for a task that did not end well."""
        if self.message is not None:
            return self.message
        answer = "\n".join(t for t in map("".join, self.text.values()) if t)
        if self.state not in _DONE:
            what = self.state.removeprefix("TASK_STATE_").lower().replace("_", "-") or "no state"
            why = f": {self.status}" if self.status else ""
            raise ToolError(f"the agent at {url} ended its task {what}{why}")
        if self.state != "TASK_STATE_COMPLETED":
            asked = self.status or "it needs more input"
            return (
                f"{answer}\n\n[the agent waits: {asked}]"
                if answer
                else f"[the agent waits: {asked}]"
            )
        return answer


def _origin(url: str) -> tuple[str, str]:
    """A URL's scheme and host with its port (the default port spelled out)."""
    parts = urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, 0)
    return parts.scheme.lower(), f"{(parts.hostname or '').lower()}:{port}"


def _text(parts: Any) -> str:
    return "".join(part.text for part in parts if part.HasField("text"))


def _short(error: BaseException) -> str:
    """The type and first line of an error, briefly (no response bodies)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    first = (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: {first:.200}" if first else type(error).__name__
