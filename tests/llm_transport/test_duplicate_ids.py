"""A reused tool-call id ends the session before anything of that reply runs.

Within one reply the transport refuses the response; across turns the loop refuses the
turn. Either way the outcome is ``duplicate_call_id``, the executor sees nothing of that
reply, and no further request is sent: a repeated id could make the same action run twice.
"""

from __future__ import annotations

import pytest

from metacrate_grid_agent import Outcome
from metacrate_grid_agent.errors import DuplicateCallIdError
from metacrate_grid_agent.testing import FakeEndpoint
from tests.llm_transport.conftest import ClientFactory
from tests.llm_transport.loop_support import (
    RecordingExecutor,
    call,
    calls_reply,
    make_loop,
    run_loop,
)

MOVE_ARGS = '{"x": 5, "y": 6}'


@pytest.mark.parametrize(
    "calls",
    [
        [call("dup", "move", MOVE_ARGS), call("dup", "move", MOVE_ARGS)],
        [call("dup", "look"), call("other", "look"), call("dup", "move", MOVE_ARGS)],
        [call("dup", "fly"), call("dup", "look")],
    ],
    ids=["same_call_twice", "separated", "invalid_then_valid"],
)
async def test_duplicate_ids_within_one_reply(
    client_factory: ClientFactory, calls: list[tuple[str, str, str]]
) -> None:
    """Two calls sharing an id in one reply: the transport refuses it and nothing runs.

    Protects: a reply that could make one action run twice is never partly executed, is
    not retried (the model is not asked again), and names the offending member.
    """
    executor = RecordingExecutor()
    async with FakeEndpoint([calls_reply(*calls)]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert run.result.outcome is Outcome.DUPLICATE_CALL_ID
    assert isinstance(run.result.error, DuplicateCallIdError)
    assert run.result.error.path == f"$.choices[0].message.tool_calls[{len(calls) - 1}].id"
    assert executor.calls == []
    assert run.result.calls == ()
    assert len(ep.requests) == 1


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            [call("c-1", "look")],
            [call("c-1", "move", MOVE_ARGS)],
        ),
        (
            [call("c-1", "look"), call("c-2", "move", MOVE_ARGS)],
            [call("c-3", "move", MOVE_ARGS), call("c-2", "move", MOVE_ARGS)],
        ),
        (
            [call("c-1", "fly")],
            [call("c-9", "look"), call("c-1", "look")],
        ),
    ],
    ids=["reused_alone", "new_call_before_reuse", "reuse_of_rejected_call"],
)
async def test_duplicate_ids_across_turns(
    client_factory: ClientFactory,
    first: list[tuple[str, str, str]],
    second: list[tuple[str, str, str]],
) -> None:
    """A call id from an earlier turn ends the session; no call of that turn runs.

    Protects: a model replaying an earlier call (even one that was rejected, even after a
    fresh call in the same reply) cannot make any action of that turn happen, and the
    model is not asked again.
    """
    executor = RecordingExecutor()
    async with FakeEndpoint([calls_reply(*first), calls_reply(*second)]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert run.result.outcome is Outcome.DUPLICATE_CALL_ID
    assert isinstance(run.result.error, DuplicateCallIdError)
    reused = next(i for i, c in enumerate(second) if c[0] in {f[0] for f in first})
    assert run.result.error.path == f"$.choices[0].message.tool_calls[{reused}].id"
    assert run.result.error.request_id == "agent-1-g0-r1-t2"
    assert second[reused][0] not in run.result.error.message  # endpoint text is not quoted
    expected_executed = [c[0] for c in first if c[1] != "fly"]
    assert expected_executed == executor.call_ids
    assert [c[0] for c in first] == [record.call_id for record in run.result.calls]
    assert len(ep.requests) == 2
