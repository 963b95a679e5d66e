"""A reused tool-call id ends the session before anything of that reply runs (by default).

Within one reply the transport refuses the response; across turns the loop refuses the
turn. Either way the outcome is ``duplicate_call_id``, the executor sees nothing of that
reply, and no further request is sent: a repeated id could make the same action run twice.
With ``reissue_reused_call_ids`` an id reused from an earlier turn gets a new one instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Outcome
from metacrate_grid_agent.errors import DuplicateCallIdError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    RecordingExecutor,
    bodies,
    call,
    calls_reply,
    loop_config,
    make_loop,
    run_loop,
    unpaired_tool_messages,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

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


async def test_reused_ids_are_reissued_when_enabled(client_factory: ClientFactory) -> None:
    """With ``reissue_reused_call_ids``, a server that sends ``call_0`` every turn works.

    Protects: the reused id gets a deterministic, session-unique id that the executor,
    the history sent back and the call record all use (the record keeps the original),
    so the model's conversation stays consistent and no two calls share an id.
    """
    script = [
        calls_reply(call("call_0", "look")),
        calls_reply(call("call_0", "move", MOVE_ARGS)),
        calls_reply(call("call_0", "look")),
        Reply.completion("done"),
    ]
    results = []
    for _ in range(2):
        executor = RecordingExecutor()
        async with FakeEndpoint(list(script)) as ep:
            config = loop_config(reissue_reused_call_ids=True)
            run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))
        results.append((executor.call_ids, bodies(ep)))

    assert run.result.outcome is Outcome.COMPLETED
    ids = executor.call_ids
    assert ids[0] == "call_0"
    assert len(set(ids)) == 3
    assert all(i.startswith("reissued-") for i in ids[1:])
    assert [(r.call_id, r.reissued_from) for r in run.result.calls] == [
        ("call_0", None),
        (ids[1], "call_0"),
        (ids[2], "call_0"),
    ]
    last = bodies(ep)[-1]["messages"]
    assert unpaired_tool_messages(last) == []
    echoed = [c["id"] for m in last if m["role"] == "assistant" for c in m["tool_calls"]]
    answered = [m["tool_call_id"] for m in last if m["role"] == "tool"]
    assert echoed == answered == ids
    assert results[0] == results[1]  # deterministic: the same session, the same ids


async def test_reissue_is_off_by_default_and_duplicates_in_one_reply_stay_errors(
    client_factory: ClientFactory,
) -> None:
    """Reissue is opt-in, and even with it two calls sharing an id in one reply are refused.

    Protects: a reply that could run one action twice is never partly executed.
    """
    assert loop_config().reissue_reused_call_ids is False
    executor = RecordingExecutor()
    reply = calls_reply(call("dup", "look"), call("dup", "move", MOVE_ARGS))
    async with FakeEndpoint([reply]) as ep:
        config = loop_config(reissue_reused_call_ids=True)
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))

    assert run.result.outcome is Outcome.DUPLICATE_CALL_ID
    assert executor.calls == []
    assert len(ep.requests) == 1
