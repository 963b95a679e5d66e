"""The tool loop's state machine decides from the time and token it is given, before acting.

Pure: no event loop. Time is a number passed in; the token's state is a reason passed in.
"""

from __future__ import annotations

from metacrate_grid_agent import (
    Approved,
    Completion,
    Denied,
    Effect,
    Success,
    Tool,
    ToolCall,
    ToolLoopConfig,
    ToolMessage,
    UserMessage,
)
from metacrate_grid_agent._core._compaction import SUMMARY_PREFIX
from metacrate_grid_agent._core._loop import (
    AskApproval,
    CallModel,
    Finish,
    LoopMachine,
    RunTool,
    Summarize,
)
from metacrate_grid_agent._core._results import Outcome
from metacrate_grid_agent._core._schema import ToolRegistry

CONFIG = ToolLoopConfig(max_session_s=10.0)
TOOLS = (
    Tool("look", "Look around.", {"type": "object"}, Effect.READ_ONLY),
    Tool("move", "Move.", {"type": "object"}, Effect.MUTATING),
)


def machine(config: ToolLoopConfig = CONFIG, *, approval: bool = False) -> LoopMachine:
    """A fresh machine started at t = 100 (``approval``: the loop has an approver)."""
    return LoopMachine(
        config=config,
        registry=ToolRegistry.build(TOOLS, config),
        session_id="s",
        generation=2,
        started_at=100.0,
        history=[UserMessage(content="go")],
        run=3,
        approval=approval,
    )


def reply(*calls: tuple[str, str], text: str | None = None, finish: str = "stop") -> Completion:
    """A completion with ``calls`` as (id, name) pairs."""
    return Completion(
        text=text,
        tool_calls=tuple(ToolCall.create(i, n, "{}") for i, n in calls),
        minted_call_ids=frozenset(),
        usage=None,
        finish_reason=finish,
        request_id="r",
        attempts=1,
        latency_s=0.0,
        attempt_records=(),
    )


def test_request_ids_name_session_generation_run_and_turn() -> None:
    """The first request of run 3 of generation 2 is ``s-g2-r3-t1``."""
    decision = machine().start(100.0)
    assert isinstance(decision, CallModel)
    assert decision.request_id == "s-g2-r3-t1"


def test_check_refuses_a_call_once_the_deadline_passed() -> None:
    """A RunTool held by the driver past the deadline is not started: recorded "not run"."""
    m = machine()
    m.start(100.0)
    decision = m.on_reply(reply(("m-1", "move")), 101.0)
    assert isinstance(decision, RunTool)
    assert m.check(105.0) is None
    finish = m.check(110.0)
    assert isinstance(finish, Finish)
    assert (finish.result.outcome, finish.result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    assert [(c.call_id, c.status) for c in finish.result.calls] == [("m-1", "cancelled")]
    assert finish.result.ambiguous_call is None


def test_check_refuses_an_action_once_the_token_was_cancelled() -> None:
    """A cancellation reason fed to ``check`` ends the session before the request."""
    m = machine()
    m.start(100.0)
    finish = m.check(101.0, "shutdown")
    assert isinstance(finish, Finish)
    assert (finish.result.outcome, finish.result.cancel_reason) == (Outcome.CANCELLED, "shutdown")
    superseded = machine()
    superseded.start(100.0)
    finish = superseded.check(101.0, "superseded", superseded=True)
    assert isinstance(finish, Finish)
    assert finish.result.outcome is Outcome.SUPERSEDED


def test_a_result_after_the_deadline_is_not_appended_and_starts_nothing() -> None:
    """A read-only result arriving late: not in the history; the next call never decided."""
    m = machine()
    m.start(100.0)
    m.on_reply(reply(("l-1", "look"), ("m-2", "move")), 101.0)
    finish = m.on_tool_result(Success("late"), 111.0, 10.0)
    assert isinstance(finish, Finish)
    assert finish.result.bound == "wall_clock"
    assert not any(isinstance(msg, ToolMessage) for msg in finish.result.messages)
    assert [(c.call_id, c.status) for c in finish.result.calls] == [("l-1", "cancelled")]


def test_no_call_is_decided_after_the_deadline() -> None:
    """A reply processed after the deadline starts nothing and is not appended."""
    m = machine()
    m.start(100.0)
    finish = m.on_reply(reply(("l-1", "look")), 110.0)
    assert isinstance(finish, Finish)
    assert finish.result.bound == "wall_clock"
    assert finish.result.calls == ()
    assert len(finish.result.messages) == 1


def test_the_final_finish_reason_decides_the_outcome() -> None:
    """``length`` is truncated, ``content_filter`` content_filtered, ``stop`` completed."""
    for reason, outcome in [
        ("stop", Outcome.COMPLETED),
        ("length", Outcome.TRUNCATED),
        ("content_filter", Outcome.CONTENT_FILTERED),
    ]:
        m = machine()
        m.start(100.0)
        finish = m.on_reply(reply(text="done", finish=reason), 101.0)
        assert isinstance(finish, Finish)
        assert (finish.result.outcome, finish.result.final_text) == (outcome, "done")
        assert finish.result.finish_reason == reason


def test_a_lone_surrogate_summary_is_made_valid() -> None:
    """A summary with a lone surrogate is applied as valid UTF-8 ("?"), never raising."""
    config = ToolLoopConfig(max_history_messages=4, keep_recent_messages=1)
    m = LoopMachine(
        config=config,
        registry=ToolRegistry.build(TOOLS, config),
        session_id="s",
        generation=0,
        started_at=100.0,
        history=[UserMessage(content=text) for text in "abcde"],
    )
    assert isinstance(m.start(100.0), Summarize)
    decision = m.on_summary("x\ud800", 101.0)
    assert isinstance(decision, CallModel)
    assert decision.messages[0] == UserMessage(content=SUMMARY_PREFIX + "x?")


def test_a_mutating_result_after_the_deadline_counts_as_cut_mid_flight() -> None:
    """A mutating call returning after the deadline is ambiguous and not appended.

    The decided rule: a result that comes back after the deadline is treated like a call
    the bound cut mid-flight (what it returned is not trusted, and the caller reconciles
    it the same way as a cut move).
    """
    m = machine()
    m.start(100.0)
    m.on_reply(reply(("m-1", "move"), ("l-2", "look")), 101.0)
    finish = m.on_tool_result(Success("moved"), 120.0, 19.0)
    assert isinstance(finish, Finish)
    assert (finish.result.outcome, finish.result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    assert finish.result.ambiguous_call is not None
    assert finish.result.ambiguous_call.call_id == "m-1"
    assert [(c.call_id, c.status) for c in finish.result.calls] == [("m-1", "ambiguous")]
    assert not any(isinstance(msg, ToolMessage) for msg in finish.result.messages)


def test_a_mutating_call_is_held_for_approval_then_run_after_the_check() -> None:
    """With an approver, a valid mutating call becomes AskApproval; approved, a RunTool.

    The read-only call of the same turn is not asked about, and the RunTool that follows
    an approval still goes through the pre-action check.
    """
    m = machine(approval=True)
    m.start(100.0)
    decision = m.on_reply(reply(("m-1", "move"), ("l-2", "look")), 101.0)
    assert isinstance(decision, AskApproval)
    assert (decision.request.call.id, decision.request.tool.name) == ("m-1", "move")
    assert decision.timeout_s == CONFIG.approval_timeout_s
    assert m.check(101.5) is None
    run = m.on_approval(Approved(), 102.0, 1.0)
    assert isinstance(run, RunTool)
    assert run.call.id == "m-1"
    finish = m.check(110.0, None)
    assert isinstance(finish, Finish)
    assert [(c.call_id, c.status) for c in finish.result.calls] == [("m-1", "cancelled")]
    assert finish.result.ambiguous_call is None


def test_a_denied_call_is_recorded_and_answered_and_the_turn_goes_on() -> None:
    """Denied: recorded "denied", the reason appended as its tool message, next call decided."""
    m = machine(approval=True)
    m.start(100.0)
    m.on_reply(reply(("m-1", "move"), ("l-2", "look")), 101.0)
    decision = m.on_approval(Denied("not now"), 102.0, 1.0)
    assert isinstance(decision, RunTool)
    assert decision.call.id == "l-2"
    denial = "not run: the operator denied this call (not now)"
    assert m.history[-1] == ToolMessage(tool_call_id="m-1", content=denial)
    assert m.records_since(0)[0].status == "denied"


def test_an_answer_after_the_deadline_never_runs_the_call() -> None:
    """An approval that comes after ``max_session_s`` ends the session; the call never ran."""
    m = machine(approval=True)
    m.start(100.0)
    m.on_reply(reply(("m-1", "move")), 101.0)
    finish = m.on_approval(Approved(), 110.0, 9.0)
    assert isinstance(finish, Finish)
    assert (finish.result.outcome, finish.result.bound) == (Outcome.BOUND_REACHED, "wall_clock")
    assert [(c.call_id, c.status) for c in finish.result.calls] == [("m-1", "cancelled")]
    assert finish.result.ambiguous_call is None


def test_a_cut_while_waiting_for_approval_is_never_ambiguous() -> None:
    """Supersession while the question is open: superseded, the call "not run"."""
    m = machine(approval=True)
    m.start(100.0)
    m.on_reply(reply(("m-1", "move")), 101.0)
    finish = m.on_cancelled("superseded", 102.0, superseded=True, tool_in_flight=True)
    assert finish.result.outcome is Outcome.SUPERSEDED
    assert finish.result.ambiguous_call is None
    assert finish.result.calls[0].observation == "not run (superseded)"
