"""An unclear result of a mutating tool ends the session at once; of a read-only one, it does not.

When a mutating call's effect may or may not have happened (the executor says so, raises,
overruns its timeout or returns something that is not an outcome), nothing else may
happen: no other call of the turn, no further request. The result names the call. A
read-only tool's failure is only a bounded observation, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Ambiguous, Outcome, Tool, ToolLoopConfig
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    LOOK,
    MOVE,
    RecordingExecutor,
    Step,
    bodies,
    call,
    calls_reply,
    loop_config,
    make_loop,
    run_loop,
    tool,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

MOVE_ARGS = '{"x": 10, "y": 20}'
SECRET_DETAIL = "internal grid handle 0xDEADBEEF"
SHORT_S = 0.05
"""A tool timeout, always set against an executor that waits forever."""


@dataclasses.dataclass(frozen=True)
class Trouble:
    """One way an executor call can go wrong, and what the observation then says."""

    step: Callable[[], Step]
    tools: Callable[[], tuple[Tool, Tool]]
    config: Callable[[], ToolLoopConfig]
    observation: str
    """The observation, with ``{name}`` for the tool name."""
    ending: str


def _tools() -> tuple[Tool, Tool]:
    return (LOOK, MOVE)


def _short_tools() -> tuple[Tool, Tool]:
    return (
        dataclasses.replace(LOOK, timeout_s=SHORT_S),
        dataclasses.replace(MOVE, timeout_s=SHORT_S),
    )


TROUBLES = {
    "raises": Trouble(
        step=lambda: Step(raises=RuntimeError(SECRET_DETAIL)),
        tools=_tools,
        config=loop_config,
        observation="tool '{name}' failed (RuntimeError)",
        ending="raised",
    ),
    "config_timeout": Trouble(
        step=lambda: Step(gate=asyncio.Event()),
        tools=_tools,
        config=lambda: loop_config(tool_timeout_s=SHORT_S),
        observation=f"tool '{{name}}' timed out after {SHORT_S} s",
        ending="cancelled",
    ),
    "tool_timeout": Trouble(
        step=lambda: Step(gate=asyncio.Event()),
        tools=_short_tools,
        config=loop_config,
        observation=f"tool '{{name}}' timed out after {SHORT_S} s",
        ending="cancelled",
    ),
    "not_an_outcome": Trouble(
        step=lambda: Step(bogus="done"),
        tools=_tools,
        config=loop_config,
        observation="tool '{name}' returned str, not a ToolOutcome",
        ending="returned",
    ),
}


async def test_ambiguous_outcome_ends_the_session(client_factory: ClientFactory) -> None:
    """An executor's Ambiguous for a mutating call ends the session and names the call.

    Protects: after an action that may or may not have happened, no other call of the turn
    runs and the model is not asked again (it would act on a world it cannot know).
    """
    executor = RecordingExecutor({"m-1": Step(outcome=Ambiguous("the move timed out on the grid"))})
    turn = calls_reply(call("m-1", "move", MOVE_ARGS), call("l-2", "look"))
    async with FakeEndpoint([turn, Reply.completion("never sent")]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    result = run.result
    assert result.outcome is Outcome.AMBIGUOUS_MUTATION
    assert result.ambiguous_call is not None
    ambiguous = result.ambiguous_call
    expected = (1, "m-1", "move", "ambiguous", "the move timed out on the grid")
    assert expected == (
        ambiguous.turn,
        ambiguous.call_id,
        ambiguous.name,
        ambiguous.status,
        ambiguous.observation,
    )
    assert result.calls == (ambiguous,)
    assert executor.call_ids == ["m-1"]
    assert len(ep.requests) == 1
    assert ep.pending_replies == 1


async def test_ambiguous_after_earlier_successes(client_factory: ClientFactory) -> None:
    """Ambiguity in a later turn keeps the earlier calls' records and stops right there.

    Protects: the stop is immediate wherever it happens, and the calls that did run are
    still reported.
    """
    executor = RecordingExecutor({"m-2": Step(outcome=Ambiguous("lost contact"))})
    script = [
        calls_reply(call("l-1", "look")),
        calls_reply(call("m-2", "move", MOVE_ARGS), call("m-3", "move", MOVE_ARGS)),
        Reply.completion("never sent"),
    ]
    async with FakeEndpoint(script) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert run.result.outcome is Outcome.AMBIGUOUS_MUTATION
    assert [(c.call_id, c.status) for c in run.result.calls] == [
        ("l-1", "ok"),
        ("m-2", "ambiguous"),
    ]
    assert run.result.ambiguous_call == run.result.calls[1]
    assert executor.call_ids == ["l-1", "m-2"]
    assert len(ep.requests) == 2
    assert ep.pending_replies == 1


@pytest.mark.parametrize("trouble", list(TROUBLES), ids=list(TROUBLES))
async def test_mutating_tool_trouble_is_ambiguous(
    client_factory: ClientFactory, trouble: str
) -> None:
    """A mutating call that raises, times out or returns a non-outcome is ambiguous.

    Protects: the loop never guesses that a failed action did not happen: the session
    ends, no other call or request follows, and the executor's own error text (which may
    hold internal details) is not passed on.
    """
    case = TROUBLES[trouble]
    executor = RecordingExecutor({"m-1": case.step()})
    turn = calls_reply(call("m-1", "move", MOVE_ARGS), call("l-2", "look"))
    async with FakeEndpoint([turn, Reply.completion("never sent")]) as ep:
        loop = make_loop(client_factory(ep.url), executor, tools=case.tools(), config=case.config())
        run = await run_loop(loop)

    result = run.result
    assert result.outcome is Outcome.AMBIGUOUS_MUTATION
    assert result.ambiguous_call is not None
    assert (result.ambiguous_call.call_id, result.ambiguous_call.status) == ("m-1", "ambiguous")
    assert result.ambiguous_call.observation.startswith(case.observation.format(name="move"))
    assert SECRET_DETAIL not in result.ambiguous_call.observation
    assert executor.call_ids == ["m-1"]
    assert {"m-1": case.ending} == executor.endings
    assert len(ep.requests) == 1
    assert ep.pending_replies == 1


@pytest.mark.parametrize("trouble", list(TROUBLES), ids=list(TROUBLES))
async def test_read_only_tool_trouble_is_a_bounded_failure(
    client_factory: ClientFactory, trouble: str
) -> None:
    """A read-only call that raises, times out or returns a non-outcome is a plain failure.

    Protects: looking cannot have changed the world, so the model is told briefly what
    went wrong (the exception's text is not leaked) and the session goes on.
    """
    case = TROUBLES[trouble]
    executor = RecordingExecutor({"l-1": case.step()})
    script = [
        calls_reply(call("l-1", "look"), call("m-2", "move", MOVE_ARGS)),
        Reply.completion("ok"),
    ]
    async with FakeEndpoint(script) as ep:
        config = case.config()
        loop = make_loop(client_factory(ep.url), executor, tools=case.tools(), config=config)
        run = await run_loop(loop)

    expected = case.observation.format(name="look")
    result = run.result
    assert result.outcome is Outcome.COMPLETED
    assert result.ambiguous_call is None
    assert [("l-1", "failed", expected), ("m-2", "ok")] == [
        (c.call_id, c.status, c.observation) if c.status == "failed" else (c.call_id, c.status)
        for c in result.calls
    ]
    assert len(expected.encode()) <= config.max_observation_bytes
    assert executor.call_ids == ["l-1", "m-2"]
    assert executor.endings["l-1"] == case.ending
    assert len(ep.requests) == 2
    messages = bodies(ep)[1]["messages"]
    assert tool("l-1", expected) == messages[3]
    assert SECRET_DETAIL not in ep.requests[1].body.decode()
