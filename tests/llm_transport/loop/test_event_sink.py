"""An event sink's failure never costs the session its result.

``on_event`` is application code for display and logs. If it raises, the exception is
logged with its traceback and ignored: the session goes on, its actions are recorded, and
``run`` returns its ``LoopResult``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import CancelToken, LoopEvent, Outcome
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    RecordingExecutor,
    call,
    calls_reply,
    make_loop,
    run_loop,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

KINDS = ("request", "reply", "tool_call", "tool_result", "finish")


@pytest.mark.parametrize("failing_kind", [*KINDS, "every"])
async def test_a_failing_event_sink_is_logged_and_ignored(
    client_factory: ClientFactory, caplog: pytest.LogCaptureFixture, failing_kind: str
) -> None:
    """A sink that raises on an event (or on every one): the session completes all the same.

    Protects: the result of a session in which a mutating call ran is never lost to a
    display bug; the failure is logged at WARNING with its traceback.
    """
    caplog.set_level(logging.WARNING, logger="metacrate_grid_agent.loop")

    def sink(event: LoopEvent) -> None:
        if failing_kind in {"every", event.kind}:
            raise RuntimeError(f"display broke on {event.kind}")

    executor = RecordingExecutor()
    turn = calls_reply(call("m-1", "move", '{"x": 1, "y": 2}'))
    async with FakeEndpoint([turn, Reply.completion("moved")]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor), on_event=sink)

    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.final_text == "moved"
    assert executor.call_ids == ["m-1"]
    assert len(ep.requests) == 2
    assert run.event_kinds == [*KINDS[:4], "request", "reply", "finish"]
    failed = [r for r in caplog.records if r.exc_info is not None]
    expected = len(run.events) if failing_kind == "every" else run.event_kinds.count(failing_kind)
    assert len(failed) == expected
    assert all(r.levelno == logging.WARNING for r in failed)
    assert all(isinstance(r.exc_info[1], RuntimeError) for r in failed if r.exc_info)


async def test_a_call_cut_before_it_started_is_reported_to_the_sink(
    client_factory: ClientFactory,
) -> None:
    """A sink that cancels the session on "tool_call": the call never runs, and the sink is
    told so with a "tool_result" event for its "not run" record before "finish".

    Protects: every call record of the session reaches the event sink, whichever check
    stopped the call.
    """
    operator = CancelToken()

    def sink(event: LoopEvent) -> None:
        if event.kind == "tool_call":
            operator.cancel("shutdown")

    executor = RecordingExecutor()
    turn = calls_reply(call("m-1", "move", '{"x": 1, "y": 2}'))
    async with FakeEndpoint([turn, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await run_loop(loop, cancel=operator, on_event=sink)

    assert (run.result.outcome, run.result.cancel_reason) == (Outcome.CANCELLED, "shutdown")
    assert executor.calls == []
    assert run.event_kinds == ["request", "reply", "tool_call", "tool_result", "finish"]
    record = run.events[3].record
    assert record is not None
    assert (record.call_id, record.status) == ("m-1", "cancelled")
    assert len(ep.requests) == 1
