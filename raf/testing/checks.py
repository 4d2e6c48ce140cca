"""check_provider: a battery of simulated runs that a context provider must pass.

The battery calls the provider's stages directly, as the provider layer
does, with arguments it can watch: the request messages as a ``list`` and
options whose ``extra`` is a plain ``dict`` (so a stage that writes to them
is caught), each simulated run with its own :class:`raf.InMemorySession`
holding a short history. It runs on asyncio and trio, each backend in a
worker thread of its own, so a stage that never returns fails the check
instead of hanging the test.
"""

from __future__ import annotations

import importlib.util
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import attrs

from raf._agent.agent import Agent
from raf._clients.scripted import ScriptedChatClient
from raf._onion.compose import post_stage_of
from raf._onion.errors import provider_name
from raf._onion.parallel import ProviderGroup
from raf._sessions.memory import InMemorySession
from raf._values.context import checked_result
from raf._values.messages import AgentResponse, ChatMessage
from raf.errors import ContextResultError, ProviderError, StreamClosedError
from raf.testing._runs import (
    _RUNS,
    _Broken,
    _check_untouched,
    _describe_order,
    _difference,
    _difference_one,
    _in_context,
    _new_run,
    _normalized,
    _Run,
    _RunSpec,
)

__all__ = ["RULES", "check_provider"]

#: The rules of :func:`check_provider`: name -> (what the rule says, how to fix a breach).
RULES: dict[str, tuple[str, str]] = {
    "returns-context-result": (
        "on_invoking returns a raf.ContextResult on every path",
        "end every path of on_invoking with 'return ContextResult(...)' "
        "('return ContextResult()' when there is nothing to add), with a str or None as "
        "instructions and sequences of ChatMessage and Tool as messages and tools",
    ),
    "no-mutation": (
        "a stage leaves the request messages and the options it is given as they were",
        "never write to the arguments: copy what you need to change "
        "(list(messages), dict(options.extra)) and return what to add in the ContextResult; "
        "the same objects go on to the model and to the other providers",
    ),
    "post-stage-never-raises": (
        "on_invoked returns normally after a success, an error, a cancellation "
        "or an early close of a stream (raf.StreamClosedError)",
        "look at `error` first: when it is not None, `response` is None; do not re-raise "
        "`error` (raf propagates it itself) and catch the failures of your own clean-up",
    ),
    "per-run-state": (
        "one provider instance serves concurrent runs: each run's stages see that run's own state",
        "keep per-run state in local variables, in a closure (a tool built in on_invoking), "
        "in the session, or in a dict keyed by session.id, never in an attribute of self "
        "that on_invoking sets and on_invoked reads",
    ),
    "prompt-cancellation": (
        "on_invoking returns (or raises) promptly once its run is cancelled",
        "let the cancellation through: no shielded scope and no 'except' that swallows "
        "anyio.get_cancelled_exc_class() around waiting; no time.sleep or other blocking "
        "calls (use anyio.to_thread.run_sync(..., abandon_on_cancel=True) or do the work "
        "ahead of time)",
    ),
}


# The battery -------------------------------------------------------------------------------


@attrs.define
class _Battery:
    """The state of one backend's battery: the factory, the agent, where it is."""

    factory: Callable[[], Any]
    backend: str
    grace: float
    report: queue.Queue[tuple[str, BaseException | None]]
    agent: Any = None
    label: str = "the provider"
    step: str = "starting"
    #: The rules found broken so far, the first time each was (one report per rule).
    broken: dict[str, _Broken] = attrs.field(factory=dict)

    def note(self, broken: _Broken) -> None:
        self.broken.setdefault(broken.rule, broken)

    def make(self) -> Any:
        provider = self.factory()
        if isinstance(provider, ProviderGroup):
            raise TypeError(
                "check_provider(factory): factory() returned a parallel group; "
                "check each of its providers on its own"
            )
        if isinstance(provider, type) or not callable(getattr(provider, "on_invoking", None)):
            raise TypeError(
                "check_provider(factory): factory() must return a context provider "
                f"(an object with an async on_invoking), got {provider!r}"
            )
        if self.label == "the provider":
            name = provider_name(provider)
            cls = type(provider)
            where = f"{cls.__module__}.{cls.__qualname__}"
            self.label = f"{name!r} ({where})" if name != cls.__name__ else f"{name!r}"
        return provider

    async def pre(self, provider: Any, run: _Run, what: str) -> Any:
        """``on_invoking`` of ``run``: its result, checked, and the arguments checked after."""
        self.step = f"{what}: on_invoking of run {run.spec.key}"
        try:
            result = await _in_context(
                run.context,
                provider.on_invoking(self.agent, run.session, run.messages, run.options),
            )
        except Exception as exc:
            raise _Broken(
                "returns-context-result",
                f"{what}: on_invoking raised {type(exc).__name__}: {exc}",
            ) from exc
        try:
            checked_result(result)
        except ContextResultError as exc:
            raise _Broken("returns-context-result", f"{what}: on_invoking returned {exc}") from None
        _check_untouched(run, f"{what}: on_invoking")
        run.result = result
        return result

    async def post(
        self,
        provider: Any,
        run: _Run,
        what: str,
        response: AgentResponse | None,
        error: BaseException | None,
    ) -> None:
        """``on_invoked`` of ``run`` with the outcome; it must return normally."""
        on_invoked = post_stage_of(provider)
        if on_invoked is None:
            return
        self.step = f"{what}: on_invoked of run {run.spec.key}"
        try:
            await _in_context(
                run.context, on_invoked(self.agent, run.session, run.messages, response, error)
            )
        except Exception as exc:
            raise _Broken(
                "post-stage-never-raises",
                f"{what}: on_invoked raised {type(exc).__name__}: {exc}",
            ) from exc
        _check_untouched(run, f"{what}: on_invoked")

    async def post_cancelled(self, provider: Any, run: _Run, what: str) -> None:
        """``on_invoked`` as a cancelled run calls it: with the backend's cancellation
        exception, inside a cancelled scope, shielded (raf's post stages of a cancelled run)."""
        on_invoked = post_stage_of(provider)
        if on_invoked is None:
            return
        self.step = f"{what}: on_invoked of run {run.spec.key}, handed a cancellation"
        failure: BaseException | None = None
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await anyio.lowlevel.checkpoint()
            except anyio.get_cancelled_exc_class() as cancelled:
                with anyio.CancelScope(shield=True):
                    try:
                        await _in_context(
                            run.context,
                            on_invoked(self.agent, run.session, run.messages, None, cancelled),
                        )
                    except BaseException as exc:
                        failure = exc
                raise
        if failure is not None:
            raise _Broken(
                "post-stage-never-raises",
                f"{what}: handed the run's cancellation, on_invoked raised "
                f"{type(failure).__name__}: {failure}",
            ) from failure
        _check_untouched(run, f"{what}: on_invoked")

    # Rules 1-3: results, arguments, post stages --------------------------------------

    async def outcomes(self) -> None:
        """Each run, ended each way, with a fresh provider each time."""
        errors: list[tuple[str, Callable[[_RunSpec], BaseException]]] = [
            ("a run that failed", lambda spec: RuntimeError("the model failed")),
            (
                "a run whose later provider failed",
                lambda spec: ProviderError("inner", "on_invoking", "RuntimeError: broken"),
            ),
            (
                "a stream closed early",
                lambda spec: StreamClosedError(
                    AgentResponse((ChatMessage.assistant(spec.response.text[:5]),))
                ),
            ),
        ]
        for spec in _RUNS:
            # Each way is a probe of its own: a rule broken in one does not hide the others.
            try:
                provider = self.make()
                run = await _new_run(spec)
                await self.pre(provider, run, "a successful run")
                await self.post(provider, run, "a successful run", spec.response, None)
            except _Broken as broken:
                self.note(broken)
            for what, error in errors:
                try:
                    provider = self.make()
                    run = await _new_run(spec)
                    await self.pre(provider, run, what)
                    await self.post(provider, run, what, None, error(spec))
                except _Broken as broken:
                    self.note(broken)
            try:
                provider = self.make()
                run = await _new_run(spec)
                await self.pre(provider, run, "a cancelled run")
                await self.post_cancelled(provider, run, "a cancelled run")
            except _Broken as broken:
                self.note(broken)

    # Rule 4: per-run state ---------------------------------------------------------

    async def observe(self, order: Sequence[tuple[str, int]], *, yielding: bool = False) -> Any:
        """Run the stages of runs 0 and 1 of ``_RUNS`` on one fresh provider, in ``order``
        (``("pre", i)`` / ``("post", i)``); what each run got and left behind."""
        provider = self.make()
        runs = [await _new_run(spec, yielding=yielding) for spec in _RUNS]
        for stage, index in order:
            await self.stage(provider, runs[index], stage)
        return [await self.seen(run) for run in runs]

    async def stage(self, provider: Any, run: _Run, stage: str) -> None:
        what = "runs of one instance"
        if stage == "pre":
            await self.pre(provider, run, what)
            return
        on_invoked = post_stage_of(provider)
        if on_invoked is None:
            return
        self.step = f"{what}: on_invoked of run {run.spec.key}"
        try:
            await _in_context(
                run.context,
                on_invoked(self.agent, run.session, run.messages, run.spec.response, None),
            )
        except Exception as exc:  # seen as an outcome: a leak may make a post stage fail
            run.post_error = f"{type(exc).__name__}: {exc}"

    async def seen(self, run: _Run) -> tuple[Any, tuple[ChatMessage, ...], str | None]:
        history = await InMemorySession.get_messages(run.session)
        return (_normalized(run.result), history, run.post_error)

    async def concurrently(self, first: int) -> Any:
        """Both runs in one task group (pre, then post, each), sessions that yield."""
        provider = self.make()
        runs = [await _new_run(spec, yielding=True) for spec in _RUNS]

        async def one(run: _Run) -> None:
            await self.stage(provider, run, "pre")
            await anyio.lowlevel.checkpoint()
            await self.stage(provider, run, "post")

        async with anyio.create_task_group() as group:
            group.start_soon(one, runs[first])
            group.start_soon(one, runs[1 - first])
        return [await self.seen(run) for run in runs]

    async def per_run_state(self) -> None:
        """Interleaved runs of one instance leave what the same runs leave one after another.

        Stage by stage: for runs X and Y, ``pre X, pre Y, post X, post Y`` (and
        ``post Y, post X``) must leave each session as ``pre X, post X, pre Y,
        post Y`` does: a post stage that reads what the last pre stage put on
        ``self`` finds run Y's state in run X. Concurrently: both runs in
        tasks whose session calls let the other run in, compared with each
        run alone on a fresh instance (or after the other one): a stage that
        keeps run state on ``self`` across an await finds the other run's.
        Only what the provider does the same way twice is compared (a clock
        or a random id in a result is not a leak).
        """
        for x in (0, 1):
            y = 1 - x
            sequential = await self.observe([("pre", x), ("post", x), ("pre", y), ("post", y)])
            again = await self.observe([("pre", x), ("post", x), ("pre", y), ("post", y)])
            for order in (
                [("pre", x), ("pre", y), ("post", x), ("post", y)],
                [("pre", x), ("pre", y), ("post", y), ("post", x)],
            ):
                await self.compare(order, sequential, again)
        alone = [await self.observe([("pre", i), ("post", i)]) for i in (0, 1)]
        alone_again = [await self.observe([("pre", i), ("post", i)]) for i in (0, 1)]
        after = [
            await self.observe([("pre", 1 - i), ("post", 1 - i), ("pre", i), ("post", i)])
            for i in (0, 1)
        ]
        references = [
            # For run i: alone, alone again, after the other run.
            [alone[0][0], alone_again[0][0], after[0][0]],
            [alone[1][1], alone_again[1][1], after[1][1]],
        ]
        for first in (0, 1):
            await self.compare_concurrent(first, references)

    async def compare(self, order: Sequence[tuple[str, int]], reference: Any, again: Any) -> None:
        """Raise per-run-state if the runs in ``order`` leave what the sequential runs
        (``reference``, ``again``: twice, to know what is stable) do not; tried twice."""
        for attempt in range(2):
            got = await self.observe(order)
            difference = _difference(got, reference, again, ["post"])
            if difference is None:
                return
            if attempt == 1:
                raise _Broken(
                    "per-run-state",
                    f"with the stages in the order {_describe_order(order)}, {difference}",
                )

    async def compare_concurrent(self, first: int, references: list[list[Any]]) -> None:
        for attempt in range(2):
            got = await self.concurrently(first)
            problems = []
            for index in (0, 1):
                alone, alone_again, after = references[index]
                ok = any(
                    _difference_one(got[index], reference, alone_again, ["pre", "post"]) is None
                    for reference in (alone, after)
                )
                if not ok:
                    problems.append(
                        _difference_one(got[index], alone, alone_again, ["pre", "post"])
                        or "differs"
                    )
            if not problems:
                return
            if attempt == 1:
                raise _Broken(
                    "per-run-state",
                    f"with runs A and B at once (run {_RUNS[first].key} started first), "
                    + "; ".join(problems),
                )

    # Rule 5: cancellation ----------------------------------------------------------

    async def cancellation(self) -> None:
        """on_invoking cancelled at its start, after its first step and after 50 ms."""
        for spec in _RUNS:
            for point in ("at its start", "after its first step", "after 50 ms"):
                try:
                    await self.cancel_probe(spec, point)
                except _Broken as broken:
                    self.note(broken)

    async def cancel_probe(self, spec: _RunSpec, point: str) -> None:
        provider = self.make()
        run = await _new_run(spec)
        what = f"a run cancelled {point}"
        self.step = f"{what}: on_invoking of run {spec.key}"
        finished = anyio.Event()
        times: dict[str, float] = {}
        outcome: dict[str, Any] = {}
        scope = anyio.CancelScope()

        async def stage() -> None:
            try:
                with scope:
                    if point == "at its start":
                        times["cancelled"] = time.monotonic()
                        scope.cancel()
                    outcome["result"] = await _in_context(
                        run.context,
                        provider.on_invoking(self.agent, run.session, run.messages, run.options),
                    )
            except Exception as exc:
                outcome["error"] = exc
            finally:
                times["finished"] = time.monotonic()
                finished.set()

        async with anyio.create_task_group() as group:
            group.start_soon(stage)
            if point == "after its first step":
                await anyio.lowlevel.checkpoint()
            elif point == "after 50 ms":
                await anyio.sleep(0.05)
            if not finished.is_set() and "cancelled" not in times:
                times["cancelled"] = time.monotonic()
                scope.cancel()
            with anyio.move_on_after(self.grace):
                await finished.wait()
            late = not finished.is_set() or (
                "cancelled" in times and times["finished"] - times["cancelled"] > self.grace
            )
            if late:
                failure = _Broken(
                    "prompt-cancellation",
                    f"{what}: on_invoking of run {spec.key} was still running {self.grace} s "
                    "after the cancellation",
                )
                # Reported now: the stage may never end, and this task group waits for it.
                self.note(failure)
                self.report.put(("late", None))
        if "result" in outcome:
            await self.post_cancelled(provider, run, what)

    def failure(self, broken: _Broken) -> str:
        said, fix = RULES[broken.rule]
        return (
            f"check_provider: {self.label} broke the rule {broken.rule!r}: {said}.\n"
            f"  What happened (on {self.backend}): {broken.detail}\n"
            f"  How to fix it: {fix}."
        )

    async def run_all(self) -> None:
        self.agent = Agent(
            ScriptedChatClient(), name="check_provider", instructions="You are being checked."
        )
        self.make()
        # Cancellation first: a stage that shields slow work fails fast here, where
        # the other rules would wait for it again and again.
        for check in (self.cancellation, self.outcomes, self.per_run_state):
            try:
                await check()
            except _Broken as broken:  # a probe that the others depend on broke
                self.note(broken)


# The public function ---------------------------------------------------------------------


def check_provider(
    factory: Callable[[], Any],
    *,
    backends: Sequence[str] = ("asyncio", "trio"),
    cancel_grace: float = 1.0,
    timeout: float = 60.0,
) -> None:
    """Run a context provider through raf's battery of simulated runs; fail loudly.

    ``factory()`` returns a fresh provider (a class with no required
    argument is a factory; else ``lambda: MyProvider(...)``); the battery
    makes one per simulated run, and two runs share one where it checks
    per-run state. On each of ``backends`` (each with :func:`anyio.run`, in
    a worker thread) it raises one ``AssertionError`` that names the
    provider and lists every rule it broke (a key of :data:`RULES`; each
    once, as first seen), what happened and how to fix it, when the provider

    - returns something that is not a :class:`raf.ContextResult` from
      ``on_invoking``, or raises there on a plain run
      (``"returns-context-result"``);
    - changes the request messages or the options it is given
      (``"no-mutation"``);
    - raises from ``on_invoked`` after a success, an error, a cancellation
      or a :class:`raf.StreamClosedError` (``"post-stage-never-raises"``);
    - leaks state between concurrent runs of one instance
      (``"per-run-state"``);
    - keeps a cancelled run waiting: ``on_invoking`` still running
      ``cancel_grace`` seconds after its run was cancelled
      (``"prompt-cancellation"``).

    Each simulated run has its own :class:`raf.InMemorySession` holding a
    short history. A battery that does not finish within ``timeout``
    seconds on a backend fails, naming the stage it was in; a stage that
    keeps a cancelled run waiting ends the battery there (it may never
    return), with the rules found so far. A plain function: call it from a
    plain (not async) test.

    >>> from raf import ContextProvider, ContextResult
    >>> class Tone(ContextProvider):
    ...     async def on_invoking(self, agent, session, messages, options):
    ...         return ContextResult(instructions="Be brief.")
    >>> check_provider(Tone)
    """
    if not callable(factory):
        raise TypeError(
            f"check_provider(factory): factory must be callable (a class, or a function "
            f"returning a fresh provider), got {factory!r}"
        )
    if not isinstance(backends, (list, tuple)) or not backends:
        raise TypeError(f"check_provider: backends must be a non-empty list, got {backends!r}")
    found: dict[str, tuple[str, _Broken]] = {}
    for backend in backends:
        if backend == "trio" and importlib.util.find_spec("trio") is None:
            raise RuntimeError(
                "check_provider: the trio backend needs trio (pip install 'raf-agents[testing]'); "
                "or check on asyncio alone: check_provider(factory, backends=['asyncio'])"
            )
        _run_backend(factory, backend, cancel_grace, timeout, found)
    _raise_found(found)


def _raise_found(found: dict[str, tuple[str, _Broken]], also: str | None = None) -> None:
    """One AssertionError for every rule found broken (each once, on its first backend),
    and ``also`` (a battery that did not finish) last."""
    if not found and also is None:
        return
    texts = [text for text, _ in found.values()]
    first = next(iter(found.values()))[1] if found else None
    if len(texts) > 1:
        label = texts[0].removeprefix("check_provider: ").split(" broke the rule ")[0]
        texts.insert(0, f"check_provider: {label} broke {len(texts)} rules:")
    raise AssertionError("\n".join([*texts, *([also] if also else [])])) from (
        first.__cause__ if first is not None else None
    )


def _run_backend(
    factory: Callable[[], Any],
    backend: str,
    grace: float,
    timeout: float,
    found: dict[str, tuple[str, _Broken]],
) -> None:
    """The battery on one backend; the rules it finds broken go into ``found``."""
    report: queue.Queue[tuple[str, BaseException | None]] = queue.Queue()
    battery = _Battery(factory, backend, grace, report)

    def work() -> None:
        try:
            anyio.run(battery.run_all, backend=backend)
        except BaseException as exc:
            report.put(("fail", exc))
        else:
            report.put(("done", None))

    # A thread of its own, so that a stage that blocks forever fails the check, not the
    # test run: the thread is left behind (a daemon) until the stage ends.
    worker = threading.Thread(target=work, name=f"raf-check-provider-{backend}", daemon=True)
    worker.start()
    try:
        # "late": a stage kept a cancelled run waiting, and may never end: what was found
        # so far is the report (the battery is left behind in its thread).
        kind, error = report.get(timeout=timeout)
    except queue.Empty:
        kind, error = "timeout", None
    for rule, broken in list(battery.broken.items()):
        found.setdefault(rule, (battery.failure(broken), broken))
    if kind == "timeout":
        _raise_found(
            found,
            f"check_provider: the battery did not finish within {timeout} s on {backend}; "
            f"{battery.label} was at: {battery.step} (a stage that never returns?)",
        )
    if kind == "fail" and error is not None:
        raise error
    if kind == "late":
        _raise_found(found)
