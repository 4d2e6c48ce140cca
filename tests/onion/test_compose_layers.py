"""The laws of the provider layer: order, exactly-once post stages, error delivery."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from structlog.testing import capture_logs

from raf import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatOptions,
    ContextProvider,
    ContextResult,
    ProviderError,
    ScriptedChatClient,
)
from raf.observe import Observer, ProviderStage
from raf.testing.journal import (
    ModelFailure,
    ModelFatal,
    PostFailure,
    PreFailure,
    ProviderSpec,
    Scenario,
    build_stack,
    collapse_groups,
    expected_journal,
    expected_prompt,
)
from raf.testing.strategies import scenarios

pytestmark = pytest.mark.anyio

ANSWER = AgentResponse((ChatMessage.assistant("answer"),))


class JournalModel:
    """A chat client that journals its call and ends the way the scenario says."""

    def __init__(self, scenario: Scenario, journal: list[tuple[Any, ...]]) -> None:
        self.scenario = scenario
        self.journal = journal
        self.error = ModelFailure("model down")
        self.fatal = ModelFatal("stop")
        self.scope: anyio.CancelScope | None = None
        self.seen: tuple[tuple[ChatMessage, ...], tuple[str, ...]] | None = None

    async def complete(
        self, messages: Sequence[ChatMessage], options: ChatOptions
    ) -> AgentResponse:
        self.journal.append(("model",))
        self.seen = (tuple(messages), tuple(t.name for t in options.tools))
        if self.scenario.ending == "model_error":
            raise self.error
        if self.scenario.ending == "fatal":
            raise self.fatal
        if self.scenario.ending == "cancel":
            assert self.scope is not None
            self.scope.cancel()
            await anyio.sleep(5)
        return ANSWER


def outcome_kind(response: AgentResponse | None, error: BaseException | None) -> str:
    if error is None:
        assert response is not None
        return "response"
    assert response is None
    if isinstance(error, anyio.get_cancelled_exc_class()):
        return "cancel"
    if isinstance(error, ProviderError) and isinstance(error.__cause__, PreFailure):
        return "pre_error"
    if isinstance(error, ProviderError) and isinstance(error.__cause__, PostFailure):
        return "post_error"
    if isinstance(error, ModelFailure):
        return "model_error"
    if isinstance(error, ModelFatal):
        return "fatal"
    return f"unexpected {error!r}"


async def run_scenario(
    scenario: Scenario, observers: Sequence[Any] = ()
) -> tuple[list[tuple[Any, ...]], JournalModel, AgentResponse | None, BaseException | None, bool]:
    journal: list[tuple[Any, ...]] = []
    model = JournalModel(scenario, journal)
    agent = Agent(
        model,
        instructions=scenario.agent_instructions,
        stack=build_stack(scenario, journal),
        observers=observers,
    )
    response: AgentResponse | None = None
    raised: BaseException | None = None
    with anyio.CancelScope() as scope:
        model.scope = scope
        try:
            response = await agent.run(scenario.request)
        except BaseException as exc:
            raised = exc
            if isinstance(exc, anyio.get_cancelled_exc_class()):
                raise
    return journal, model, response, raised, scope.cancelled_caught


@settings(max_examples=120, deadline=None)
@given(scenarios())
@pytest.mark.slow
async def test_the_journal_matches_the_model(scenario: Scenario) -> None:
    journal, model, response, raised, cancelled = await run_scenario(scenario)

    # Pre stages in registration order (a group's in any order), post stages in reverse
    # (a group's innermost first), exactly once each; middleware in between, as declared.
    simplified = [
        entry
        if entry[0] not in ("post", "mw-out")
        else (entry[0], entry[1], outcome_kind(entry[2], entry[3]))
        for entry in journal
    ]
    assert collapse_groups(scenario, simplified) == expected_journal(scenario)

    # Every post stage and middleware that saw one kind of outcome saw the same object.
    by_kind: dict[str, set[int]] = {}
    for entry in journal:
        if len(entry) == 4:
            seen = id(entry[2]) if entry[3] is None else id(entry[3])
            by_kind.setdefault(outcome_kind(entry[2], entry[3]), set()).add(seen)
    assert all(len(ids) == 1 for ids in by_kind.values())

    # The model saw the merged prompt.
    if scenario.failing_pre is None:
        assert model.seen == expected_prompt(scenario)

    post_failures = [spec for spec in scenario.entered if spec.fail_post]
    k = scenario.failing_item
    if k is not None:
        assert isinstance(raised, ProviderError)
        assert raised.provider in scenario.failing_names
        assert raised.stage == "on_invoking"
        assert isinstance(raised.__cause__, PreFailure)
    elif scenario.ending == "model_error":
        assert raised is model.error
    elif scenario.ending == "fatal":
        assert raised is model.fatal
    elif scenario.ending == "cancel":
        assert cancelled
        assert isinstance(raised, anyio.get_cancelled_exc_class())
    elif post_failures:
        # On success the innermost post failure is raised, the others are notes.
        assert isinstance(raised, ProviderError)
        assert (raised.provider, raised.stage) == (post_failures[-1].name, "on_invoked")
        assert isinstance(raised.__cause__, PostFailure)
        notes = getattr(raised, "__notes__", [])
        assert len(notes) == len(post_failures) - 1
        for spec, note in zip(reversed(post_failures[:-1]), notes, strict=True):
            assert spec.name in note
    else:
        assert raised is None
        assert response is not None
        assert response.text == "answer"

    if raised is not None and not (scenario.ending == "ok" and k is None):
        # A failed run re-raises the original error, post failures attached as notes.
        notes = [n for n in getattr(raised, "__notes__", []) if "on_invoked" in n]
        assert len(notes) == len(post_failures)
        for spec, note in zip(reversed(post_failures), notes, strict=True):
            assert f"{spec.name}.on_invoked" in note


class Watcher(Observer):
    """Sees every stage, model call and attempt, and how each ended; changes nothing."""

    inherited_post_stages = True

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def _watch(self, what: str, call: Any) -> Any:
        try:
            result = await call()
        except BaseException as error:
            self.seen.append((what, type(error).__name__))
            raise
        self.seen.append((what, "ok"))
        return result

    async def run(self, invocation: Any, call_next: Any) -> Any:
        return await self._watch("run", lambda: call_next(invocation))

    async def provider_stage(self, stage: ProviderStage, call_next: Any) -> Any:
        return await self._watch(f"{stage.name}.{stage.stage}", call_next)

    async def model_call(self, request: Any, call_next: Any) -> Any:
        return await self._watch("model", lambda: call_next(request))

    async def model_attempt(self, request: Any, call_next: Any) -> Any:
        return await self._watch("attempt", lambda: call_next(request))


@settings(max_examples=60, deadline=None)
@given(scenarios())
async def test_observers_change_nothing_and_see_every_stage(scenario: Scenario) -> None:
    watchers = (Watcher(), Watcher())
    journal, _, response, raised, _ = await run_scenario(scenario, watchers)
    plain, _, plain_response, plain_raised, _ = await run_scenario(scenario)

    def simplified(entries: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return collapse_groups(
            scenario,
            [
                entry
                if entry[0] not in ("post", "mw-out")
                else (entry[0], entry[1], outcome_kind(entry[2], entry[3]))
                for entry in entries
            ],
        )

    assert simplified(journal) == simplified(plain) == expected_journal(scenario)
    assert type(raised) is type(plain_raised)
    assert (response is None) == (plain_response is None)
    first, second = (watcher.seen for watcher in watchers)
    assert first == second  # the outer one sees what the inner one passed on
    assert first[-1] == ("run", "ok" if raised is None else type(raised).__name__)
    # One observed stage per pre stage that ran and per post stage, as the providers wrote.
    stages = sorted(what for what, _ in first if what.endswith(("on_invoking", "on_invoked")))
    written = sorted(
        f"{entry[1]}.on_invoking" if entry[0] == "pre" else f"{entry[1]}.on_invoked"
        for entry in journal
        if entry[0] in ("pre", "post")
    )
    assert stages == written


class Recorder(ContextProvider):
    """Records its post stage; optionally sleeps in it."""

    def __init__(self, name: str, log: list[tuple[str, str]], *, post_sleep: float = 0.0) -> None:
        self.name = name
        self.log = log
        self.post_sleep = post_sleep

    async def on_invoked(
        self,
        agent: Any,
        session: Any,
        request_messages: Sequence[ChatMessage],
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        if self.post_sleep:
            await anyio.sleep(self.post_sleep)
        kind = "response" if error is None else type(error).__name__
        self.log.append((self.name, kind))


def cancelling_model(scope_box: list[anyio.CancelScope]) -> ScriptedChatClient:
    async def answer(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
        scope_box[0].cancel()
        await anyio.sleep(5)
        return "unreachable"

    return ScriptedChatClient([answer])


@pytest.mark.mock_clock
async def test_post_stages_of_a_cancelled_run_run_shielded() -> None:
    log: list[tuple[str, str]] = []
    box: list[anyio.CancelScope] = []
    agent = Agent(
        cancelling_model(box),
        stack=[Recorder("outer", log, post_sleep=0.01), Recorder("inner", log, post_sleep=0.01)],
    )
    with anyio.CancelScope() as scope:
        box.append(scope)
        await agent.run("hi")
    assert scope.cancelled_caught
    cancelled = anyio.get_cancelled_exc_class().__name__
    # Both post stages awaited a checkpoint while cancelled, and both finished.
    assert log == [("inner", cancelled), ("outer", cancelled)]


@pytest.mark.mock_clock
async def test_a_hung_post_stage_of_a_cancelled_run_is_bounded_by_post_timeout() -> None:
    log: list[tuple[str, str]] = []
    box: list[anyio.CancelScope] = []
    agent = Agent(
        cancelling_model(box),
        stack=[Recorder("outer", log), Recorder("hung", log, post_sleep=60)],
        post_timeout=0.05,
    )
    notes: list[str] = []
    with anyio.CancelScope() as scope:
        box.append(scope)
        try:
            await agent.run("hi")
        except anyio.get_cancelled_exc_class() as exc:
            notes = list(getattr(exc, "__notes__", []))
            raise
    assert scope.cancelled_caught
    assert log == [("outer", anyio.get_cancelled_exc_class().__name__)]
    assert len(notes) == 1
    assert "hung.on_invoked" in notes[0]
    assert "post_timeout=0.05" in notes[0]
    assert "TimeoutError" in notes[0]


@pytest.mark.mock_clock
async def test_a_hung_post_stage_alone_is_a_timeout_provider_error() -> None:
    """The overrun is noted on the cancellation and logged: seen even if a scope eats it."""
    log: list[tuple[str, str]] = []
    box: list[anyio.CancelScope] = []
    agent = Agent(
        cancelling_model(box), stack=[Recorder("hung", log, post_sleep=60)], post_timeout=0.02
    )
    with capture_logs() as events, anyio.CancelScope() as scope:
        box.append(scope)
        await agent.run("hi")
    failed = [e for e in events if e["event"] == "provider.post_failed"]
    assert len(failed) == 1
    assert (failed[0]["provider"], failed[0]["stage"]) == ("hung", "on_invoked")
    assert failed[0]["error"].startswith("TimeoutError")


@pytest.mark.mock_clock
async def test_a_cancellation_during_a_post_stage_shields_the_remaining_ones() -> None:
    log: list[tuple[str, str]] = []
    box: list[anyio.CancelScope] = []

    class CancelsInPost(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            log.append(("canceller", "start"))
            box[0].cancel()
            await anyio.sleep(5)

    agent = Agent(
        ScriptedChatClient(["fine"]),
        stack=[Recorder("outer", log, post_sleep=0.01), CancelsInPost()],
    )
    with anyio.CancelScope() as scope:
        box.append(scope)
        await agent.run("hi")
    assert scope.cancelled_caught
    assert log == [("canceller", "start"), ("outer", anyio.get_cancelled_exc_class().__name__)]


@pytest.mark.mock_clock
async def test_post_stages_of_a_live_run_obey_the_callers_deadline() -> None:
    """No cancel scope on the fast path: the caller's own deadline reaches a post stage."""
    log: list[tuple[str, str]] = []
    agent = Agent(
        ScriptedChatClient(["fine"]),
        stack=[Recorder("outer", log), Recorder("slow", log, post_sleep=60)],
    )
    with anyio.move_on_after(0.05) as scope:
        await agent.run("hi")
    assert scope.cancelled_caught
    assert log == [("outer", anyio.get_cancelled_exc_class().__name__)]


class Fatal(BaseException):
    """A BaseException that is not an Exception."""


async def test_a_base_exception_is_never_wrapped_and_posts_still_run() -> None:
    log: list[tuple[str, str]] = []
    fatal = Fatal("stop")
    agent = Agent(ScriptedChatClient([fatal]), stack=[Recorder("a", log), Recorder("b", log)])
    with pytest.raises(Fatal) as info:
        await agent.run("hi")
    assert info.value is fatal
    assert log == [("b", "Fatal"), ("a", "Fatal")]


@pytest.mark.parametrize(
    ("result", "field"),
    [
        (None, "result"),
        ("text", "result"),
        (ContextResult(instructions=3), "instructions"),  # type: ignore[arg-type]
        (ContextResult(messages="hello"), "messages"),  # type: ignore[arg-type]
        (ContextResult(messages=[ChatMessage.user("a"), "b"]), "messages[1]"),  # type: ignore[list-item]
        (ContextResult(tools=[object()]), "tools[0]"),  # type: ignore[list-item]
        (ContextResult(tools=None), "tools"),  # type: ignore[arg-type]
        (ContextResult(replace_messages=1), "replace_messages"),  # type: ignore[arg-type]
    ],
)
async def test_a_malformed_result_names_the_provider_and_the_field(
    result: object, field: str
) -> None:
    log: list[tuple[str, str]] = []

    class Broken(ContextProvider):
        name = "broken"

        async def on_invoking(self, *args: Any) -> Any:
            return result

        async def on_invoked(self, *args: Any) -> None:
            log.append(("broken", "post"))

    client = ScriptedChatClient(["never"])
    agent = Agent(client, stack=[Recorder("outer", log), Broken()])
    with pytest.raises(ProviderError) as info:
        await agent.run("hi")
    error = info.value
    assert (error.provider, error.stage, error.field) == ("broken", "on_invoking", field)
    assert field in str(error)
    assert "broken" in str(error)
    # Its pre stage did not return a usable result: no post stage for it; outer ones get the error.
    assert log == [("outer", "ProviderError")]
    assert client.requests == []


async def test_a_provider_without_on_invoked_has_no_post_stage() -> None:
    class PreOnly:
        name = "pre-only"

        async def on_invoking(self, *args: Any) -> ContextResult:
            return ContextResult(instructions="from a duck")

    client = ScriptedChatClient(["ok"])
    response = await Agent(client, stack=[PreOnly()]).run("hi")
    assert response.text == "ok"
    assert client.requests[0].messages[0] == ChatMessage.system("from a duck")


async def test_post_failure_does_not_change_what_outer_layers_see() -> None:
    seen: list[tuple[str, str]] = []

    class Outer(ContextProvider):
        async def on_invoked(
            self, agent: Any, session: Any, req: Any, response: Any, error: Any
        ) -> None:
            seen.append(("outer", response.text if response else repr(error)))

    class Failing(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            raise PostFailure("disk full")

    agent = Agent(ScriptedChatClient(["fine"]), stack=[Outer(), Failing()])
    with pytest.raises(ProviderError) as info:
        await agent.run("hi")
    assert seen == [("outer", "fine")]
    assert (info.value.provider, info.value.stage) == ("Failing", "on_invoked")
    assert isinstance(info.value.__cause__, PostFailure)


@settings(max_examples=30, deadline=None)
@given(scenarios(max_providers=3))
async def test_an_agent_is_reusable_and_runs_are_independent(scenario: Scenario) -> None:
    """Running the same scenario twice gives the same journal (no state leaks between runs)."""
    first, *_ = await run_scenario(scenario)
    second, *_ = await run_scenario(scenario)
    # A group's pre stages run in no fixed order (trio even shuffles them on purpose).
    simplify = collapse_groups(scenario, [e[:2] for e in first])
    assert simplify == collapse_groups(scenario, [e[:2] for e in second])


def test_provider_spec_is_hashable() -> None:
    assert ProviderSpec("p", ContextResult()) == ProviderSpec("p", ContextResult())


async def test_a_cancellation_arriving_in_a_post_stage_of_a_failed_run_propagates_unchanged() -> (
    None
):
    """raf attaches nothing to the cancellation: no ``__cause__``, as between nested layers."""
    box: list[anyio.CancelScope] = []
    seen: list[BaseException | None] = []

    class CancelsInPost(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            box[0].cancel()
            await anyio.sleep(5)

    class Outer(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            seen.append(args[-1])

    failure = ModelFailure("model down")
    agent = Agent(ScriptedChatClient([failure]), stack=[Outer(), CancelsInPost()])
    raised: list[BaseException] = []
    with anyio.CancelScope() as scope:
        box.append(scope)
        try:
            await agent.run("hi")
        except BaseException as exc:
            raised.append(exc)
            raise
    assert scope.cancelled_caught
    (cancelled,) = raised
    assert isinstance(cancelled, anyio.get_cancelled_exc_class())
    assert seen == [cancelled]
    assert cancelled.__cause__ is None
    assert cancelled.__context__ is failure  # Python's implicit chaining, as between layers


@pytest.mark.parametrize("where", ["pre", "post", "model"])
async def test_a_base_exception_from_any_stage_of_a_mixed_stack_propagates_unchanged(
    where: str,
) -> None:
    """Fused layers, a group and middleware in between: the same object comes out."""
    from raf import parallel

    fatal = Fatal("stop")
    log: list[tuple[str, object]] = []

    class Stage(ContextProvider):
        def __init__(self, name: str, *, pre: bool = False, post: bool = False) -> None:
            self.name, self.pre, self.post = name, pre, post

        async def on_invoking(self, *args: Any) -> ContextResult:
            if self.pre:
                raise fatal
            return ContextResult()

        async def on_invoked(self, *args: Any) -> None:
            error = args[-1]
            log.append((self.name, "ok" if error is None else error))
            if self.post:
                raise fatal

    async def middleware(request: Any, call_next: Any) -> AgentResponse:
        response: AgentResponse = await call_next(request)
        return response

    stack = [
        Stage("a"),
        middleware,
        parallel(Stage("g1"), Stage("g2")),
        Stage("b", pre=where == "pre", post=where == "post"),
        Stage("c"),
    ]
    agent = Agent(ScriptedChatClient([fatal if where == "model" else "fine"]), stack=stack)
    with pytest.raises(Fatal) as caught:
        await agent.run("hi")
    assert caught.value is fatal
    inner = {"pre": [], "post": [("c", "ok"), ("b", "ok")], "model": [("c", fatal), ("b", fatal)]}
    assert log == [*inner[where], ("g2", fatal), ("g1", fatal), ("a", fatal)]


# -- review of the core: the edges ---------------------------------------------------


async def test_an_on_invoked_set_on_the_instance_runs() -> None:
    log: list[str] = []
    provider = ContextProvider()

    async def on_invoked(*args: Any) -> None:
        log.append("post")

    provider.on_invoked = on_invoked  # type: ignore[method-assign]
    await Agent(ScriptedChatClient(["ok"]), stack=[provider]).run("hi")
    assert log == ["post"]


async def test_a_post_stages_own_timeout_error_is_its_failure_not_an_overrun() -> None:
    box: list[anyio.CancelScope] = []

    class Times(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            raise TimeoutError("the audit service timed out")

    agent = Agent(cancelling_model(box), stack=[Times()], post_timeout=5)
    notes: list[str] = []
    with capture_logs(), anyio.CancelScope() as scope:
        box.append(scope)
        try:
            await agent.run("hi")
        except anyio.get_cancelled_exc_class() as exc:
            notes = list(getattr(exc, "__notes__", []))
            raise
    assert len(notes) == 1
    assert "TimeoutError: the audit service timed out" in notes[0]
    assert "post_timeout" not in notes[0]


@pytest.mark.mock_clock
async def test_a_deadline_firing_as_the_model_returns_still_shields_the_post_stage() -> None:
    """The response came back, but the scope is cancelled: the save must not be cut."""
    saved: list[str] = []
    box: list[anyio.CancelScope] = []

    async def answer(messages: Sequence[ChatMessage], options: ChatOptions) -> str:
        box[0].cancel()  # the deadline fires, but the answer is already here
        return "answer"

    class Saves(ContextProvider):
        async def on_invoked(
            self, agent: Any, session: Any, request: Any, response: Any, error: Any
        ) -> None:
            await anyio.sleep(0.01)  # a real save awaits: cut at once without the shield
            saved.append("saved" if response is not None else "error")

    agent = Agent(ScriptedChatClient([answer]), stack=[Saves()])
    with anyio.CancelScope() as scope:
        box.append(scope)
        await agent.run("hi")
        await anyio.sleep(1)  # the cancellation lands here, after the run
    assert saved == ["saved"]


async def test_a_failing_post_stage_of_a_cancelled_run_is_logged_even_when_the_scope_eats_it() -> (
    None
):
    class Fails(ContextProvider):
        async def on_invoked(self, *args: Any) -> None:
            raise OSError("disk full")

    box: list[anyio.CancelScope] = []
    with capture_logs() as events:
        with anyio.move_on_after(5) as scope:
            box.append(scope)
            await Agent(cancelling_model(box), stack=[Fails()]).run("hi")
    assert scope.cancelled_caught
    failed = [e for e in events if e["event"] == "provider.post_failed"]
    assert [(e["provider"], e["error"]) for e in failed] == [("Fails", "OSError: disk full")]


@pytest.mark.mock_clock
async def test_a_group_members_malformed_result_is_noted_when_the_group_is_cancelled() -> None:
    from raf import parallel

    started = anyio.Event()

    class Malformed(ContextProvider):
        async def on_invoking(self, *args: Any) -> Any:
            return "not a ContextResult"

    class Slow(ContextProvider):
        async def on_invoking(self, *args: Any) -> Any:
            started.set()
            await anyio.sleep(10)

    agent = Agent(ScriptedChatClient(["never"]), stack=[parallel(Malformed(), Slow())])
    notes: list[str] = []
    async with anyio.create_task_group() as group:

        async def run() -> None:
            nonlocal notes
            try:
                await agent.run("hi")
            except anyio.get_cancelled_exc_class() as exc:
                notes = list(getattr(exc, "__notes__", []))
                raise

        group.start_soon(run)
        await started.wait()
        await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    assert len(notes) == 1
    assert "Malformed.on_invoking" in notes[0]
    assert "expected a ContextResult" in notes[0]
