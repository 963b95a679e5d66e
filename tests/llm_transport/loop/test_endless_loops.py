"""A model that never stops calling tools is stopped by the loop's bounds.

Turns are bounded before every request; calls per turn and per session are bounded before
any call of a turn runs, so a reply over a bound is never partly carried out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Outcome
from metacrate_grid_agent.testing import FakeEndpoint
from tests.llm_transport.loop_support import (
    RecordingExecutor,
    always_calling,
    call,
    calls_reply,
    loop_config,
    make_loop,
    request_ids,
    run_loop,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory


@pytest.mark.parametrize(
    ("name", "arguments", "executed"),
    [("look", "{}", True), ("move", '{"x": 1, "y": 2}', True), ("fly", "{}", False)],
    ids=["read_only", "mutating", "always_invalid"],
)
@pytest.mark.parametrize("max_turns", [1, 3])
async def test_turn_bound_stops_a_model_that_always_calls(
    client_factory: ClientFactory, max_turns: int, name: str, arguments: str, executed: bool
) -> None:
    """A model that always calls a tool gets exactly ``max_turns`` requests, then bound "turns".

    Protects: an endless model costs at most ``max_turns`` requests; invalid calls use up
    turns too, so a model stuck on a bad call is stopped as well.
    """
    executor = RecordingExecutor()
    async with FakeEndpoint(responder=always_calling(name, arguments)) as ep:
        loop = make_loop(client_factory(ep.url), executor, config=loop_config(max_turns=max_turns))
        run = await run_loop(loop)

    result = run.result
    assert (result.outcome, result.bound) == (Outcome.BOUND_REACHED, "turns")
    assert len(ep.requests) == max_turns
    assert [f"agent-1-g0-r1-t{t}" for t in range(1, max_turns + 1)] == request_ids(ep)
    expected_calls = [f"call-{i}" for i in range(max_turns)] if executed else []
    assert expected_calls == executor.call_ids
    assert result.turns == max_turns
    assert len(result.calls) == max_turns


async def test_calls_per_turn_bound_runs_no_call_of_that_turn(
    client_factory: ClientFactory,
) -> None:
    """A reply with more calls than ``max_calls_per_turn`` ends the loop before any of them runs.

    Protects: a reply over the bound is refused whole: not its first calls, then a stop.
    """
    executor = RecordingExecutor()
    turn_1 = calls_reply(call("a-1", "look"), call("a-2", "look"))
    turn_2 = calls_reply(
        call("b-1", "move", '{"x": 1, "y": 1}'),
        call("b-2", "look"),
        call("b-3", "move", '{"x": 2, "y": 2}'),
    )
    async with FakeEndpoint([turn_1, turn_2]) as ep:
        config = loop_config(max_calls_per_turn=2)
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))

    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "calls_per_turn")
    assert executor.call_ids == ["a-1", "a-2"]
    assert len(ep.requests) == 2
    assert [c.call_id for c in run.result.calls] == ["a-1", "a-2"]


async def test_calls_per_turn_bound_on_the_first_reply(client_factory: ClientFactory) -> None:
    """Over the per-turn bound on the very first reply: nothing runs, one request in all.

    Protects: the bound holds before the first action of the session, not only later.
    """
    executor = RecordingExecutor()
    turn = calls_reply(*(call(f"c-{i}", "look") for i in range(4)))
    async with FakeEndpoint([turn]) as ep:
        config = loop_config(max_calls_per_turn=3)
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))

    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "calls_per_turn")
    assert executor.calls == []
    assert run.result.calls == ()
    assert len(ep.requests) == 1


async def test_calls_per_session_bound_runs_no_call_of_the_turn_over_it(
    client_factory: ClientFactory,
) -> None:
    """The turn that would pass ``max_calls_per_session`` runs none of its calls.

    Protects: the session's total of actions is bounded, and the bound is checked for the
    whole turn before any of its calls runs.
    """
    executor = RecordingExecutor()
    script = [
        calls_reply(call("a-1", "look"), call("a-2", "move", '{"x": 1, "y": 1}')),
        calls_reply(call("b-1", "look")),
        calls_reply(call("c-1", "move", '{"x": 2, "y": 2}'), call("c-2", "look")),
    ]
    async with FakeEndpoint(script) as ep:
        config = loop_config(max_calls_per_turn=2, max_calls_per_session=4)
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))

    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "calls_per_session")
    assert executor.call_ids == ["a-1", "a-2", "b-1"]
    assert len(ep.requests) == 3


async def test_rejected_calls_count_toward_the_session_bound(
    client_factory: ClientFactory,
) -> None:
    """Invalid calls count toward ``max_calls_per_session`` just like valid ones.

    Protects: a model spraying invalid calls cannot stretch the session past its bound.
    """
    executor = RecordingExecutor()
    script = [
        calls_reply(call("a-1", "fly"), call("a-2", "fly")),
        calls_reply(call("b-1", "look")),
    ]
    async with FakeEndpoint(script) as ep:
        config = loop_config(max_calls_per_turn=2, max_calls_per_session=2)
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))

    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "calls_per_session")
    assert executor.calls == []
    assert len(ep.requests) == 2
