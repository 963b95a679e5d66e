"""Seeded, replayable race stress of whole tool-loop sessions against the fake endpoint.

Each session runs ``ToolLoop.run`` against its own :class:`FakeEndpoint` and a scripted
model (one to four turns of ``look``/``move`` calls, then a summary), sometimes with
compaction, and cuts it at a moment drawn from the seed: with the operator's token
(``shutdown``, ``session_expired``, ``disconnect``), by supersession
(``SessionGeneration.advance``) or by the wall clock; while a request is in flight, while
the executor runs (awaiting, or blocking before its first await), while the summarizer
runs, inside an event sink between awaits, or after a drawn number of event-loop ticks.

After every session, whatever the moment:

* no executor call started and no request reached the endpoint after the cut (the
  executor's own log and the fake's record, not the result, say so);
* ``run`` returned exactly one typed result (one ``finish`` event, the same result), with
  the outcome the cut calls for, and left no cancellation pending on its task;
* no task is left running and, once the client is closed, no connection is left open.

The default batch (:data:`tests.proof_profiles.FAST_SESSIONS` sessions, a few seconds) runs
in CI; ``RACE_PROFILE=long`` runs 10,000, ``RACE_SEED`` replays the batch a failure names::

    RACE_PROFILE=long uv run --locked pytest tests/llm_transport/loop/test_race_stress.py \\
        -p no:cacheprovider --timeout=0

Scenarios that once broke a promise (an action after the wall clock, a run acting for a
later generation, a cancelled task with no finish event) have tests of their own at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import pytest

from metacrate_grid_agent import (
    CancelToken,
    LLMClient,
    LoopEvent,
    LoopResult,
    Message,
    Outcome,
    SessionGeneration,
    Success,
    ToolLoop,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply
from tests.llm_transport.loop_support import (
    GOAL,
    LONG_STALL_S,
    SESSION,
    WAIT_S,
    call,
    calls_reply,
    loop_config,
    make_loop,
    new_tasks,
    start_loop,
)
from tests.llm_transport.support import make_config
from tests.proof_profiles import race_seed, race_sessions

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

Cut = Literal["shutdown", "session_expired", "disconnect", "supersede", "wall_clock", "none"]
Moment = Literal["request", "executor", "executor_sync", "summarizer", "event", "ticks"]

CUTS: Final[tuple[Cut, ...]] = (
    "shutdown", "session_expired", "disconnect", "supersede", "wall_clock", "none",
)  # fmt: skip
#: The wall clock of a session cut by it: short, against stalls of ``LONG_STALL_S``.
SHORT_SESSION_S: Final = 0.2
#: Event kinds a sink may cut in: each is followed by a check before the next action.
CUTTING_EVENTS: Final = ("request", "reply", "tool_call", "compaction")
FINAL_TEXT: Final = "done: I walked to the fountain and saw ducks"


def seeded(key: str) -> random.Random:
    """A generator for test data, replayable from ``key`` (not for anything secret)."""
    return random.Random(key)  # noqa: S311 - seeded on purpose, so a failure replays


@dataclass(frozen=True)
class Scenario:
    """One session of the batch, drawn from ``Random(f"{seed}:{index}")``."""

    index: int
    cut: Cut
    moment: Moment
    at: int
    """Which occurrence of the moment (from 0) carries the cut."""
    turns: tuple[tuple[str, ...], ...]
    """Tool names asked for per turn; one more turn answers with :data:`FINAL_TEXT`."""
    compaction: bool
    event_kind: str
    ticks: int

    @classmethod
    def draw(cls, seed: int, index: int) -> Scenario:
        """The scenario of session ``index`` of the batch seeded ``seed``."""
        rng = seeded(f"{seed}:{index}")
        cut = rng.choice(CUTS)
        moments: list[Moment] = ["request", "executor", "summarizer"]
        if cut != "wall_clock":  # the wall clock only runs out while something awaits
            moments += ["executor_sync", "event", "ticks"]
        turns = tuple(
            tuple(rng.choice((("look",), ("move",), ("look", "move"), ("move", "look"))))
            for _ in range(rng.randint(1, 4))
        )
        moment = rng.choice(moments)
        return cls(
            index=index,
            cut=cut,
            moment=moment,
            # Summaries and requests come a few per session; calls and events more often.
            at=rng.randint(0, 1 if moment in ("summarizer", "request") else 3),
            turns=turns,
            compaction=moment == "summarizer" or rng.random() < 0.4,
            event_kind=rng.choice(CUTTING_EVENTS),
            # A whole session takes a few dozen loop iterations on loopback.
            ticks=rng.randint(0, 40),
        )


@dataclass
class Cutter:
    """Carries out the scenario's cut once, and remembers that it did."""

    scenario: Scenario
    operator: CancelToken
    generation: SessionGeneration
    fired: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def fire(self) -> None:
        """Cut the session now (the wall clock cuts by itself: this only marks the moment)."""
        if self.fired or self.scenario.cut == "none":
            return
        self.fired = True
        self.done.set()
        if self.scenario.cut == "supersede":
            self.generation.advance()
        elif self.scenario.cut != "wall_clock":
            self.operator.cancel(self.scenario.cut)

    def fire_soon(self) -> None:
        """Cut from outside the running task, as an operator or another task would.

        (A cut made synchronously by the session's own task is not delivered to that task
        as a cancellation: it is seen at the next check, so an executor that cuts and then
        keeps awaiting runs on until its own timeout.)
        """
        if self.armed and not self.stalls:
            asyncio.get_running_loop().call_soon(self.fire)
        else:
            self.fire()

    @property
    def armed(self) -> bool:
        """Whether the scenario cuts at all (``none`` runs the session to its end)."""
        return self.scenario.cut != "none"

    @property
    def stalls(self) -> bool:
        """Whether this cut is the wall clock, reached by stalling at the moment."""
        return self.scenario.cut == "wall_clock"


@dataclass
class Observed:
    """What the session did, each action marked with whether the cut had happened."""

    requests: list[tuple[str | None, bool]] = field(default_factory=list)
    announced: set[str] = field(default_factory=set)
    calls: list[tuple[str, bool]] = field(default_factory=list)
    summaries: int = 0
    events: list[LoopEvent] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    def occurrence(self, kind: str) -> int:
        """Count one more occurrence of ``kind``; return its number (from 0)."""
        number = self.counts.get(kind, 0)
        self.counts[kind] = number + 1
        return number


class StressModel:
    """The scripted model: answers turn ``t`` with the scenario's calls, then the summary."""

    def __init__(self, scenario: Scenario, cutter: Cutter, seen: Observed) -> None:
        self.scenario, self.cutter, self.seen = scenario, cutter, seen

    async def __call__(self, request: RecordedRequest) -> Reply:
        turn = len(self.seen.requests)
        self.seen.requests.append((request.header("X-Request-Id"), self.cutter.fired))
        if (
            self.cutter.armed
            and self.scenario.moment == "request"
            and self.seen.occurrence("request") == self.scenario.at
        ):
            self.cutter.fire()
            # Still in flight when the cut lands; the fake ends the stall when the client goes.
            return dataclasses.replace(
                Reply.completion(FINAL_TEXT), stall_before_headers_s=LONG_STALL_S
            )
        if turn < len(self.scenario.turns):
            names = self.scenario.turns[turn]
            arguments = {"look": {"radius": 5}, "move": {"x": 10, "y": 20}}
            return calls_reply(
                *(call(f"c{turn}-{i}", n, arguments[n]) for i, n in enumerate(names))
            )
        return Reply.completion(FINAL_TEXT, usage=(10, 5))


class StressExecutor:
    """Runs ``look`` and ``move``; logs each call with whether the cut had happened."""

    def __init__(self, scenario: Scenario, cutter: Cutter, seen: Observed) -> None:
        self.scenario, self.cutter, self.seen = scenario, cutter, seen
        self._never = asyncio.Event()

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Log the call; at the scenario's moment, cut (or stall past the wall clock)."""
        self.seen.calls.append((call.id, self.cutter.fired))
        moment = self.scenario.moment
        if (
            self.cutter.armed
            and moment in ("executor", "executor_sync")
            and self.seen.occurrence(moment) == self.scenario.at
        ):
            if moment == "executor_sync":  # before any await: a blocking executor cuts
                self.cutter.fire()
                return Success(f"{call.name} ok")
            await asyncio.sleep(0)
            self.cutter.fire_soon()
            await self._never.wait()  # ends only by the cut
        return Success(f"{call.name} ok")


class StressSummarizer:
    """Summarises at once, except at the scenario's moment: then it cuts (or stalls)."""

    def __init__(self, scenario: Scenario, cutter: Cutter, seen: Observed) -> None:
        self.scenario, self.cutter, self.seen = scenario, cutter, seen
        self._never = asyncio.Event()

    async def summarize(self, messages: Sequence[Message], cancel: CancelToken) -> str:
        """A short summary; at the moment, cut then wait for the cut to arrive."""
        self.seen.summaries += 1
        if (
            self.cutter.armed
            and self.scenario.moment == "summarizer"
            and self.seen.occurrence("summarizer") == self.scenario.at
        ):
            self.cutter.fire_soon()
            await self._never.wait()
        return f"summary of {len(messages)} messages"


def _sink(scenario: Scenario, cutter: Cutter, seen: Observed) -> Callable[[LoopEvent], None]:
    def on_event(event: LoopEvent) -> None:
        seen.events.append(event)
        if event.kind == "request" and not cutter.fired and event.request_id is not None:
            seen.announced.add(event.request_id)
        if (
            scenario.moment == "event"
            and event.kind == scenario.event_kind
            and seen.occurrence("event") == scenario.at
        ):
            cutter.fire()

    return on_event


async def _ticks_then_cut(scenario: Scenario, cutter: Cutter, task: asyncio.Task[Any]) -> None:
    for _ in range(scenario.ticks):
        await asyncio.sleep(0)
    if not task.done():
        cutter.fire()


EXPECTED: Final[dict[Cut, Outcome]] = {
    "shutdown": Outcome.CANCELLED,
    "session_expired": Outcome.CANCELLED,
    "disconnect": Outcome.CANCELLED,
    "supersede": Outcome.SUPERSEDED,
    "wall_clock": Outcome.BOUND_REACHED,
}


def _check(scenario: Scenario, cutter: Cutter, seen: Observed, result: LoopResult) -> None:
    """The promises every session keeps, whatever its cut and moment."""
    finishes = [e for e in seen.events if e.kind == "finish"]
    assert len(finishes) == 1, f"{len(finishes)} finish events"
    assert finishes[0].result is result
    assert isinstance(result.outcome, Outcome)
    late_calls = [call_id for call_id, after in seen.calls if after]
    assert late_calls == [], f"executor calls started after the cut: {late_calls}"
    late = [rid for rid, _ in seen.requests if rid not in seen.announced]
    assert late == [], f"requests that reached the endpoint after the cut: {late}"
    assert len({rid for rid, _ in seen.requests}) == len(seen.requests), "a request id repeated"
    if not cutter.fired:
        if scenario.cut == "wall_clock" and result.bound == "wall_clock":
            return  # a slow machine reached the short wall clock before the moment
        assert result.outcome is Outcome.COMPLETED, result
        assert result.final_text == FINAL_TEXT
        return
    assert result.outcome is EXPECTED[scenario.cut], result
    if scenario.cut == "wall_clock":
        assert result.bound == "wall_clock"
    else:
        expected_reason = "superseded" if scenario.cut == "supersede" else scenario.cut
        assert result.cancel_reason == expected_reason
    if result.ambiguous_call is not None:
        assert result.ambiguous_call.name == "move"
        assert result.ambiguous_call.status == "ambiguous"


async def run_session(scenario: Scenario, seed: int) -> None:
    """Run one scenario and check it; a failure names the seed and the session to replay."""
    before = asyncio.all_tasks()
    seen = Observed()
    operator = CancelToken()
    generation = SessionGeneration(SESSION)
    cutter = Cutter(scenario, operator, generation)
    model = StressModel(scenario, cutter, seen)
    try:
        async with FakeEndpoint(responder=model) as ep:
            client = LLMClient(make_config(ep.url, max_retries=0))
            try:
                loop = _stress_loop(client, scenario, cutter, seen)
                handle = start_loop(
                    loop,
                    GOAL,
                    generation=generation,
                    cancel=operator,
                    on_event=_sink(scenario, cutter, seen),
                )
                chaos = None
                if scenario.moment == "ticks":
                    chaos = asyncio.create_task(_ticks_then_cut(scenario, cutter, handle.task))
                run = await handle.finish(timeout_s=WAIT_S)
                if chaos is not None:
                    await chaos
                assert run.pending_cancels == 0, "run left a cancellation pending on its task"
                _check(scenario, cutter, seen, run.result)
            finally:
                await client.aclose()
            await ep.wait_all_closed(timeout_s=WAIT_S)
            assert ep.open_connections == 0
        left = new_tasks(before)
        assert not left, f"tasks left running: {left}"
    except AssertionError as exc:
        raise AssertionError(
            f"race stress session {scenario.index} failed: {exc}\n  {scenario}\n  replay: "
            f"RACE_SEED={seed} RACE_SESSIONS={scenario.index + 1}"
        ) from exc


def _stress_loop(client: LLMClient, scenario: Scenario, cutter: Cutter, seen: Observed) -> ToolLoop:
    settings: dict[str, Any] = {"max_turns": 8}
    if scenario.compaction:
        settings.update(max_history_messages=5, keep_recent_messages=2)
    if cutter.stalls:
        settings["max_session_s"] = SHORT_SESSION_S
    return make_loop(
        client,
        StressExecutor(scenario, cutter, seen),
        config=loop_config(**settings),
        summarizer=StressSummarizer(scenario, cutter, seen),
    )


@pytest.mark.slow
async def test_race_stress_seeded_batch() -> None:
    """Every session of the seeded batch: no action after a cut, one typed result, no leak."""
    seed, count = race_seed(), race_sessions()
    for index in range(count):
        await run_session(Scenario.draw(seed, index), seed)


# --- scenarios that once broke a promise: each session of a group hits it --------------

#: Batch size of each group.
GROUP_SESSIONS: Final = 6


class LateExecutor:
    """``look`` overruns the wall clock (blocking, or swallowing its cancellation); logs calls.

    ``past`` is set once the deadline has surely passed: after a blocking sleep of three
    wall clocks, or when the wall clock's cancellation arrived.
    """

    def __init__(self, blocking: bool, overrun_s: float) -> None:
        self.blocking, self.overrun_s = blocking, overrun_s
        self.calls: list[tuple[str, bool]] = []
        self.past = False
        self._never = asyncio.Event()

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Log the call; ``look`` overruns the session's wall clock."""
        self.calls.append((call.id, self.past))
        if call.name == "look" and not self.past:
            if self.blocking:
                # A synchronous SDK call: the event loop cannot cut it.
                time.sleep(self.overrun_s)  # noqa: ASYNC251 - blocking on purpose
            else:
                # Misbehaves: swallows the wall clock's cancellation and returns late.
                with contextlib.suppress(asyncio.CancelledError):
                    await self._never.wait()
            self.past = True
        return Success(f"{call.name} ok")


@pytest.mark.slow
async def test_no_call_starts_after_an_executor_overran_the_wall_clock() -> None:
    """A read-only call that overruns the wall clock is followed by no other call."""
    rng = seeded(f"{race_seed()}:wall-clock")
    for index in range(GROUP_SESSIONS):
        names = ["look", *rng.choices(["look", "move"], k=rng.randint(1, 3))]
        executor = LateExecutor(blocking=rng.random() < 0.5, overrun_s=3 * SHORT_SESSION_S)
        reply = calls_reply(*(call(f"w{i}", n, "{}" if n == "look" else '{"x": 1, "y": 2}')
                              for i, n in enumerate(names)))  # fmt: skip
        async with FakeEndpoint([reply, Reply.completion(FINAL_TEXT)]) as ep:
            client = LLMClient(make_config(ep.url, max_retries=0))
            try:
                loop = make_loop(
                    client, executor, config=loop_config(max_session_s=SHORT_SESSION_S)
                )
                run = await start_loop(loop).finish(timeout_s=WAIT_S)
            finally:
                await client.aclose()
        late = [call_id for call_id, after in executor.calls if after]
        context = f"session {index} ({names}, blocking={executor.blocking})"
        assert late == [], f"{context}: calls started after the wall clock: {late}"
        assert len(ep.requests) == 1, f"{context}: a request after the wall clock"
        assert run.result.bound == "wall_clock", context


async def test_a_run_called_before_advance_acts_on_no_later_generation() -> None:
    """``run(...)`` called, then ``advance()`` before it starts: no request, no call."""
    rng = seeded(f"{race_seed()}:pinned")
    for index in range(GROUP_SESSIONS):
        scenario = dataclasses.replace(Scenario.draw(race_seed(), index), cut="none")
        seen = Observed()
        generation = SessionGeneration(SESSION, start=rng.randint(0, 5))
        cutter = Cutter(scenario, CancelToken(), generation)
        async with FakeEndpoint(responder=StressModel(scenario, cutter, seen)) as ep:
            client = LLMClient(make_config(ep.url, max_retries=0))
            try:
                loop = _stress_loop(client, scenario, cutter, seen)
                pending = loop.run(
                    GOAL, generation=generation, on_event=_sink(scenario, cutter, seen)
                )
                generation.advance()
                result = await asyncio.wait_for(pending, WAIT_S)
            finally:
                await client.aclose()
        assert ep.requests == [], f"session {index}: {len(ep.requests)} requests"
        assert seen.calls == [], f"session {index}: executor calls {seen.calls}"
        assert result.outcome is Outcome.SUPERSEDED


async def test_cancelling_the_run_task_still_reports_the_end() -> None:
    """``task.cancel()`` mid-session: CancelledError propagates after one ``finish`` event."""
    for index in range(GROUP_SESSIONS):
        moment: Moment = ("request", "executor")[index % 2]
        scenario = dataclasses.replace(
            Scenario.draw(race_seed(), index), cut="shutdown", moment=moment, at=0
        )
        seen = Observed()
        generation = SessionGeneration(SESSION)
        cutter = Cutter(scenario, CancelToken(), generation)
        async with FakeEndpoint(responder=StressModel(scenario, cutter, seen)) as ep:
            client = LLMClient(make_config(ep.url, max_retries=0))
            try:
                loop = _stress_loop(client, scenario, cutter, seen)
                handle = start_loop(
                    loop, generation=generation, on_event=_sink(scenario, cutter, seen)
                )
                # The moment: the cut only marks it; the task itself is cancelled.
                await asyncio.wait_for(cutter.done.wait(), WAIT_S)
                handle.task.cancel()
                settled = await handle.settle(timeout_s=WAIT_S)
            finally:
                await client.aclose()
        assert isinstance(settled, str), "the cancelled task returned a result"
        finishes = [e for e in seen.events if e.kind == "finish"]
        assert len(finishes) == 1, f"session {index}: {len(finishes)} finish events"
        result = finishes[0].result
        assert result is not None
        assert result.outcome is Outcome.CANCELLED
