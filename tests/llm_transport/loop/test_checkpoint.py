"""The checkpoint before each action never skips a cut that is already due.

The driver turns the event loop before every action, so a cut already scheduled reaches the
session's token before the action starts. These tests schedule a cut from inside a read-only
executor that returns at once (no await after scheduling) and check that the mutating call
proposed after it never runs and no further request is sent, whatever way the cut was
scheduled.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import CancelToken, LoopResult, Outcome, SessionGeneration
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    SESSION,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    make_loop,
    start_loop,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.llm_transport.conftest import ClientFactory

MOVE_ARGS = '{"x": 100, "y": 100}'
TURN = calls_reply(call("l-1", "look"), call("m-2", "move", MOVE_ARGS))
WAYS = ("call_soon", "call_later_0", "call_soon_threadsafe")
CUTS = ("advance", "shutdown")


def scheduler(way: str, cut: Callable[[], object]) -> Callable[[], None]:
    """Schedule ``cut`` on the running loop in ``way``, and return without awaiting."""

    def schedule() -> None:
        loop = asyncio.get_running_loop()
        if way == "call_soon":
            loop.call_soon(cut)
        elif way == "call_later_0":
            loop.call_later(0, cut)
        else:
            thread = threading.Thread(target=loop.call_soon_threadsafe, args=(cut,))
            thread.start()
            thread.join()

    return schedule


@pytest.mark.parametrize("cut_kind", CUTS)
@pytest.mark.parametrize("way", WAYS)
async def test_a_cut_scheduled_by_a_returning_executor_stops_the_next_call(
    client_factory: ClientFactory, way: str, cut_kind: str
) -> None:
    """A cut scheduled (call_soon, call_later(0), call_soon_threadsafe) by an executor that
    then returns at once stops the next call: no executor call, no request after it.

    Protects: the checkpoint's turn of the event loop delivers a cut that is already due,
    however it was scheduled, before the next action.
    """
    generation = SessionGeneration(SESSION)
    operator = CancelToken()

    def cut() -> None:
        if cut_kind == "advance":
            generation.advance()
        else:
            operator.cancel("shutdown")

    executor = RecordingExecutor({"l-1": Step(schedule=scheduler(way, cut))})
    async with FakeEndpoint([TURN, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await start_loop(loop, generation=generation, cancel=operator).finish()

    expected = (
        (Outcome.SUPERSEDED, "superseded")
        if cut_kind == "advance"
        else (Outcome.CANCELLED, "shutdown")
    )
    assert (run.result.outcome, run.result.cancel_reason) == expected
    assert executor.call_ids == ["l-1"]
    assert len(ep.requests) == 1
    assert run.pending_cancels == 0


async def test_a_cut_scheduled_before_the_executor_blocks_stops_the_next_call(
    client_factory: ClientFactory,
) -> None:
    """An executor that schedules an advance with call_soon, then blocks the event loop
    (10 ms, no await), still has the next call stopped.

    Protects: a cut queued before code that held the event loop is still delivered by the
    checkpoint's turn.
    """
    generation = SessionGeneration(SESSION)
    executor = RecordingExecutor(
        {"l-1": Step(schedule=scheduler("call_soon", generation.advance), block_s=0.01)}
    )
    async with FakeEndpoint([TURN, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = await start_loop(loop, generation=generation).finish()

    assert (run.result.outcome, run.result.cancel_reason) == (Outcome.SUPERSEDED, "superseded")
    assert executor.call_ids == ["l-1"]
    assert len(ep.requests) == 1


def _chain(task: asyncio.Task[object]) -> list[str]:
    """What a suspended task would resume, outermost first: each coroutine or generator by
    its qualified name, then what the innermost awaits if it has no frame (by its type)."""
    names = []
    link: Any = task.get_coro()
    while link is not None:
        if hasattr(link, "cr_code"):
            names.append(link.cr_code.co_qualname)
            link = link.cr_await
        elif hasattr(link, "gi_code"):
            names.append(link.gi_code.co_qualname)
            link = link.gi_yieldfrom
        else:
            names.append(type(link).__name__)
            link = None
    return names


async def test_a_pass_of_the_checkpoint_resumes_the_session_and_its_steps_only(
    client_factory: ClientFactory,
) -> None:
    """While the checkpoint turns the event loop, the run's task is suspended in two
    coroutines, the session and its loop of steps, at the checkpoint's iterator of passes.

    Protects the checkpoint's cost (no pass may be skipped, so each must stay cheap): every
    pass of the event loop resumes the task's whole chain of coroutines, one frame each, so
    the driver adds no frame per action (the request and the tool call are carried out in
    the loop of steps), none between ``run``'s coroutine and the session, and the turn
    itself has no frame (a tuple's iterator yields its passes).
    """
    chains: list[list[str]] = []
    tasks: list[asyncio.Task[object]] = []

    def look() -> None:
        asyncio.get_running_loop().call_soon(lambda: chains.append(_chain(tasks[0])))

    executor = RecordingExecutor({"l-1": Step(schedule=look)})
    async with FakeEndpoint([TURN, Reply.completion("done")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        run = loop.run("walk", generation=SessionGeneration(SESSION))
        tasks.append(asyncio.create_task(run))
        result = await tasks[0]

    assert isinstance(result, LoopResult)
    assert result.outcome == Outcome.COMPLETED
    assert chains == [["ToolLoop._drive", "ToolLoop._steps", "tuple_iterator"]]
