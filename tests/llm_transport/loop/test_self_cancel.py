"""Code running in the session's own task that cancels the operator's token is cut at once.

The executor, the summarizer and the approver run in the task that called ``ToolLoop.run``,
which is bound to the operator's token. When such code cancels that token itself and then
keeps awaiting, the await it is suspended at is cut right away, with the token's reason,
not only when its own timeout (far longer here) fires. Code that cancels the token and
returns at once leaves no cancellation behind to hit a later, unrelated await. Each case
checks the endpoint's own record: nothing is sent after the cut.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final, Literal

import pytest

from metacrate_grid_agent import (
    ApprovalRequest,
    Approved,
    Approver,
    CancelToken,
    Denied,
    LoopResult,
    Message,
    Outcome,
    SessionGeneration,
    Success,
    Summarizer,
    ToolExecutor,
    ToolLoopConfig,
    ToolOutcome,
    ValidatedCall,
)
from metacrate_grid_agent.errors import CancelledByCallerError
from metacrate_grid_agent.testing import FakeEndpoint, Reply
from tests.llm_transport.loop_support import (
    LONG_STALL_S,
    SESSION,
    call,
    calls_reply,
    loop_config,
    make_loop,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tests.llm_transport.conftest import ClientFactory

REASON: Final = "stop"
#: A self-cancelled session must end within this; every await below is far longer.
BOUND_S: Final = 2.0
#: The executor's, summarizer's and approver's own timeouts: far past the stall.
OWN_TIMEOUT_S: Final = 3 * LONG_STALL_S
MOVE_ARGS: Final = '{"x": 10, "y": 20}'
FINAL: Final = Reply.completion("never requested")

Ending = Literal["cut", "returned", "overslept"]


class _Cutter:
    """Cancels the operator's token from inside the session's task, then awaits (or not)."""

    def __init__(
        self,
        operator: CancelToken,
        *,
        then_await: bool,
        supersede: SessionGeneration | None = None,
    ) -> None:
        self.operator = operator
        self.then_await = then_await
        self.supersede = supersede
        self.endings: list[Ending] = []
        self.reasons_at_cut: list[str | None] = []

    async def cut(self, token: CancelToken) -> None:
        """Cancel the operator's token (or supersede the session's generation); then, if
        told, await far longer than any bound."""
        if self.supersede is not None:
            self.supersede.advance()
        else:
            assert self.operator.cancel(REASON) is True
        if not self.then_await:
            self.endings.append("returned")
            return
        try:
            await asyncio.sleep(LONG_STALL_S)
        except asyncio.CancelledError:
            self.endings.append("cut")
            self.reasons_at_cut.append(token.reason)
            raise
        self.endings.append("overslept")


class CuttingExecutor(_Cutter):
    """An executor that cancels the operator's token during its call."""

    def __init__(
        self,
        operator: CancelToken,
        *,
        then_await: bool,
        supersede: SessionGeneration | None = None,
    ) -> None:
        super().__init__(operator, then_await=then_await, supersede=supersede)
        self.calls: list[str] = []

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Record the call, cut, and return a Success if the cut did not stop it."""
        self.calls.append(call.id)
        await self.cut(cancel)
        return Success(f"{call.name} done")


class PlainExecutor(CuttingExecutor):
    """An executor that cuts nothing: returns a Success at once."""

    def __init__(self) -> None:
        super().__init__(CancelToken(), then_await=False)

    async def execute(self, call: ValidatedCall, cancel: CancelToken) -> ToolOutcome:
        """Record the call and return a Success."""
        self.calls.append(call.id)
        return Success(f"{call.name} ok")


class CuttingSummarizer(_Cutter):
    """A summarizer that cancels the operator's token while it summarizes."""

    async def summarize(self, messages: Sequence[Message], cancel: CancelToken) -> str:
        """Cut, and return a summary if the cut did not stop it."""
        await self.cut(self.operator)
        return f"summary of {len(messages)} messages"


class CuttingApprover(_Cutter):
    """An approver that cancels the operator's token while it decides."""

    async def approve(self, request: ApprovalRequest, cancel: CancelToken) -> Approved | Denied:
        """Cut, and approve if the cut did not stop it."""
        await self.cut(cancel)
        return Approved()


async def run_cut(
    client_factory: ClientFactory,
    script: list[Reply],
    operator: CancelToken,
    executor: ToolExecutor,
    config: ToolLoopConfig,
    *,
    summarizer: Summarizer | None = None,
    approver: Approver | None = None,
    generation: SessionGeneration | None = None,
) -> tuple[LoopResult, int, float, FakeEndpoint]:
    """Run a session that cuts itself; return its result, the pending cancels on its task
    after ``run`` returned and a few later awaits, its duration, and the endpoint.

    Fails if ``run`` takes longer than :data:`BOUND_S`, or if a later await of the same
    task (after ``run`` returned) is cancelled.
    """
    loop = asyncio.get_running_loop()
    async with FakeEndpoint(script) as ep:
        tool_loop = make_loop(
            client_factory(ep.url),
            executor,
            config=config,
            summarizer=summarizer,
            approver=approver,
        )
        started = loop.time()

        async def drive() -> tuple[LoopResult, int, float]:
            result = await tool_loop.run(
                "go", generation=generation or SessionGeneration(SESSION), cancel=operator
            )
            took = loop.time() - started
            for _ in range(4):  # later, unrelated awaits of the same task
                await asyncio.sleep(0)
            await asyncio.wait_for(asyncio.sleep(0.01), timeout=BOUND_S)
            task = asyncio.current_task()
            assert task is not None
            return result, task.cancelling(), took

        task = asyncio.create_task(drive())
        done, _ = await asyncio.wait({task}, timeout=BOUND_S + 1.0)
        if not done:
            task.cancel()
            await asyncio.wait({task})
            raise AssertionError(f"the self-cancelled session did not end within {BOUND_S} s")
        assert not task.cancelled(), "a stray cancellation hit an await after run returned"
        result, pending, took = task.result()
    return result, pending, took, ep


@pytest.mark.parametrize(
    ("tool_call", "status", "observation"),
    [
        pytest.param(call("m-1", "move", MOVE_ARGS), "ambiguous", "cut mid-flight", id="mutating"),
        pytest.param(call("l-1", "look"), "cancelled", "cut", id="read-only"),
    ],
)
async def test_an_executor_cancelling_its_session_is_cut_at_once(
    client_factory: ClientFactory, tool_call: tuple[str, str, str], status: str, observation: str
) -> None:
    """An executor that cancels the operator's token and keeps awaiting is cut at once.

    Protects: cancellation cuts whatever the session awaits, with the token's reason, even
    when it was cancelled from inside the session's own task; the call is recorded as the
    loop's rules say for a call cut in flight (a mutating one ambiguous), and no late
    result starts another request.
    """
    operator = CancelToken()
    executor = CuttingExecutor(operator, then_await=True)
    config = loop_config(tool_timeout_s=OWN_TIMEOUT_S)
    result, pending, took, ep = await run_cut(
        client_factory, [calls_reply(tool_call), FINAL], operator, executor, config
    )

    assert took < BOUND_S
    assert (result.outcome, result.cancel_reason) == (Outcome.CANCELLED, REASON)
    assert executor.endings == ["cut"]
    assert executor.reasons_at_cut == [REASON]
    assert executor.calls == [tool_call[0]]
    assert len(ep.requests) == 1
    call_id = tool_call[0]
    assert [(c.call_id, c.status, c.observation) for c in result.calls] == [
        (call_id, status, f"{observation} ({REASON})")
    ]
    if status == "ambiguous":
        assert result.ambiguous_call is not None
        assert result.ambiguous_call.call_id == call_id
    else:
        assert result.ambiguous_call is None
    assert pending == 0


async def test_a_summarizer_cancelling_its_session_is_cut_at_once(
    client_factory: ClientFactory,
) -> None:
    """A summarizer that cancels the operator's token and keeps awaiting is cut at once.

    Protects: compaction is cut like any other await of the session, with the token's
    reason, and the compacted turn is never sent.
    """
    operator = CancelToken()
    summarizer = CuttingSummarizer(operator, then_await=True)
    config = loop_config(
        max_history_messages=6, keep_recent_messages=2, summarizer_timeout_s=OWN_TIMEOUT_S
    )
    script = [*(calls_reply(call(f"c{n}", "look")) for n in range(1, 5)), FINAL]
    result, pending, took, ep = await run_cut(
        client_factory,
        script,
        operator,
        PlainExecutor(),
        config,
        summarizer=summarizer,
    )

    assert took < BOUND_S
    assert (result.outcome, result.cancel_reason) == (Outcome.CANCELLED, REASON)
    assert summarizer.endings == ["cut"]
    assert summarizer.reasons_at_cut == [REASON]
    assert len(ep.requests) == 3
    assert result.compactions == 0
    assert pending == 0


async def test_an_approver_cancelling_its_session_is_cut_at_once(
    client_factory: ClientFactory,
) -> None:
    """An approver that cancels the operator's token and keeps awaiting is cut at once.

    Protects: a call waiting for its approval when the session is cut from inside is
    recorded as never run, the executor is never called, and nothing more is sent.
    """
    operator = CancelToken()
    approver = CuttingApprover(operator, then_await=True)
    executor = PlainExecutor()
    config = loop_config(approval_timeout_s=OWN_TIMEOUT_S)
    result, pending, took, ep = await run_cut(
        client_factory,
        [calls_reply(call("m-1", "move", MOVE_ARGS)), FINAL],
        operator,
        executor,
        config,
        approver=approver,
    )

    assert took < BOUND_S
    assert (result.outcome, result.cancel_reason) == (Outcome.CANCELLED, REASON)
    assert approver.endings == ["cut"]
    assert approver.reasons_at_cut == [REASON]
    assert executor.calls == []
    assert [(c.call_id, c.status) for c in result.calls] == [("m-1", "cancelled")]
    assert result.ambiguous_call is None
    assert len(ep.requests) == 1
    assert pending == 0


@pytest.mark.parametrize("where", ["executor", "summarizer"])
async def test_cancelling_and_returning_at_once_leaves_no_stray_cancel(
    client_factory: ClientFactory, where: str
) -> None:
    """Code that cancels the operator's token and returns without awaiting ends the session
    with that reason, and no cancellation is left to hit a later await of the same task.

    Protects: the caller keeps its task usable after ``run`` returns (no cancellation
    request pending on it, none delivered later), and the late result starts nothing.
    """
    operator = CancelToken()
    config = loop_config(max_history_messages=6, keep_recent_messages=2)
    summarizer: CuttingSummarizer | None = None
    if where == "executor":
        executor: CuttingExecutor = CuttingExecutor(operator, then_await=False)
        script = [calls_reply(call("l-1", "look")), FINAL]
        expected_requests = 1
    else:
        executor = PlainExecutor()
        summarizer = CuttingSummarizer(operator, then_await=False)
        script = [*(calls_reply(call(f"c{n}", "look")) for n in range(1, 5)), FINAL]
        expected_requests = 3
    result, pending, took, ep = await run_cut(
        client_factory, script, operator, executor, config, summarizer=summarizer
    )

    assert took < BOUND_S
    assert (result.outcome, result.cancel_reason) == (Outcome.CANCELLED, REASON)
    assert len(ep.requests) == expected_requests
    assert pending == 0
    if where == "executor":
        assert executor.endings == ["returned"]
        assert [(c.call_id, c.status) for c in result.calls] == [("l-1", "cancelled")]


async def test_an_executor_superseding_its_session_is_cut_at_once(
    client_factory: ClientFactory,
) -> None:
    """An executor that advances its own session's generation and keeps awaiting is cut at
    once, and the session ends superseded.

    Protects: supersession from inside the session's task cuts the await it is suspended
    at, like a cancellation of the operator's token, and a mutating call cut so is
    reported as ambiguous.
    """
    generation = SessionGeneration(SESSION)
    executor = CuttingExecutor(CancelToken(), then_await=True, supersede=generation)
    config = loop_config(tool_timeout_s=OWN_TIMEOUT_S)
    result, pending, took, ep = await run_cut(
        client_factory,
        [calls_reply(call("m-1", "move", MOVE_ARGS)), FINAL],
        CancelToken(),
        executor,
        config,
        generation=generation,
    )

    assert took < BOUND_S
    assert (result.outcome, result.cancel_reason) == (Outcome.SUPERSEDED, "superseded")
    assert executor.endings == ["cut"]
    assert executor.reasons_at_cut == ["superseded"]
    assert len(ep.requests) == 1
    assert result.ambiguous_call is not None
    assert result.ambiguous_call.call_id == "m-1"
    assert pending == 0


async def test_a_token_cancelled_by_its_own_bound_task_cuts_its_next_await() -> None:
    """``CancelToken`` alone: a bound task that cancels its token is cut at the await it is
    suspended at next, with the typed error and reason, and no request is left pending.

    Protects: the guarantee holds for any code bound to a token, not only the tool loop.
    """
    token = CancelToken()
    stalled: list[str] = []

    async def cut_and_stall() -> None:
        with token.bound("work"):
            token.cancel(REASON)
            stalled.append("awaiting")
            await asyncio.sleep(LONG_STALL_S)
            stalled.append("overslept")

    async def body() -> int:
        with pytest.raises(CancelledByCallerError) as info:
            await cut_and_stall()
        assert info.value.reason == REASON
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    pending = await asyncio.wait_for(body(), timeout=BOUND_S)
    assert stalled == ["awaiting"]
    assert pending == 0


async def test_a_token_cancelled_by_its_own_task_leaves_no_cancel_after_its_block() -> None:
    """``CancelToken`` alone: a bound task that cancels its token and leaves the block at
    once is not cancelled at its next, unrelated await.

    Protects: the deferred cut belongs to the bound block; the caller's later awaits run.
    """
    token = CancelToken()

    async def body() -> int:
        with token.bound("work"):
            token.cancel(REASON)
        for _ in range(4):
            await asyncio.sleep(0)
        task = asyncio.current_task()
        assert task is not None
        return task.cancelling()

    task = asyncio.create_task(body())
    await asyncio.wait({task}, timeout=BOUND_S)
    assert task.done()
    assert not task.cancelled(), "a cut left behind hit an await after the bound block"
    assert task.result() == 0
    assert token.reason == REASON
