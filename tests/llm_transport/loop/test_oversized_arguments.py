"""A tool call whose arguments exceed ``max_argument_bytes`` is rejected, not fatal.

The decoder keeps the call's id, name and size and drops its arguments (an
``OversizedToolCall`` carrying ``"{}"``); the loop answers it with the usual bounded
rejection observation, runs the reply's other valid calls, and echoes the call back with
``"{}"`` as its arguments so the history stays a valid conversation. Only a body over
``max_response_bytes`` stays an error for the whole reply.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from metacrate_grid_agent import Outcome, OversizedToolCall, UserMessage
from metacrate_grid_agent.errors import ResponseError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    GOAL,
    SYSTEM,
    RecordingExecutor,
    assistant,
    bodies,
    call,
    calls_reply,
    make_loop,
    run_loop,
    system,
    tool,
    unpaired_tool_messages,
    user,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

LIMIT = 64
"""The client's ``max_argument_bytes`` in these tests."""
BIG_TEXT = json.dumps({"radius": 5, "note": "x" * 200})
MOVE_ARGS = '{"x": 3, "y": 4}'


def big_call(kind: str) -> dict[str, Any] | tuple[str, str, str]:
    """The oversized ``look`` call, with its arguments as a JSON string or a raw object."""
    if kind == "string":
        return call("l-1", "look", BIG_TEXT)
    function = {"name": "look", "arguments": json.loads(BIG_TEXT)}
    return {"id": "l-1", "type": "function", "function": function}


@pytest.mark.parametrize("kind", ["string", "object"])
async def test_an_oversized_call_is_rejected_and_the_reply_goes_on(
    client_factory: ClientFactory, kind: str
) -> None:
    """The oversized call never runs, the model is told why, and the valid call still runs.

    Protects: one oversized argument no longer ends the session as a transport error;
    the rejection is bounded, the history sent back pairs every call with its answer, and
    the call record keeps no arguments (they were never read).
    """
    executor = RecordingExecutor()
    reply = calls_reply(big_call(kind), call("m-2", "move", MOVE_ARGS))
    async with FakeEndpoint([reply, Reply.completion("done")]) as ep:
        client = client_factory(ep.url, max_argument_bytes=LIMIT)
        run = await run_loop(make_loop(client, executor))

    assert run.result.outcome is Outcome.COMPLETED
    assert executor.call_ids == ["m-2"]
    [rejected, moved] = run.result.calls
    assert (rejected.call_id, rejected.name, rejected.status, rejected.arguments) == (
        "l-1",
        "look",
        "rejected",
        "",
    )
    compact = json.dumps(json.loads(BIG_TEXT), separators=(",", ":"))
    size = len((BIG_TEXT if kind == "string" else compact).encode())
    assert f"were {size} bytes" in rejected.observation
    assert (moved.status, moved.arguments) == ("ok", MOVE_ARGS)
    second = bodies(ep)[1]["messages"]
    assert second == [
        system(SYSTEM),
        user(GOAL),
        assistant(("l-1", "look", "{}"), ("m-2", "move", MOVE_ARGS)),
        tool("l-1", rejected.observation),
        tool("m-2", moved.observation),
    ]
    assert unpaired_tool_messages(second) == []


async def test_the_client_returns_an_oversized_call_as_such(client_factory: ClientFactory) -> None:
    """``LLMClient.complete`` returns the call as an ``OversizedToolCall`` with its size.

    Protects: a direct client user can tell a dropped call from a call with ``{}``.
    """
    async with FakeEndpoint([calls_reply(call("l-1", "look", BIG_TEXT))]) as ep:
        client = client_factory(ep.url, max_argument_bytes=LIMIT)
        completion = await client.complete([UserMessage(content="hi")])

    [dropped] = completion.tool_calls
    assert isinstance(dropped, OversizedToolCall)
    assert (dropped.id, dropped.name, dropped.arguments) == ("l-1", "look", "{}")
    assert dropped.argument_bytes == len(BIG_TEXT.encode())


async def test_a_body_over_max_response_bytes_still_ends_the_session(
    client_factory: ClientFactory,
) -> None:
    """A reply body over ``max_response_bytes`` is a transport error for the whole reply.

    Protects: the per-call rejection does not soften the bound on the reply itself.
    """
    executor = RecordingExecutor()
    reply = calls_reply(call("l-1", "look", json.dumps({"note": "y" * 4096})))
    async with FakeEndpoint([reply]) as ep:
        client = client_factory(ep.url, max_response_bytes=1024, max_retries=0)
        run = await run_loop(make_loop(client, executor))

    assert run.result.outcome is Outcome.TRANSPORT_ERROR
    assert isinstance(run.result.error, ResponseError)
    assert executor.calls == []
    assert len(ep.requests) == 1
