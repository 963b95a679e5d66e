"""Each executor call gets its own child token, cancelled with the reason of whatever cuts it.

The token handed to ``ToolExecutor.execute`` is a child of the session's: it is cancelled,
before the cut reaches the executor, with ``tool_timeout`` (the tool's own timeout),
``wall_clock`` (the session's bound), ``superseded`` or the operator's reason. An executor
that polls ``cancel.cancelled`` therefore learns why it is being stopped, and an executor
that cancels its own token stops nothing but itself: the session goes on. An exception an
executor raises is logged with its traceback.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import pytest

from metacrate_grid_agent import (
    CancelToken,
    Outcome,
    SessionGeneration,
    Success,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    SESSION,
    RecordingExecutor,
    Step,
    call,
    calls_reply,
    loop_config,
    make_loop,
    run_loop,
    start_loop,
)

if TYPE_CHECKING:
    from tests.llm_transport.conftest import ClientFactory

SHORT_S = 0.2
"""A tool timeout or session bound, always set against a gate nobody opens."""


async def test_a_tool_timeout_cancels_the_calls_own_token_only(
    client_factory: ClientFactory,
) -> None:
    """A call cut by its tool's timeout sees its token cancelled with ``tool_timeout``.

    Protects: the executor learns the cut and its reason (even while swallowing the
    cancellation), and the session itself is not cancelled: the model hears the failure.
    """
    executor = RecordingExecutor({"l-1": Step(gate=asyncio.Event(), swallow_cancel=True)})
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("ok")]) as ep:
        config = loop_config(tool_timeout_s=SHORT_S)
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))

    assert run.result.outcome is Outcome.COMPLETED
    assert executor.reasons_at_cut == {"l-1": "tool_timeout"}
    assert executor.tokens[0].reason == "tool_timeout"
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "failed")]
    assert len(ep.requests) == 2


async def test_the_wall_clock_cancels_the_calls_token_with_its_reason(
    client_factory: ClientFactory,
) -> None:
    """A call cut by the session's wall-clock bound sees its token cancelled ``wall_clock``.

    Protects: the executor is told that the session ran out of time before the cut
    reaches it.
    """
    executor = RecordingExecutor({"l-1": Step(gate=asyncio.Event())})
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("no")]) as ep:
        config = loop_config(max_session_s=SHORT_S, tool_timeout_s=LONG_STALL_S)
        run = await run_loop(make_loop(client_factory(ep.url), executor, config=config))

    assert (run.result.outcome, run.result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    assert executor.reasons_at_cut == {"l-1": "wall_clock"}
    assert len(ep.requests) == 1


@pytest.mark.parametrize("cut", ["advance", "shutdown", "session_expired"])
async def test_a_session_cut_cancels_the_calls_token_with_the_cuts_reason(
    client_factory: ClientFactory, cut: str
) -> None:
    """Supersession or the operator's cancel reaches the call's token with its reason.

    Protects: the child token follows its parent, so a polling executor stops promptly.
    """
    generation, operator = SessionGeneration(SESSION), CancelToken()
    executor = RecordingExecutor({"l-1": Step(gate=asyncio.Event())})
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("no")]) as ep:
        loop = make_loop(client_factory(ep.url), executor)
        handle = start_loop(loop, generation=generation, cancel=operator)
        await executor.wait_for_call(0)
        if cut == "advance":
            generation.advance()
        else:
            operator.cancel(cut)
        run = await handle.finish()

    reason = "superseded" if cut == "advance" else cut
    assert run.result.cancel_reason == reason
    assert executor.reasons_at_cut == {"l-1": reason}
    assert len(ep.requests) == 1


class SelfCancellingExecutor:
    """Cancels the token it is given, then returns a Success (it gave up on a sub-task)."""

    def __init__(self) -> None:
        self.tokens: list[CancelToken] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Cancel the call's token, then report success anyway."""
        self.tokens.append(cancel)
        cancel.cancel("executor_gave_up")
        return Success(f"{call.name} done")


async def test_an_executor_cancelling_its_token_does_not_cancel_the_session(
    client_factory: ClientFactory,
) -> None:
    """An executor that cancels its own token ends nothing but its own work.

    Protects: an executor cannot cancel the whole session through the token it was
    given; its outcome is what it returns, and the session goes on to its summary.
    """
    executor = SelfCancellingExecutor()
    script = [
        calls_reply(call("l-1", "look")),
        calls_reply(call("l-2", "look")),
        Reply.completion("done"),
    ]
    async with FakeEndpoint(script) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert run.result.outcome is Outcome.COMPLETED
    assert [(c.call_id, c.status) for c in run.result.calls] == [("l-1", "ok"), ("l-2", "ok")]
    assert len(ep.requests) == 3
    assert [t.reason for t in executor.tokens] == ["executor_gave_up"] * 2
    assert executor.tokens[0] is not executor.tokens[1]


async def test_an_executor_exception_is_logged_with_its_traceback(
    client_factory: ClientFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """An executor's exception is logged at WARNING with call id, tool name and traceback.

    Protects: the model hears only ``failed (RuntimeError)`` (no application text), but the
    operator can still find out what went wrong.
    """
    caplog.set_level(logging.WARNING, logger="metacrate_grid_agent.loop")
    executor = RecordingExecutor({"l-1": Step(raises=RuntimeError("grid said no"))})
    async with FakeEndpoint([calls_reply(call("l-1", "look")), Reply.completion("ok")]) as ep:
        run = await run_loop(make_loop(client_factory(ep.url), executor))

    assert run.result.outcome is Outcome.COMPLETED
    assert "failed (RuntimeError)" in run.result.calls[0].observation
    [record] = [r for r in caplog.records if r.exc_info is not None]
    assert (record.name, record.levelno) == ("metacrate_grid_agent.loop", logging.WARNING)
    assert "l-1" in record.getMessage()
    assert "'look'" in record.getMessage()
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    assert "grid said no" in caplog.text
    assert len(ep.requests) == 2
