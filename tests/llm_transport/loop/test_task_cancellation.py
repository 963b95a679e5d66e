"""Cancelling the task that runs ``ToolLoop.run`` still reports how the session ended.

``CancelledError`` propagates (asyncio's contract), but first the ``finish`` event is
emitted with a result whose outcome is ``cancelled`` (reason ``task_cancelled``), a
mutating call in flight is marked ambiguous, and a WARNING record says so. A
``CancelToken`` remains the way to get the result returned instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import LoopEvent, LoopResult, Outcome, SessionGeneration
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    SESSION,
    WAIT_S,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    make_loop,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory


async def test_cancelling_the_task_reports_the_end_then_propagates(
    client_factory: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A task cancelled while a mutating call runs: finish event, ambiguous call, log, raise.

    Protects: every exit of a session is accountable, even the one asyncio forces: the
    application learns the move may have happened, and nothing else starts.
    """
    caplog.set_level(logging.WARNING, logger="metacrate_grid_agent.loop")
    events: list[LoopEvent] = []
    executor = RecordingExecutor({"m-1": Step(gate=asyncio.Event())})
    turn = calls_reply(call("m-1", "move", '{"x": 1, "y": 2}'), call("l-2", "look"))
    async with FakeEndpoint([turn, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        task: asyncio.Task[LoopResult] = asyncio.create_task(
            loop.run("move", generation=SessionGeneration(SESSION), on_event=events.append)
        )
        await executor.wait_for_call(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(WAIT_S):
                await task

    assert task.cancelled()
    assert events[-1].kind == "finish"
    result = events[-1].result
    assert result is not None
    assert (result.outcome, result.cancel_reason) == (Outcome.CANCELLED, "task_cancelled")
    assert result.ambiguous_call is not None
    assert (result.ambiguous_call.call_id, result.ambiguous_call.status) == ("m-1", "ambiguous")
    assert executor.call_ids == ["m-1"]
    assert executor.endings == {"m-1": "cancelled"}
    assert executor.tokens[0].reason == "task_cancelled"
    assert len(ep.requests) == 1
    warnings = [r for r in caplog.records if "cancelled" in r.getMessage()]
    assert warnings
    assert warnings[0].levelno == logging.WARNING
    assert "ambiguous" in warnings[0].getMessage()


async def test_cancelling_the_task_during_a_request_reports_the_end(
    client_factory: ClientFactory,
) -> None:
    """A task cancelled while its request is in flight: finish event, no call, raise.

    Protects: the session's end is reported whatever it was doing, with nothing ambiguous
    when no call had started; the cut request is reported with the attempt it made.
    """
    events: list[LoopEvent] = []
    executor = RecordingExecutor()
    stalled = dataclasses.replace(Reply.completion("late"), stall_before_headers_s=LONG_STALL_S)
    async with FakeEndpoint([stalled]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        task: asyncio.Task[LoopResult] = asyncio.create_task(
            loop.run("look", generation=SessionGeneration(SESSION), on_event=events.append)
        )
        await ep.wait_for_request(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            async with asyncio.timeout(WAIT_S):
                await task

    assert [e.kind for e in events] == ["request", "request_failed", "finish"]
    assert [a.error_kind for a in events[1].attempt_records] == ["cancelled"]
    result = events[-1].result
    assert result is not None
    assert (result.outcome, result.cancel_reason, result.turns) == (
        Outcome.CANCELLED,
        "task_cancelled",
        1,
    )
    assert result.ambiguous_call is None
    assert executor.calls == []
