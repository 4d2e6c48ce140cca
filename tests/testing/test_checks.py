"""raf.testing.check_provider: every built-in passes; each rule catches its broken provider."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from raf import (
    AgentResponse,
    AgentRunOptions,
    AgentSkillsProvider,
    ChatMessage,
    CompressionProvider,
    ContextProvider,
    ContextResult,
    EchoChatClient,
    HistoryProvider,
    KnowledgeProvider,
    Session,
    StreamClosedError,
    WorkspaceContextProvider,
    parallel,
)
from raf.compression import SummaryStrategy, TokenBudgetStrategy, TruncationStrategy
from raf.testing import RULES, check_provider

Messages = Sequence[ChatMessage]


def broken(factory: Callable[[], Any], rule: str, *fragments: str, **kwargs: Any) -> str:
    """check_provider fails on ``factory`` with ``rule``; the message says what and how."""
    with pytest.raises(AssertionError) as raised:
        check_provider(factory, **kwargs)
    message = str(raised.value)
    assert f"broke the rule {rule!r}" in message, message
    assert RULES[rule][0] in message
    assert "How to fix it: " + RULES[rule][1] in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# Every built-in passes -------------------------------------------------------------------


def skills_root(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    (root / "pdf").mkdir(parents=True)
    (root / "pdf" / "SKILL.md").write_text(
        "---\nname: pdf\ndescription: Read PDF files.\n---\nUse pdftotext.\n"
    )
    return root


def knowledge_root(tmp_path: Path) -> Path:
    root = tmp_path / "notes"
    root.mkdir()
    (root / "alpha.md").write_text("# Alpha\n\nProject alpha costs 3 units. See [[Bravo]].\n")
    (root / "bravo.md").write_text("# Bravo\n\nProject bravo ships in June.\n")
    return root


BUILTINS: dict[str, Callable[[Path], Callable[[], Any]]] = {
    "history": lambda tmp: HistoryProvider,
    "history-no-inject": lambda tmp: lambda: HistoryProvider(inject=False),
    "history-persist-partial": lambda tmp: lambda: HistoryProvider(persist_partial=True),
    "compression-truncation": lambda tmp: lambda: CompressionProvider(TruncationStrategy(2)),
    "compression-token-budget": lambda tmp: lambda: CompressionProvider(TokenBudgetStrategy(30)),
    "compression-summary": lambda tmp: (
        lambda: CompressionProvider(SummaryStrategy(EchoChatClient(), keep_last=2))
    ),
    "skills": lambda tmp: lambda: AgentSkillsProvider(skills_root(tmp)),
    "workspace": lambda tmp: lambda: WorkspaceContextProvider(tmp),
    "knowledge": lambda tmp: lambda: KnowledgeProvider.folder(knowledge_root(tmp)),
    "wiki": lambda tmp: lambda: KnowledgeProvider.wiki(knowledge_root(tmp)),
}


@pytest.mark.parametrize("name", sorted(BUILTINS))
@pytest.mark.slow
def test_every_builtin_provider_passes(name: str, tmp_path: Path) -> None:
    made = iter(range(10_000))

    def fresh_folder() -> Path:
        # Each provider gets a folder of its own: the battery makes dozens.
        folder = tmp_path / str(next(made))
        folder.mkdir()
        return folder

    check_provider(lambda: BUILTINS[name](fresh_folder())())


@pytest.mark.slow
def test_the_mcp_provider_passes(tmp_path: Path) -> None:
    pytest.importorskip("mcp")
    from raf import McpToolsProvider
    from tests.providers.test_mcp import TINY_SERVER

    script = tmp_path / "tiny_server.py"
    script.write_text(TINY_SERVER)
    args = [str(script), str(tmp_path / "server.log")]
    check_provider(lambda: McpToolsProvider(sys.executable, args))


def test_a_provider_without_a_post_stage_passes() -> None:
    class OnlyPre:  # not a ContextProvider subclass: anything with on_invoking
        async def on_invoking(
            self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
        ) -> ContextResult:
            return ContextResult(instructions=f"{len(messages)} messages")

    check_provider(OnlyPre)


def test_state_kept_per_session_passes() -> None:
    """The docs' way: per-run state in a dict keyed by session.id."""

    class PerSession(ContextProvider):
        def __init__(self) -> None:
            self.requests: dict[str, Messages] = {}

        async def on_invoking(
            self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
        ) -> ContextResult:
            self.requests[session.id] = tuple(messages)
            await session.get_messages()
            return ContextResult()

        async def on_invoked(
            self,
            agent: Any,
            session: Session,
            request_messages: Messages,
            response: AgentResponse | None,
            error: BaseException | None,
        ) -> None:
            request = self.requests.pop(session.id)
            if response is not None:
                await session.add_messages([*request, *response.messages])

    check_provider(PerSession)


# Rule: returns-context-result -------------------------------------------------------------


class ForgetsToReturn(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        ContextResult(instructions="forgotten")  # no return
        return None  # type: ignore[return-value]


class ReturnsADict(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        return {"instructions": "hi"}  # type: ignore[return-value]


class ReturnsTextAsMessages(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        return ContextResult(messages="hello")  # type: ignore[arg-type]


class RaisesOnAPlainRun(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        raise KeyError(options.extra["missing"])


def test_a_provider_that_forgets_to_return_is_caught() -> None:
    message = broken(ForgetsToReturn, "returns-context-result", "forget to return", "NoneType")
    assert message.startswith("check_provider: 'ForgetsToReturn' broke the rule")


def test_a_provider_that_returns_something_else_is_caught() -> None:
    broken(ReturnsADict, "returns-context-result", "expected a ContextResult", "dict")
    broken(ReturnsTextAsMessages, "returns-context-result", "messages: expected a sequence")


def test_a_provider_that_raises_on_a_plain_run_is_caught() -> None:
    broken(RaisesOnAPlainRun, "returns-context-result", "on_invoking raised KeyError")


# Rule: no-mutation ------------------------------------------------------------------------


class AppendsToMessages(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        messages.append(ChatMessage.system("sneaked in"))  # type: ignore[attr-defined]
        return ContextResult()


class WritesToExtra(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        options.extra["seen_by"] = "me"  # type: ignore[index]
        return ContextResult()


class ReplacesAnOption(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        object.__setattr__(options, "temperature", 1.5)
        return ContextResult()


class ClearsTheRequestAfterwards(ContextProvider):
    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        request_messages.clear()  # type: ignore[attr-defined]


class EditsAMessageInPlace(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        object.__setattr__(messages[0], "content", "rewritten")
        return ContextResult()


def test_a_provider_that_changes_the_request_messages_is_caught() -> None:
    broken(AppendsToMessages, "no-mutation", "on_invoking changed the request messages")
    broken(ClearsTheRequestAfterwards, "no-mutation", "on_invoked changed the request messages")
    broken(EditsAMessageInPlace, "no-mutation", "rewritten")


def test_a_provider_that_changes_the_options_is_caught() -> None:
    broken(WritesToExtra, "no-mutation", "changed options.extra", "seen_by")
    broken(ReplacesAnOption, "no-mutation", "changed options.temperature", "1.5")


# Rule: post-stage-never-raises ------------------------------------------------------------


class AssumesSuccess(ContextProvider):
    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        await session.add_messages(response.messages)  # type: ignore[union-attr]


class ReRaises(ContextProvider):
    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if isinstance(error, Exception):
            raise error


class FailsOnCancellation(ContextProvider):
    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if isinstance(error, anyio.get_cancelled_exc_class()):
            raise RuntimeError("did not expect to be cancelled")


class FailsOnEarlyClose(ContextProvider):
    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if isinstance(error, StreamClosedError):
            raise ValueError(f"half an answer: {error.partial.text!r}")


def test_a_post_stage_that_assumes_success_is_caught() -> None:
    broken(
        AssumesSuccess,
        "post-stage-never-raises",
        "on_invoked raised AttributeError: 'NoneType' object has no attribute 'messages'",
    )


def test_a_post_stage_that_re_raises_the_error_is_caught() -> None:
    broken(ReRaises, "post-stage-never-raises", "on_invoked raised RuntimeError: the model failed")


def test_a_post_stage_that_fails_on_a_cancellation_is_caught() -> None:
    for backend in ("asyncio", "trio"):
        broken(
            FailsOnCancellation,
            "post-stage-never-raises",
            f"(on {backend}): a run cancelled at its start: handed the run's cancellation, "
            "on_invoked raised RuntimeError",
            backends=[backend],
        )


def test_a_post_stage_that_fails_on_an_early_close_is_caught() -> None:
    broken(
        FailsOnEarlyClose,
        "post-stage-never-raises",
        "a stream closed early: on_invoked raised ValueError: half an answer",
    )


# Rule: per-run-state ----------------------------------------------------------------------


class KeepsTheRequestOnSelf(ContextProvider):
    """Saves the turn in its post stage from what the last pre stage put on self."""

    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        self.request = tuple(messages)
        return ContextResult()

    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if response is not None:
            await session.add_messages([*self.request, *response.messages])


class KeepsTheSessionOnSelf(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        self.session = session
        return ContextResult()

    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if response is not None:
            await self.session.add_messages(response.messages)


class KeepsStateAcrossAnAwait(ContextProvider):
    """Only wrong when two pre stages run at once: the state is set before an await."""

    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        self.last = messages[-1].content
        history = await session.get_messages()
        return ContextResult(instructions=f"{len(history)} earlier messages; asked: {self.last}")


def test_state_of_a_run_kept_on_self_is_caught() -> None:
    message = broken(KeepsTheRequestOnSelf, "per-run-state", "pre A, pre B, post A")
    assert "the session holds" in message
    broken(KeepsTheSessionOnSelf, "per-run-state")


def test_state_kept_on_self_across_an_await_is_caught() -> None:
    broken(KeepsStateAcrossAnAwait, "per-run-state", "with runs A and B at once")


def test_a_clock_in_the_result_is_not_a_leak() -> None:
    class Clock(ContextProvider):
        async def on_invoking(
            self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
        ) -> ContextResult:
            await session.get_messages()
            return ContextResult(instructions=f"It is {time.perf_counter_ns()} ns.")

    check_provider(Clock)


# Rule: prompt-cancellation ----------------------------------------------------------------


class ShieldsItsWork(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(4)
        return ContextResult()


class SwallowsTheCancellation(ContextProvider):
    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        try:
            await anyio.sleep(0.01)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await anyio.sleep(4)  # "finish the work anyway"
        return ContextResult()


def test_a_stage_that_shields_its_work_is_caught() -> None:
    started = time.monotonic()
    broken(
        ShieldsItsWork,
        "prompt-cancellation",
        "still running 0.5 s after the cancellation",
        cancel_grace=0.5,
        backends=["trio"],
    )
    # Failed at the grace, not after the stage's 4 s (generous: this machine is shared).
    assert time.monotonic() - started < 30


def test_a_stage_that_swallows_the_cancellation_is_caught() -> None:
    broken(SwallowsTheCancellation, "prompt-cancellation", "a run cancelled", cancel_grace=0.5)


@pytest.mark.slow
def test_a_stage_that_never_returns_fails_the_check_instead_of_hanging() -> None:
    class Slow(ContextProvider):
        async def on_invoking(
            self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
        ) -> ContextResult:
            await anyio.sleep(3)  # cancellable, so the cancellation probe passes
            return ContextResult()

    with pytest.raises(
        AssertionError,
        match=r"did not finish within 1.0 s on asyncio; 'Slow' was at: .+: on_invoking of run [AB]",
    ):
        check_provider(Slow, timeout=1.0)


# The function itself ----------------------------------------------------------------------


def test_what_is_not_a_factory_of_providers_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="factory must be callable"):
        check_provider(HistoryProvider())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must return a context provider"):
        check_provider(lambda: "history")
    with pytest.raises(TypeError, match="parallel group"):
        check_provider(lambda: parallel(HistoryProvider()))


def test_a_named_provider_is_named_with_its_class() -> None:
    message = broken(lambda: ForgetsToReturn(), "returns-context-result")
    assert "'ForgetsToReturn'" in message

    class Named(ForgetsToReturn):
        name = "notes"

    message = broken(Named, "returns-context-result")
    assert "'notes' (tests.testing.test_checks." in message


def test_importing_raf_testing_imports_neither_hypothesis_nor_pytest() -> None:
    code = (
        "import sys, raf.testing; "
        "print(sorted(m for m in ('hypothesis', 'pytest') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


_REQUEST: contextvars.ContextVar[tuple[ChatMessage, ...]] = contextvars.ContextVar("request")


class KeepsTheRequestInAContextVariable(ContextProvider):
    """Right: a run's stages run in its task, and a context variable is per task."""

    async def on_invoking(
        self, agent: Any, session: Session, messages: Messages, options: AgentRunOptions
    ) -> ContextResult:
        _REQUEST.set(tuple(messages))
        return ContextResult()

    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        request = _REQUEST.get()
        if response is not None:
            await session.add_messages([*request, *response.messages])


def test_state_kept_in_a_context_variable_passes() -> None:
    check_provider(KeepsTheRequestInAContextVariable)


# Every broken rule, each once ---------------------------------------------------------------


class BreaksTwoRules(KeepsTheRequestOnSelf):
    """Keeps the request on self (per-run-state) and fails on any error (post stage)."""

    async def on_invoked(
        self,
        agent: Any,
        session: Session,
        request_messages: Messages,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if error is not None:
            raise RuntimeError("only successes, please")
        await super().on_invoked(agent, session, request_messages, response, error)


def test_every_broken_rule_is_reported_in_one_error_each_once() -> None:
    with pytest.raises(AssertionError) as raised:
        check_provider(BreaksTwoRules)
    message = str(raised.value)
    assert message.startswith("check_provider: 'BreaksTwoRules' broke 2 rules:\n"), message
    # Each rule once, though each broke on many runs and on both backends; in the
    # order the battery found them.
    for rule in ("post-stage-never-raises", "per-run-state"):
        assert message.count(f"broke the rule {rule!r}") == 1, message
        assert message.count("How to fix it: " + RULES[rule][1]) == 1, message
    assert message.index("'post-stage-never-raises'") < message.index("'per-run-state'")
    assert "only successes, please" in message
    assert isinstance(raised.value.__cause__, RuntimeError)  # the first rule's own error
