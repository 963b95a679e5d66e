"""Superseded or cancelled work never acts: every cut, at every await point of a session.

A session is cut either by :meth:`SessionGeneration.advance` (the avatar session was
replaced: outcome ``superseded``) or by the operator's :class:`CancelToken` passed as
``cancel=`` with a reason (``shutdown``, ``operator``, ``disconnect``, ``session_expired``:
outcome ``cancelled`` with that reason). Each cut is made at each await point:

==================  ==========================================================================
``before_run``      the operator token is already cancelled when ``run`` starts
``request_event``   from the ``on_event`` callback of the "request" event (nothing sent yet)
``in_flight``       while the request is in flight (the fake stalls; cut from the test)
``responder``       from the fake's responder, while it builds the reply
``reply_event``     from the ``on_event`` callback of the "reply" event (before the executor)
``tool_call_event`` from the ``on_event`` callback of the "tool_call" event (the executor is next)
``in_executor``     while the executor waits on a gate (cut from the test)
``after_executor``  from inside the executor, which then returns a Success anyway
==================  ==========================================================================

For each: the right outcome and reason, no executor call and no request after the cut
(counted on the executor and on the fake), every connection closed, no task left running,
no cancellation left pending on the caller's task, and a mutating call cut mid-flight
reported as ambiguous.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import (
    CancelToken,
    LoopEvent,
    LoopResult,
    Outcome,
    SessionGeneration,
    Success,
    ToolMessage,
)
from metacrate_grid_agent.testing import FakeEndpoint, RecordedRequest, Reply
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    SESSION,
    FakeSummarizer,
    LoopRun,
    RecordingExecutor,
    Step,
    always_calling,
    call,
    calls_reply,
    loop_config,
    make_loop,
    new_tasks,
    request_ids,
    start_loop,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.llm_transport.conftest import ClientFactory

REASONS = ("shutdown", "operator", "disconnect", "session_expired")
CUTS = ("advance", *REASONS)
POINTS = (
    "before_run",
    "request_event",
    "in_flight",
    "responder",
    "reply_event",
    "tool_call_event",
    "in_executor",
    "after_executor",
)
MOVE_ARGS = '{"x": 100, "y": 100}'
#: The reply of turn 1 in every scenario: one mutating call, then one read-only call.
TURN_1 = calls_reply(call("m-1", "move", MOVE_ARGS), call("l-2", "look"))

#: How many requests the endpoint receives, and how many calls the executor gets, per point.
EXPECTED_COUNTS = {
    "before_run": (0, 0),
    "request_event": (0, 0),
    "in_flight": (1, 0),
    "responder": (1, 0),
    "reply_event": (1, 0),
    "tool_call_event": (1, 0),
    "in_executor": (1, 1),
    "after_executor": (1, 1),
}
#: Points where the mutating call ``m-1`` had started and had not finished when cut.
MID_FLIGHT = frozenset({"in_executor", "after_executor"})


@dataclasses.dataclass
class Scenario:
    """One session under test and the handles to cut it."""

    generation: SessionGeneration
    operator: CancelToken
    cut_kind: str

    def cut(self) -> None:
        """Supersede the session, or cancel it through the operator token."""
        if self.cut_kind == "advance":
            self.generation.advance()
        else:
            self.operator.cancel(self.cut_kind)

    @property
    def expected(self) -> tuple[Outcome, str]:
        """The outcome and cancel reason the cut must produce."""
        if self.cut_kind == "advance":
            return Outcome.SUPERSEDED, "superseded"
        return Outcome.CANCELLED, self.cut_kind


def matrix() -> list[Any]:
    """Every (cut, point) pair; "before_run" needs a token (a generation cannot be stale yet)."""
    return [
        pytest.param(cut, point, id=f"{cut}-{point}")
        for point in POINTS
        for cut in CUTS
        if not (cut == "advance" and point == "before_run")
    ]


def script_for(point: str, scenario: Scenario) -> list[Reply | Callable[[RecordedRequest], Reply]]:
    """The fake's script: turn 1 (stalled or cutting, for some points), then a never-used turn."""
    later = Reply.completion("never sent")
    if point == "in_flight":
        return [dataclasses.replace(TURN_1, stall_before_headers_s=LONG_STALL_S), later]

    if point == "responder":

        def respond(request: RecordedRequest) -> Reply:
            scenario.cut()
            return TURN_1

        return [respond, later]
    return [TURN_1, later]


def assert_cut_cleanly(run: LoopRun, scenario: Scenario) -> None:
    """The outcome and reason are the cut's, and no cancellation is left on the task."""
    outcome, reason = scenario.expected
    assert (run.result.outcome, run.result.cancel_reason) == (outcome, reason)
    assert run.result.generation == 0
    assert run.pending_cancels == 0, "run() left a cancellation request on the caller's task"


@pytest.mark.parametrize(("cut", "point"), matrix())
async def test_cut_at_every_await_point(
    client_factory: ClientFactory, cut: str, point: str
) -> None:
    """Cut at any await point: the right outcome, and nothing acts after the cut.

    Protects the loop's first duty: superseded or cancelled work never starts another
    model request or executor call, leaves no task or connection behind, and a mutating
    call cut mid-flight is reported as ambiguous, never silently dropped.
    """
    scenario = Scenario(SessionGeneration(SESSION), CancelToken(), cut)
    gate = asyncio.Event()
    steps = {}
    if point == "in_executor":
        steps["m-1"] = Step(gate=gate)
    elif point == "after_executor":
        steps["m-1"] = Step(cut=scenario.cut, outcome=Success("arrived"))
    executor = RecordingExecutor(steps)

    def on_event(event: LoopEvent) -> None:
        if (point, event.kind) in {
            ("request_event", "request"),
            ("reply_event", "reply"),
            ("tool_call_event", "tool_call"),
        }:
            scenario.cut()

    async with FakeEndpoint(script_for(point, scenario)) as ep:
        before = asyncio.all_tasks()
        client = client_factory(ep.url)
        if point == "before_run":
            scenario.cut()
        handle = start_loop(
            make_loop(client, executor),
            generation=scenario.generation,
            cancel=scenario.operator,
            on_event=on_event,
        )
        if point == "in_flight":
            await ep.wait_for_request(0)
            scenario.cut()
        elif point == "in_executor":
            await executor.wait_for_call(0)
            scenario.cut()
        settled = await handle.settle()

        requests, calls = EXPECTED_COUNTS[point]
        assert ["m-1"] * calls == executor.call_ids
        assert len(ep.requests) == requests
        assert ["agent-1-g0-r1-t1"] * requests == request_ids(ep)
        assert isinstance(settled, LoopRun), settled
        run = settled
        assert_cut_cleanly(run, scenario)
        if point == "in_flight":
            await ep.wait_all_closed()  # the cut itself closed the connection in flight
            assert [c.closed_by for c in ep.connections] == ["client"]
        await client.aclose()
        await ep.wait_all_closed()
        assert set() == new_tasks(before)

    if point in MID_FLIGHT:
        assert run.result.ambiguous_call is not None
        assert (run.result.ambiguous_call.call_id, run.result.ambiguous_call.status) == (
            "m-1",
            "ambiguous",
        )
    else:
        assert run.result.ambiguous_call is None
        assert all(record.status != "ambiguous" for record in run.result.calls)
    if point == "in_executor":
        assert executor.endings == {"m-1": "cancelled"}
    assert "l-2" not in [record.call_id for record in run.result.calls]


@pytest.mark.parametrize("cut", CUTS)
async def test_read_only_call_cut_in_flight_is_cancelled_not_ambiguous(
    client_factory: ClientFactory, cut: str
) -> None:
    """A read-only call cut while it runs is recorded "cancelled"; nothing is ambiguous.

    Protects: only a mutating call can make a session ambiguous; a look that was cut is
    reported for what it is, and still nothing runs after it.
    """
    scenario = Scenario(SessionGeneration(SESSION), CancelToken(), cut)
    executor = RecordingExecutor({"l-1": Step(gate=asyncio.Event())})
    turn = calls_reply(call("l-1", "look"), call("m-2", "move", MOVE_ARGS))
    async with FakeEndpoint([turn, Reply.completion("never sent")]) as ep:
        handle = start_loop(
            make_loop(client_factory(ep.url), executor),
            generation=scenario.generation,
            cancel=scenario.operator,
        )
        await executor.wait_for_call(0)
        scenario.cut()
        run = await handle.finish()

    assert_cut_cleanly(run, scenario)
    assert run.result.ambiguous_call is None
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "cancelled")]
    assert executor.call_ids == ["l-1"]
    assert executor.endings == {"l-1": "cancelled"}
    assert len(ep.requests) == 1


@pytest.mark.parametrize("cut", CUTS)
async def test_cut_while_summarizing_sends_nothing_more(
    client_factory: ClientFactory, cut: str
) -> None:
    """A cut while the summarizer compacts the history ends the session; that turn is not sent.

    Protects: compaction is an await point like the others: the half-compacted history is
    never sent, no executor call follows, and the summarizer's own token carries the cut's
    reason by the time the cut reaches it.
    """
    scenario = Scenario(SessionGeneration(SESSION), CancelToken(), cut)
    summarizer = FakeSummarizer("stalls")
    executor = RecordingExecutor()
    script = [calls_reply(call("l-1", "look")), calls_reply(call("l-2", "look"))]
    config = loop_config(max_history_messages=4, keep_recent_messages=2)
    async with FakeEndpoint([*script, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor, config=config, summarizer=summarizer)
        handle = start_loop(loop, generation=scenario.generation, cancel=scenario.operator)
        await summarizer.wait_for_span(0)
        scenario.cut()
        run = await handle.finish()

    assert_cut_cleanly(run, scenario)
    assert summarizer.cancelled == 1
    assert summarizer.cut_reasons == [scenario.expected[1]]
    assert len(ep.requests) == 2
    assert ep.pending_replies == 1
    assert executor.call_ids == ["l-1", "l-2"]
    assert run.result.ambiguous_call is None


@pytest.mark.parametrize("cut", CUTS)
async def test_executor_swallowing_cancellation_cannot_act_again(
    client_factory: ClientFactory, cut: str
) -> None:
    """An executor that swallows the cancellation and returns late still starts nothing.

    Protects: a misbehaving executor cannot revive a cut session: its late Success is
    discarded, no other call runs and no request is sent, and the call is ambiguous.
    """
    scenario = Scenario(SessionGeneration(SESSION), CancelToken(), cut)
    late = asyncio.Event()
    executor = RecordingExecutor(
        {"m-1": Step(gate=asyncio.Event(), swallow_cancel=True, late_gate=late)}
    )
    async with FakeEndpoint([TURN_1, Reply.completion("never sent")]) as ep:
        handle = start_loop(
            make_loop(client_factory(ep.url), executor),
            generation=scenario.generation,
            cancel=scenario.operator,
        )
        await executor.wait_for_call(0)
        scenario.cut()
        await asyncio.sleep(0)  # let the executor swallow the cancellation and park again
        assert not handle.task.done()
        late.set()
        run = await handle.finish()

    outcome, reason = scenario.expected
    assert (run.result.outcome, run.result.cancel_reason) == (outcome, reason)
    assert executor.endings == {"m-1": "swallowed"}
    assert executor.call_ids == ["m-1"]
    assert len(ep.requests) == 1
    assert ep.pending_replies == 1
    assert run.result.ambiguous_call is not None
    assert run.result.ambiguous_call.call_id == "m-1"


async def test_swallowed_cancellation_leaves_no_request_on_the_task(
    client_factory: ClientFactory,
) -> None:
    """After a swallowed cut, ``run`` returns with the task's cancel count back at zero.

    Protects: the loop balances every cancellation it delivers to the caller's task, so
    the caller's own ``asyncio.timeout`` and ``TaskGroup`` keep working after ``run``.
    """
    operator = CancelToken()
    executor = RecordingExecutor({"m-1": Step(gate=asyncio.Event(), swallow_cancel=True)})
    async with FakeEndpoint([TURN_1, Reply.completion("never sent")]) as ep:
        handle = start_loop(make_loop(client_factory(ep.url), executor), cancel=operator)
        await executor.wait_for_call(0)
        operator.cancel("shutdown")
        run = await handle.finish()

    assert run.result.outcome is Outcome.CANCELLED
    assert run.pending_cancels == 0


async def test_advance_supersedes_every_run_of_the_generation(
    client_factory: ClientFactory,
) -> None:
    """One ``advance`` supersedes all runs of the older generation; a new run gets the new one.

    Protects: replacing the avatar session stops every session still working for the old
    one, and the next session's requests carry the new generation in their id.
    """
    generation = SessionGeneration(SESSION)
    first = dataclasses.replace(TURN_1, stall_before_headers_s=LONG_STALL_S)
    async with FakeEndpoint([first, first, Reply.completion("fresh")]) as ep:
        client = client_factory(ep.url)
        executors = [RecordingExecutor(), RecordingExecutor(), RecordingExecutor()]
        handles = [
            start_loop(make_loop(client, executors[i]), generation=generation) for i in range(2)
        ]
        await ep.wait_for_request(1)
        assert generation.advance() == 1
        runs = [await handle.finish() for handle in handles]
        fresh = await start_loop(make_loop(client, executors[2]), generation=generation).finish()

    assert [(r.result.outcome, r.result.cancel_reason, r.result.generation) for r in runs] == [
        (Outcome.SUPERSEDED, "superseded", 0)
    ] * 2
    assert [e.calls for e in executors] == [[], [], []]
    assert (fresh.result.outcome, fresh.result.generation) == (Outcome.COMPLETED, 1)
    # Two runs of generation 0 (runs 1 and 2, in either order), then the first of 1.
    ids = request_ids(ep)
    assert sorted(str(i) for i in ids[:2]) == ["agent-1-g0-r1-t1", "agent-1-g0-r2-t1"]
    assert ids[2:] == ["agent-1-g1-r1-t1"]


async def test_advance_after_a_run_ended_changes_nothing(client_factory: ClientFactory) -> None:
    """Advancing after a run returned leaves its result alone and starts nothing.

    Protects: a finished session is not "superseded" after the fact, and advancing does
    not re-run or touch anything of it.
    """
    generation = SessionGeneration(SESSION)
    executor = RecordingExecutor()
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("done")]) as ep:
        run = await start_loop(
            make_loop(client_factory(ep.url), executor), generation=generation
        ).finish()
        generation.advance()

    assert run.result.outcome is Outcome.COMPLETED
    assert executor.call_ids == ["l-1"]
    assert len(ep.requests) == 2


async def test_operator_token_serves_many_sessions(client_factory: ClientFactory) -> None:
    """One long-lived operator token (say, the process's "shutdown") can serve any number of runs.

    Protects: a run does not leave itself registered on the caller's token after it
    returns, so the 1025th session of a long-running agent works like the first, and a
    later cancel of that token reaches only the sessions still running.
    """
    shutdown = CancelToken()
    huge = "s" * 4096  # overflows the history at once: each run ends before any request
    async with FakeEndpoint(responder=always_calling("look")) as ep:
        client = client_factory(ep.url)
        executor = RecordingExecutor()
        small = loop_config(max_history_bytes=1024, max_summary_bytes=256)
        overflowing = make_loop(client, executor, system_prompt=huge, config=small)
        outcomes = set()
        for _ in range(1100):
            run = await overflowing.run(
                "go", generation=SessionGeneration(SESSION), cancel=shutdown
            )
            outcomes.add(run.outcome)
        assert {Outcome.HISTORY_OVERFLOW} == outcomes
        gate = asyncio.Event()
        gated = RecordingExecutor(default=Step(gate=gate))
        handle = start_loop(make_loop(client, gated), cancel=shutdown)
        await gated.wait_for_call(0)
        shutdown.cancel("shutdown")
        last = await handle.finish()

    assert (last.result.outcome, last.result.cancel_reason) == (Outcome.CANCELLED, "shutdown")
    assert len(ep.requests) == 1


async def test_a_run_belongs_to_the_generation_current_when_it_was_called(
    client_factory: ClientFactory,
) -> None:
    """A run created before ``advance`` but first scheduled after it is superseded, unstarted.

    Protects: ``run(...)`` pins the generation when it is called, so a task made for the
    old avatar session never acts on the new one with the old goal: no request, no
    executor call, outcome ``superseded`` for generation 0.
    """
    generation = SessionGeneration(SESSION)
    executor = RecordingExecutor()
    async with FakeEndpoint([TURN_1, Reply.completion("done")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        task: asyncio.Task[LoopResult] = asyncio.create_task(
            loop.run("walk to the fountain", generation=generation)
        )
        assert generation.advance() == 1
        result = await task

    assert (result.outcome, result.cancel_reason, result.generation) == (
        Outcome.SUPERSEDED,
        "superseded",
        0,
    )
    assert (result.turns, result.calls) == (0, ())
    assert ep.requests == []
    assert executor.calls == []


async def test_awaiting_run_directly_still_pins_its_generation(
    client_factory: ClientFactory,
) -> None:
    """``await loop.run(...)`` works as before and runs in the generation current at the call.

    Protects: pinning the generation at the call changes nothing for the common form.
    """
    generation = SessionGeneration(SESSION, start=3)
    async with FakeEndpoint([Reply.completion("done")]) as ep:
        loop = make_loop(client_factory(ep.url), RecordingExecutor())
        result = await loop.run("look around", generation=generation)

    assert (result.outcome, result.generation) == (Outcome.COMPLETED, 3)
    assert request_ids(ep) == ["agent-1-g3-r1-t1"]


BLOCK_S = 1.0
"""How long a blocking executor holds the event loop; the supersession is due long before."""


@pytest.mark.slow
async def test_a_supersession_due_while_an_executor_blocked_stops_the_next_call(
    client_factory: ClientFactory,
) -> None:
    """An ``advance`` that fell due while a read-only executor blocked the event loop stops
    the mutating call proposed after it.

    Protects: before every action the driver lets due callbacks run and the machine checks
    the token, so a supersession is seen even though no await happened since it fell due.
    """
    generation = SessionGeneration(SESSION)

    def advance_soon() -> None:
        asyncio.get_running_loop().call_later(0.05, generation.advance)

    executor = RecordingExecutor({"l-1": Step(schedule=advance_soon, block_s=BLOCK_S)})
    turn = calls_reply(call("l-1", "look"), call("m-2", "move", MOVE_ARGS))
    async with FakeEndpoint([turn, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await start_loop(loop, generation=generation).finish()

    assert (run.result.outcome, run.result.cancel_reason) == (Outcome.SUPERSEDED, "superseded")
    assert executor.call_ids == ["l-1"]
    assert len(ep.requests) == 1
    assert run.result.ambiguous_call is None
    assert run.pending_cancels == 0


@pytest.mark.parametrize("cut_kind", CUTS)
async def test_a_result_returned_after_a_swallowed_cut_is_discarded(
    client_factory: ClientFactory, cut_kind: str
) -> None:
    """An executor that swallows the cut's cancellation and returns a Success anyway: the
    result is discarded, nothing else starts, and the mutating call is reported ambiguous.

    Protects: misbehaving executors cannot make a superseded or cancelled session act.
    """
    scenario = Scenario(SessionGeneration(SESSION), CancelToken(), cut_kind)
    executor = RecordingExecutor({"m-1": Step(gate=asyncio.Event(), swallow_cancel=True)})
    async with FakeEndpoint([TURN_1, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        handle = start_loop(loop, generation=scenario.generation, cancel=scenario.operator)
        await executor.wait_for_call(0)
        scenario.cut()
        run = await handle.finish()

    assert (run.result.outcome, run.result.cancel_reason) == scenario.expected
    assert executor.call_ids == ["m-1"]
    assert executor.endings == {"m-1": "swallowed"}
    assert len(ep.requests) == 1
    assert run.result.ambiguous_call is not None
    assert run.result.ambiguous_call.call_id == "m-1"
    assert not any(isinstance(m, ToolMessage) for m in run.result.messages)
