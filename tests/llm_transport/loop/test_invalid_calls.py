"""Invalid tool calls never reach the executor; the model is told why, briefly.

An unknown name, arguments that are not JSON, arguments that are not an object and
arguments that break the schema are each answered by a bounded tool message with the
call's own id, while valid calls of the same turn still run. Executor observations are
bounded too, and cut with an explicit marker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Outcome, Success
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    RecordingExecutor,
    Step,
    bodies,
    call,
    calls_reply,
    default_observation,
    loop_config,
    make_loop,
    run_loop,
    tool,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

DONE = Reply.completion("done")

#: (case id, call name, raw arguments, text the observation must contain)
INVALID_CALLS = [
    ("unknown_name", "fly", "{}", "unknown tool 'fly'; the available tools are: look, move"),
    ("malformed_json", "move", '{"x": 1,', "the arguments for move are not valid JSON"),
    ("truncated_string", "look", '{"radius": "', "the arguments for look are not valid JSON"),
    ("array", "move", "[1, 2]", "must be a JSON object ({...}), got an array"),
    ("string", "move", '"north"', "must be a JSON object ({...}), got a string"),
    ("number", "look", "42", "must be a JSON object ({...}), got a number"),
    ("null", "look", "null", "must be a JSON object ({...}), got null"),
    ("missing_required", "move", '{"x": 1}', "- at (root): "),
    ("wrong_types", "move", '{"x": "far", "y": 300}', "- at /x: "),
]


def observation_of(ep: FakeEndpoint, call_id: str) -> str:
    """The content of the tool message for ``call_id`` in the second request."""
    found = [m for m in bodies(ep)[1]["messages"] if m.get("tool_call_id") == call_id]
    assert len(found) == 1, f"{len(found)} tool messages for {call_id}"
    content = found[0]["content"]
    assert isinstance(content, str)
    return content


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [case[1:] for case in INVALID_CALLS],
    ids=[case[0] for case in INVALID_CALLS],
)
async def test_invalid_call_is_answered_and_never_executed(
    client_factory: ClientFactory, name: str, arguments: str, expected: str
) -> None:
    """An invalid call becomes a tool message with its id saying what was wrong; never an action.

    Protects: nothing unvalidated reaches the executor; the model gets a reason it can act
    on; the session goes on (the next request is sent and the model can answer).
    """
    executor = RecordingExecutor()
    script = [calls_reply(call("bad-1", name, arguments)), DONE]
    async with FakeEndpoint(script) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert executor.calls == []
    assert len(ep.requests) == 2
    observation = observation_of(ep, "bad-1")
    assert expected in observation
    assert run.result.outcome is Outcome.COMPLETED
    assert [(1, "bad-1", name, "rejected", observation)] == [
        (c.turn, c.call_id, c.name, c.status, c.observation) for c in run.result.calls
    ]


async def test_schema_mismatch_names_the_json_paths(client_factory: ClientFactory) -> None:
    """A schema mismatch lists the JSON paths of the first errors, and counts the rest.

    Protects: the model learns which argument was wrong (``/x``, ``/y``), in a bounded
    message (at most three errors spelled out).
    """
    executor = RecordingExecutor()
    bad = '{"x": "far", "y": 300, "run": "yes", "z": 1, "w": 2}'
    async with FakeEndpoint([calls_reply(call("bad-1", "move", bad)), DONE]) as ep:
        await run_loop(make_loop(client_factory(ep.url), executor))

    observation = observation_of(ep, "bad-1")
    lines = observation.split("\n")
    assert lines[0] == "the arguments for move do not match its parameters schema:"
    spelled = [line for line in lines[1:] if line.startswith("- at ")]
    assert len(spelled) == 3
    assert lines[-1].startswith("- and ")
    assert lines[-1].endswith(" more errors") or lines[-1].endswith(" more error")
    paths = {line.split(":")[0].removeprefix("- at ") for line in spelled}
    assert paths <= {"/x", "/y", "/run", "(root)"}
    assert executor.calls == []


async def test_valid_call_in_the_same_turn_still_runs(client_factory: ClientFactory) -> None:
    """Invalid calls around a valid one are answered; the valid one runs, in order.

    Protects: one bad call does not poison its turn, every call gets exactly one tool
    message, in the order the model made them, and only the valid one is executed.
    """
    executor = RecordingExecutor()
    turn = calls_reply(
        call("bad-1", "teleport", "{}"),
        call("ok-2", "move", '{"x": 3, "y": 4}'),
        call("bad-3", "look", "[]"),
    )
    async with FakeEndpoint([turn, DONE]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert [(c.id, dict(c.arguments)) for c in executor.calls] == [("ok-2", {"x": 3, "y": 4})]
    messages = bodies(ep)[1]["messages"]
    assert [m["tool_call_id"] for m in messages[3:]] == ["bad-1", "ok-2", "bad-3"]
    assert tool("ok-2", default_observation(executor.calls[0])) == messages[4]
    expected = [("bad-1", "rejected"), ("ok-2", "ok"), ("bad-3", "rejected")]
    assert expected == [(c.call_id, c.status) for c in run.result.calls]
    assert run.result.outcome is Outcome.COMPLETED


@pytest.mark.parametrize(
    ("name", "arguments"),
    [case[1:3] for case in INVALID_CALLS],
    ids=[case[0] for case in INVALID_CALLS],
)
async def test_rejection_observation_is_bounded(
    client_factory: ClientFactory, name: str, arguments: str
) -> None:
    """With the smallest ``max_observation_bytes``, every rejection fits it, marked if cut.

    Protects: nothing the model writes (a long tool name, a long bad value) can make the
    observation sent back grow past its bound.
    """
    executor = RecordingExecutor()
    long_name = name if name != "fly" else "fly_" + "x" * 60
    script = [calls_reply(call("bad-1", long_name, arguments)), DONE]
    async with FakeEndpoint(script) as ep:
        run = await run_loop(
            make_loop(
                client_factory(ep.url), executor, config=loop_config(max_observation_bytes=64)
            )
        )

    observation = observation_of(ep, "bad-1")
    assert len(observation.encode("utf-8")) <= 64
    assert observation.endswith("[truncated]")
    assert observation == run.result.calls[0].observation
    assert executor.calls == []


@pytest.mark.parametrize(
    "text",
    ["A" * 10_000, "é" * 5_000, "水" * 4_000 + "tail"],
    ids=["ascii", "two_byte", "three_byte"],
)
async def test_oversized_executor_observation_is_cut_with_marker(
    client_factory: ClientFactory, text: str
) -> None:
    """An executor observation over ``max_observation_bytes`` is cut, ending with the marker.

    Protects: an executor that reports a whole region cannot blow up the history; the cut
    falls on a character boundary and says it is a cut.
    """
    executor = RecordingExecutor({"c-1": Step(outcome=Success(text))})
    async with FakeEndpoint([calls_reply(call("c-1", "look", "{}")), DONE]) as ep:
        run = await run_loop(
            make_loop(
                client_factory(ep.url), executor, config=loop_config(max_observation_bytes=256)
            )
        )

    observation = observation_of(ep, "c-1")
    size = len(observation.encode("utf-8"))
    assert 256 - 4 < size <= 256
    assert observation.endswith(" … [truncated]")
    kept = observation.removesuffix(" … [truncated]")
    assert text.startswith(kept)
    assert run.result.calls[0].observation == observation
    assert run.result.calls[0].status == "ok"
