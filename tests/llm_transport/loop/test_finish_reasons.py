"""``completed`` means the model finished its summary: a cut final reply says it was cut.

A final text whose ``finish_reason`` is ``length`` (the server's token cap) ends the
session as ``truncated``, ``content_filter`` as ``content_filtered``; the text is kept in
``final_text``, and ``LoopResult.finish_reason`` carries the last reply's reason. A reply
with tool calls cut by ``length`` is handled as its calls validate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import Outcome
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


@pytest.mark.parametrize(
    ("finish_reason", "outcome"),
    [
        ("stop", Outcome.COMPLETED),
        ("length", Outcome.TRUNCATED),
        ("content_filter", Outcome.CONTENT_FILTERED),
        (None, Outcome.COMPLETED),
    ],
)
async def test_the_final_replys_finish_reason_decides_the_outcome(
    client_factory: ClientFactory, finish_reason: str | None, outcome: Outcome
) -> None:
    """A final text cut at the token cap or by a filter is not reported as completed.

    Protects: an operator (and the CLI's exit code) can tell a finished summary from one
    the server cut off; the text received is kept either way.
    """
    reply = Reply.completion("I walked to the fount", extra_choice={"finish_reason": finish_reason})
    async with FakeEndpoint([calls_reply(call("l-1", "look")), reply]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), RecordingExecutor()))

    assert run.result.outcome is outcome
    assert run.result.final_text == "I walked to the fount"
    assert run.result.finish_reason == finish_reason
    assert len(ep.requests) == 2


async def test_a_reply_cut_mid_call_is_handled_as_its_calls_validate(
    client_factory: ClientFactory,
) -> None:
    """Tool calls cut by ``length``: the cut call is rejected as malformed, the whole one runs.

    Protects: a truncated tool call is never run with half its arguments, and the session
    goes on so the model can try again.
    """
    executor = RecordingExecutor()
    calls = [call("l-1", "look"), call("m-2", "move", '{"x": 1, "y')]
    cut = Reply.completion(None, tool_calls=calls, finish_reason="length")
    async with FakeEndpoint([cut, Reply.completion("done")]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert run.result.outcome is Outcome.COMPLETED
    assert run.result.finish_reason == "stop"
    assert executor.call_ids == ["l-1"]
    assert [(c.call_id, c.status) for c in run.result.calls] == [
        ("l-1", "ok"),
        ("m-2", "rejected"),
    ]
    assert run.result.calls[1].arguments == '{"x": 1, "y'
    assert len(ep.requests) == 2


async def test_an_empty_reply_cut_at_the_cap_is_truncated(client_factory: ClientFactory) -> None:
    """A reply with no text and no calls, cut by ``length``, is ``truncated``, not empty.

    Protects: a model that spent its whole token budget (for example on reasoning the
    library never keeps) is reported as cut, which names the remedy.
    """
    reply = Reply.completion(None, finish_reason="length")
    async with FakeEndpoint([reply]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), RecordingExecutor()))

    assert (run.result.outcome, run.result.final_text) == (Outcome.TRUNCATED, None)
    assert run.result.error is None
    assert len(ep.requests) == 1
