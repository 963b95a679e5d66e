"""The session's wall-clock bound (``max_session_s``) cuts whatever is in progress.

A short bound is set against a much longer stall, in the model request, the executor or
the summarizer. The session ends as ``bound_reached`` / ``wall_clock`` soon after the bound,
nothing starts after it, and a mutating call cut by it is reported as ambiguous.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Outcome, ToolMessage
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    FakeSummarizer,
    LoopRun,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    loop_config,
    make_loop,
    new_tasks,
    run_loop,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

SESSION_S = 0.25
"""The wall-clock bound, always set against stalls of ``LONG_STALL_S`` (or forever)."""
PROMPT_S = 3.0
"""Well above ``SESSION_S`` and far below ``LONG_STALL_S``: "soon after the bound"."""


def assert_wall_clock(run: LoopRun, elapsed: float) -> None:
    """The session ended on its wall-clock bound, soon after it, with nothing left pending."""
    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    assert SESSION_S <= run.result.latency_s < PROMPT_S
    assert SESSION_S <= elapsed < PROMPT_S
    assert run.pending_cancels == 0


async def test_wall_clock_cuts_a_stalled_request(client_factory: ClientFactory) -> None:
    """A model request stalled past ``max_session_s`` is cut, and its connection closed.

    Protects: a silent endpoint cannot hold a session past its bound (even though the
    transport's own timeouts are far longer), and the cut leaves no connection or task.
    """
    executor = RecordingExecutor()
    stalled = dataclasses.replace(Reply.completion("too late"), stall_before_headers_s=LONG_STALL_S)
    async with FakeEndpoint([stalled]) as ep:
        before = asyncio.all_tasks()
        client = client_factory(ep.url)
        config = loop_config(max_session_s=SESSION_S)
        started = asyncio.get_running_loop().time()
        run = await run_loop(make_loop(client, executor, config=config))
        elapsed = asyncio.get_running_loop().time() - started
        await ep.wait_all_closed()
        assert [c.closed_by for c in ep.connections] == ["client"]
        await client.aclose()
        assert set() == new_tasks(before)

    assert_wall_clock(run, elapsed)
    assert len(ep.requests) == 1
    assert executor.calls == []
    assert run.result.ambiguous_call is None


async def test_wall_clock_cuts_a_stalled_mutating_call(client_factory: ClientFactory) -> None:
    """A mutating call still running at the bound is cut and reported as ambiguous.

    Protects: the bound holds inside the executor too (its own timeout is longer), the
    executor is told to stop, and the caller learns the move may have happened.
    """
    executor = RecordingExecutor({"m-1": Step(gate=asyncio.Event())})
    turn = calls_reply(call("m-1", "move", '{"x": 1, "y": 1}'), call("l-2", "look"))
    async with FakeEndpoint([turn, Reply.completion("never sent")]) as ep:
        config = loop_config(max_session_s=SESSION_S, tool_timeout_s=LONG_STALL_S)
        started = asyncio.get_running_loop().time()
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))
        elapsed = asyncio.get_running_loop().time() - started

    assert_wall_clock(run, elapsed)
    assert run.result.ambiguous_call is not None
    assert (run.result.ambiguous_call.call_id, run.result.ambiguous_call.status) == (
        "m-1",
        "ambiguous",
    )
    assert executor.call_ids == ["m-1"]
    assert executor.endings == {"m-1": "cancelled"}
    assert len(ep.requests) == 1


async def test_wall_clock_cuts_a_stalled_read_only_call(client_factory: ClientFactory) -> None:
    """A read-only call still running at the bound is cut and recorded "cancelled".

    Protects: the bound stops a stuck look as well, without calling it ambiguous.
    """
    executor = RecordingExecutor({"l-1": Step(gate=asyncio.Event())})
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("no")]) as ep:
        config = loop_config(max_session_s=SESSION_S, tool_timeout_s=LONG_STALL_S)
        started = asyncio.get_running_loop().time()
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))
        elapsed = asyncio.get_running_loop().time() - started

    assert_wall_clock(run, elapsed)
    assert run.result.ambiguous_call is None
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "cancelled")]
    assert len(ep.requests) == 1


async def test_wall_clock_cuts_a_stalled_summarizer(client_factory: ClientFactory) -> None:
    """A summarizer still running at the bound is cut; the turn's request is never sent.

    Protects: compaction cannot hold a session past its bound either (its own timeout is
    longer), the history it was compacting is not sent, and the summarizer's own token says
    ``wall_clock`` by the time the cut reaches it.
    """
    summarizer = FakeSummarizer("stalls")
    script = [calls_reply(call(f"c{n}", "look")) for n in (1, 2)]
    config = loop_config(
        max_session_s=SESSION_S,
        max_history_messages=4,
        keep_recent_messages=2,
        summarizer_timeout_s=60.0,
    )
    async with FakeEndpoint([*script, Reply.completion("never sent")]) as ep:
        loop = make_loop(
            client_factory(ep.url), RecordingExecutor(), config=config, summarizer=summarizer
        )
        started = asyncio.get_running_loop().time()
        run = await run_loop(loop)
        elapsed = asyncio.get_running_loop().time() - started

    assert_wall_clock(run, elapsed)
    assert len(summarizer.spans) == 1
    assert summarizer.cancelled == 1
    assert summarizer.cut_reasons == ["wall_clock"]
    assert len(ep.requests) == 2
    assert ep.pending_replies == 1


BLOCK_S = 1.0
"""How long a blocking executor holds the event loop: four times ``SESSION_S``."""
LOOK_THEN_MOVE = calls_reply(call("l-1", "look"), call("m-2", "move", '{"x": 1, "y": 1}'))


def observations(run: LoopRun) -> list[str]:
    """The ids answered by a tool message in the session's final history."""
    return [m.tool_call_id for m in run.result.messages if isinstance(m, ToolMessage)]


@pytest.mark.slow
async def test_no_call_starts_after_a_blocking_executor_overran_the_bound(
    client_factory: ClientFactory,
) -> None:
    """An executor that blocks the event loop past the bound: its result is dropped, and
    the mutating call proposed after it never starts.

    Protects: the deadline is checked by the machine before every action, not only as a
    timeout around awaits (which cannot fire while a synchronous call holds the loop), and
    a result arriving after the deadline is never appended.
    """
    executor = RecordingExecutor({"l-1": Step(block_s=BLOCK_S)})
    async with FakeEndpoint([LOOK_THEN_MOVE, Reply.completion("never sent")]) as ep:
        config = loop_config(max_session_s=SESSION_S, tool_timeout_s=LONG_STALL_S)
        started = asyncio.get_running_loop().time()
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))
        elapsed = asyncio.get_running_loop().time() - started

    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    assert BLOCK_S <= elapsed < BLOCK_S + PROMPT_S
    assert executor.call_ids == ["l-1"]
    assert len(ep.requests) == 1
    assert observations(run) == []
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "cancelled")]
    assert run.result.ambiguous_call is None
    assert run.pending_cancels == 0


async def test_no_call_starts_after_an_executor_swallowed_the_wall_clock_cut(
    client_factory: ClientFactory,
) -> None:
    """An executor that swallows the bound's cancellation and returns anyway: its late
    result is dropped, and the mutating call after it never starts (so the loop causes no
    ambiguous mutation of its own).

    Protects: a late result is discarded by the machine whatever the executor does with
    its cancellation, and nothing starts after the deadline.
    """
    gate = asyncio.Event()
    executor = RecordingExecutor({"l-1": Step(gate=gate, swallow_cancel=True)})
    async with FakeEndpoint([LOOK_THEN_MOVE, Reply.completion("never sent")]) as ep:
        config = loop_config(max_session_s=SESSION_S, tool_timeout_s=LONG_STALL_S)
        started = asyncio.get_running_loop().time()
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))
        elapsed = asyncio.get_running_loop().time() - started

    assert_wall_clock(run, elapsed)
    assert executor.call_ids == ["l-1"]
    assert executor.endings == {"l-1": "swallowed"}
    assert len(ep.requests) == 1
    assert observations(run) == []
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "cancelled")]
    assert run.result.ambiguous_call is None
